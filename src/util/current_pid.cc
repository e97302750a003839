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

}  // namespace

pid_t current_pid() {
  pid_t pid = known_pid.load(std::memory_order_relaxed);
  if (pid != 0) return pid;
  // Registered before the first pid is kept, so no kept pid survives a fork; a child inherits
  // the handler.
  static const bool forgets_after_fork =
      ::pthread_atfork(nullptr, nullptr, forget_pid_in_child) == 0;
  pid = ::getpid();
  if (forgets_after_fork) known_pid.store(pid, std::memory_order_relaxed);
  return pid;
}

}  // namespace gpulock
