// ForkGate: one process-wide mutex, taken by the atfork prepare handler and released on both
// sides of the fork.
#include "util/fork_gate.h"

#include <pthread.h>

namespace gpulock {
namespace {

pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;

void lock_gate() {
  ::pthread_mutex_lock(&gate);
}
void unlock_gate() {
  ::pthread_mutex_unlock(&gate);
}

}  // namespace

ForkGate::ForkGate() {
  // Registered before the first entry is added, so no fork can come between an entry and the
  // handlers; a child inherits them.
  [[maybe_unused]] static const bool registered =
      ::pthread_atfork(lock_gate, unlock_gate, unlock_gate) == 0;
  lock_gate();
}

ForkGate::~ForkGate() {
  unlock_gate();
}

}  // namespace gpulock
