// WaitChannel: what a waiting request sleeps on, so that only the waiter whose turn it is wakes.
//
// A waiter sleeps on up to three sources, set as its role in the queue requires:
//   - its own wake FIFO (OwnTicket::wake_fd): another process planned the queue and found this
//     waiter served, or wants it to look again;
//   - the process of one other waiter (a pidfd): the waiters form a chain in arrival order, each
//     watching the one that arrived before it, so when a waiter dies, however it dies, the next
//     wakes, clears its slot, re-plans and wakes whoever that makes served;
//   - for the three oldest waiters only (the dispatchers; three, so that waiters stopped with
//     Ctrl-Z cannot hold up everyone unless three are), inotify on the lock directory
//     (IN_CLOSE_WRITE): on a lock file, a lease ended, so they re-plan and wake whoever is
//     served; on the departures file (LockDirectory::kDeparturesName), a waiter left, so that a
//     departure is acted on even if its ring watcher is stopped.
// Only dispatchers hold an inotify instance (fs.inotify.max_user_instances is 128 per user by
// default: a sweep of a thousand waiting jobs must not need one each). A dispatcher that cannot
// get one polls every 100 ms. Each waiting acquire() has a channel of its own, and gives its
// instance back when it leaves the queue, closed in the background: the close blocks for a
// kernel grace period.
#pragma once

#include <sys/types.h>
#include <chrono>

#include <string>

#include "process/process_identity.h"
#include "util/fd.h"

namespace gpulock {

class WaitChannel {
 public:
  WaitChannel();
  // Gives the inotify instance back, closing it in the background (util/close_in_background.h).
  // A child forked without exec while the channel lives closes its copy at once.
  ~WaitChannel();
  WaitChannel(const WaitChannel&) = delete;
  WaitChannel& operator=(const WaitChannel&) = delete;

  // Watches the lock directory open at lock_dir_fd for ended leases and for waiters leaving the
  // queue (death included; Wakeup::queue_change), or stops watching it. Returns true if it
  // started watching just now (the caller must then look at the locks and the queue again).
  bool watch_releases(int lock_dir_fd, bool on);

  // Watches `process` (another waiter: pid and start time) instead of any other, until it ends;
  // pid 0 watches none. Returns false if that process is gone already (its pid unused, or used
  // by another process); true, watching nothing, where pidfds are not supported. The caller
  // checks afterwards that the waiter's ticket is still live, so an end is never missed.
  bool watch_process(const ProcessId& process);
  bool watching_process() const { return watched_pid_ != 0; }

  struct Wakeup {
    bool release = false;        // a lease ended (or events were lost)
    bool queue_change = false;   // the watched waiter ended, a waiter left, or someone woke us
    bool woken = false;          // someone woke us through the wake FIFO to plan again
    bool promoted = false;       // ... or only to say we are a dispatcher now (byte 2)
    bool made_oldest = false;    // ... or the oldest waiter now (byte 3; promoted too)
    bool watched_ended = false;  // the watched waiter's process ended
    bool timed_out() const { return !release && !queue_change; }
  };
  // Sleeps until one of the sources fires or the timeout passes, or a signal handler runs or
  // interrupt_fd turns readable (then it returns early, as if timed out). Either fd may be -1.
  Wakeup wait(int wake_fd, std::chrono::milliseconds timeout, int interrupt_fd = -1);

 private:
  void fall_back_to_polling();
  // Closes the inotify instance in the background, no longer closed by a forked child.
  void give_back_inotify_instance();
  // In a forked child: forgets the inherited instance (fork closed it); true if it did.
  bool drop_inherited_inotify_instance();
  Wakeup drain();
  UniqueFd inotify_fd_;      // made when first needed (by a dispatcher)
  pid_t inotify_owner_ = 0;  // the process that made it: a forked child's copy was closed at fork
  bool polling_ = false;     // a dispatcher without inotify
  int releases_wd_ = -1;
  UniqueFd process_fd_;  // pidfd of the watched waiter
  pid_t watched_pid_ = 0;
};

}  // namespace gpulock
