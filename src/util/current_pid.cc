// This process's id, kept until the next fork() (util/current_pid.h).
#include "util/current_pid.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace gpulock {
namespace {

std::atomic<pid_t> known_pid{0};  // 0: not read in this process yet

void forget_pid_in_child() {
  known_pid.store(0, std::memory_order_relaxed);
}

// Registered when the program (or the Python module) is loaded, before any pid is kept, and
// never under util/fork_gate.h's gate, where a registration could wait for a fork that waits
// for the gate. Until then (another file's static initializers) nothing is kept.
const bool forgets_after_fork = ::pthread_atfork(nullptr, nullptr, forget_pid_in_child) == 0;

}  // namespace

pid_t current_pid() {
  pid_t pid = known_pid.load(std::memory_order_relaxed);
  if (pid != 0) return pid;
  pid = ::getpid();
  if (forgets_after_fork) known_pid.store(pid, std::memory_order_relaxed);
  return pid;
}

}  // namespace gpulock
