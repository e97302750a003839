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

// Closes `fd` in a short-lived thread of its own that takes no signal (util/signals_blocked.h),
// or here where no thread can be started, and in a process forked while such a thread ran.
void close_in_background(UniqueFd fd);

}  // namespace gpulock
