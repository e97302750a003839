// ForkGate: a lock that fork() takes too, for tables of descriptors that a forked child acts on.
//
// fork() copies the descriptor table before the memory while the parent's other threads run
// on. A table of descriptors that a pthread_atfork child handler closes (util/
// close_in_background.h, local/fork_guard.h) must therefore not change during a fork, or the
// child's copy of the table names descriptors its own table does not have (or has as other
// files). Entries are added and removed while holding a ForkGate; an atfork prepare handler
// takes the same lock, so a fork waits for the change in progress and no change starts during it.
//
// A thread holding the gate has every signal blocked: a signal handler that forked there would
// wait in the prepare handler for the gate its own thread holds. The gate may be taken again by
// the thread that holds it (an open and its entry in a table can so be made one step), and must
// be held briefly, with no pthread_atfork registration under it (fork() holds glibc's atfork
// lock while its prepare handler waits for the gate); the tables register their handlers when
// the program is loaded.
#pragma once

namespace gpulock {

class ForkGate {
 public:
  ForkGate();
  ~ForkGate();
  ForkGate(const ForkGate&) = delete;
  ForkGate& operator=(const ForkGate&) = delete;
};

}  // namespace gpulock
