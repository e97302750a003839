// This process's id without a system call each time. glibc's getpid() enters the kernel on
// every call (it stopped caching the pid in 2.25): ~1 µs on a virtual machine, where an
// in-process acquire + release asked five times, to tell whether it runs in a fork child.
#pragma once

#include <sys/types.h>

namespace gpulock {

// getpid(), read once and again after each fork() (a pthread_atfork handler forgets it).
// A child made without fork()'s handlers (raw clone(), _Fork()) must not call into gpulock
// before exec, as with any library that keeps per-process state.
pid_t current_pid();

}  // namespace gpulock
