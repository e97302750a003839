// SignalsBlocked: every signal blocked in the calling thread for a scope.
//
// A thread starts with the signal mask of the thread that creates it. gpulock reads the signals
// it handles (SIGCHLD, and the ones `gpulock run` forwards) from a signalfd in the main thread,
// with them blocked there; any other thread of the process that leaves them unblocked is a
// thread the kernel may deliver them to instead, where SIGCHLD is dropped by its default action
// and SIGTERM ends the whole process unforwarded. So code that may start threads we do not own
// (the NVIDIA driver's nvmlInit starts some) or that starts our own runs inside one of these:
// what it starts takes no signal.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace gpulock {

class SignalsBlocked {
 public:
  SignalsBlocked() {
    sigset_t all;
    sigfillset(&all);
    ::pthread_sigmask(SIG_SETMASK, &all, &previous_);
  }
  ~SignalsBlocked() { ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  SignalsBlocked(const SignalsBlocked&) = delete;
  SignalsBlocked& operator=(const SignalsBlocked&) = delete;

 private:
  sigset_t previous_;
};

}  // namespace gpulock
