// close_in_background: closing a descriptor whose close may block, off the caller's path.
//
// Closing an inotify instance waits for a kernel grace period (the kernel flushes its pending
// destruction of watches, system-wide, before it frees the instance): 8-16 ms on a busy
// machine. A waiter gives its instance back as soon as it leaves the queue, since a user has
// only fs.inotify.max_user_instances of them (128 by default) for all their programs, but must
// not make the request it serves wait for that.
#pragma once

#include "util/fd.h"

namespace gpulock {

// Closes `fd` in a short-lived thread of its own that takes no signal (util/signals_blocked.h).
// It closes here instead where no thread can be started, where kMaxBackgroundCloses are already
// under way, and in a process forked while such a thread ran. A child forked while a close is
// pending closes its copy of the descriptor at once: it does not own it.
// `unlist_elsewhere`, if given, takes `fd` out of another table that a forked child acts on
// (local/fork_guard.h); it runs behind the same ForkGate hold that lists the descriptor here, so
// no fork sees it in neither table, and before any close.
void close_in_background(UniqueFd fd, void (*unlist_elsewhere)(int fd) = nullptr);

inline constexpr int kMaxBackgroundCloses = 64;

// How many descriptors wait for their closer now.
int background_closes_pending();

// For tests: while one of these lives, the closer threads wait before they close, so a test can
// fork, or fill every slot, while descriptors are still pending.
class BackgroundClosesPausedForTest {
 public:
  BackgroundClosesPausedForTest();
  ~BackgroundClosesPausedForTest();
  BackgroundClosesPausedForTest(const BackgroundClosesPausedForTest&) = delete;
  BackgroundClosesPausedForTest& operator=(const BackgroundClosesPausedForTest&) = delete;
};

}  // namespace gpulock
