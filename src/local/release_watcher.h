// ReleaseWatcher: wakes a waiter the moment any GPU lock in the directory is released.
//
// When the last descriptor of a lock's open file description goes away (a lease ends, however
// its holder died), the kernel emits an inotify IN_CLOSE_WRITE event for that file. Watching the
// directory for those events lets waiters sleep without polling. Create the watcher BEFORE
// checking whether GPUs are free, so that a release between the check and the sleep is not lost.
// The event is queued just before the kernel drops the lock, so a waiter that checks at once may
// still see it held for a moment: re-check shortly after a wake-up (GpuPool does).
// Closing the inotify descriptor blocks for a kernel grace period: keep watchers for reuse.
#pragma once

#include <chrono>

#include "util/fd.h"

namespace gpulock {

class ReleaseWatcher {
 public:
  // Watches the directory open at dir_fd. Where inotify is unavailable (per-user limits
  // reached), falls back to polling: wait() then sleeps at most 100 ms and reports "maybe".
  explicit ReleaseWatcher(int dir_fd);
  bool polling() const { return !inotify_fd_; }

  // Sleeps until a lock file is closed after writing, or the timeout passes. Returns true if
  // a release (or something that may be one) happened; false on timeout. Drains pending events.
  bool wait(std::chrono::milliseconds timeout);

  // Forgets events that are already queued (when a watcher is reused by a new waiter).
  void discard_pending() { drain(); }

  // The pollable descriptor, for callers that wait on several things.
  int fd() const { return inotify_fd_.get(); }

 private:
  bool drain();
  UniqueFd inotify_fd_;
};

}  // namespace gpulock
