// ForkGate: a lock that fork() takes too, for tables of descriptors that a forked child acts on.
//
// fork() copies the descriptor table before the memory while the parent's other threads run
// on. A table of descriptors that a pthread_atfork child handler closes (util/
// close_in_background.h, local/fork_guard.h) must therefore not change during a fork, or the
// child's copy of the table names descriptors its own table does not have (or has as other
// files). Entries are added and removed while holding a ForkGate; an atfork prepare handler
// takes the same lock, so a fork waits for the change in progress and no change starts during it.
#pragma once

namespace gpulock {

class ForkGate {
 public:
  // Takes the lock (registering the atfork handlers on first use). Hold it briefly, and not in
  // code a signal handler can interrupt to fork.
  ForkGate();
  ~ForkGate();
  ForkGate(const ForkGate&) = delete;
  ForkGate& operator=(const ForkGate&) = delete;
};

}  // namespace gpulock
