// ForkGate: one process-wide mutex, taken by the atfork prepare handler and released on both
// sides of the fork; per thread, how deep it is held and the signal mask to restore.
#include "util/fork_gate.h"

#include <pthread.h>
#include <signal.h>

namespace gpulock {
namespace {

pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;

void lock_gate() {
  ::pthread_mutex_lock(&gate);
}
void unlock_gate() {
  ::pthread_mutex_unlock(&gate);
}

// Registered when the program (or the Python module) is loaded, before any entry can exist; a
// child inherits the handlers.
[[maybe_unused]] const bool registered = ::pthread_atfork(lock_gate, unlock_gate, unlock_gate) == 0;

thread_local int held_depth = 0;
thread_local sigset_t mask_before;

}  // namespace

ForkGate::ForkGate() {
  if (held_depth++ > 0) return;
  sigset_t all;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &mask_before);
  lock_gate();
}

ForkGate::~ForkGate() {
  if (--held_depth > 0) return;
  unlock_gate();
  ::pthread_sigmask(SIG_SETMASK, &mask_before, nullptr);
}

}  // namespace gpulock
