// AcquireMutex: taking the machine-wide acquire mutex, waiting for it in the kernel's line.
#include "local/acquire_mutex.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <random>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "local/fork_guard.h"
#include "local/gpu_lock_file.h"
#include "util/current_pid.h"
#include "util/fork_gate.h"
#include "util/helper_threads.h"

namespace gpulock {

// Shared by the caller and the helper thread that makes the blocking request.
struct AcquireMutex::KernelWait {
  std::mutex mutex;
  std::condition_variable answered_cv;
  bool answered = false;  // the kernel granted the lock (or refused: error)
  int error = 0;
  bool abandoned = false;  // the caller gave up: the helper lets go of a lock it gets
  bool held = false;       // granted while wanted: the caller's descriptor holds the lock now
  UniqueFd fd;             // a duplicate of the mutex's descriptor: the same lock
};

AcquireMutex::AcquireMutex(const LockDirectory& dir) : dir_(dir) {}

AcquireMutex::~AcquireMutex() {
  if (!fd_) return;
  const ForkGate gate;  // unguarded and closed in one step
  forget_in_forked_child(fd_.get());
  fd_.reset();
  // A request still queued keeps its own duplicate, and lets go of the lock once granted.
}

void AcquireMutex::Hold::release() {
  if (!mutex_) return;
  unlock(mutex_->fd_.get());
  mutex_ = nullptr;
  threads_.unlock();
}

AcquireMutex::Hold AcquireMutex::hold(Clock::time_point give_up,
                                      const std::function<bool()>& interrupted,
                                      std::chrono::milliseconds interrupt_poll) {
  std::unique_lock<std::mutex> threads(threads_);
  open_file();
  take(give_up, interrupted, interrupt_poll);
  return Hold(*this, std::move(threads));
}

void AcquireMutex::open_file() {
  if (fd_) return;
  // A child forked while another thread holds the mutex must not keep it (fork_guard.h), so the
  // descriptor is guarded in the same step as it is opened.
  const ForkGate gate;
  fd_ = dir_.open_acquire_mutex();
  reopen_in_forked_child(fd_.get(), dir_.fd(), LockDirectory::kAcquireMutexName);
}

void AcquireMutex::timed_out() const {
  throw Error(ErrorCode::kTimedOut,
              fmt::format("the machine-wide acquire lock {} is held by another process and was "
                          "not released in time (a stopped or misbehaving process?)",
                          (dir_.path() / LockDirectory::kAcquireMutexName).string()));
}

namespace {

[[noreturn]] void interrupted_error() {
  throw Error(ErrorCode::kInterrupted,
              "interrupted while waiting for the machine-wide acquire lock");
}

}  // namespace

void AcquireMutex::request_in_kernel(const std::shared_ptr<KernelWait>& wait, int helper_slot) {
  helper_thread_started(helper_slot);
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  int result = 0;
  {
    // A fork need not wait for this helper while the lock is not granted.
    const HelperThreadBlocked blocked(helper_slot);
    while ((result = ::fcntl(wait->fd.get(), F_OFD_SETLKW, &lock)) != 0 && errno == EINTR) {
    }
  }
  const int error = result == 0 ? 0 : errno;
  {
    const std::lock_guard<std::mutex> guard(wait->mutex);
    // Granted to a caller that gave up: the next in line gets it at once.
    if (error == 0 && wait->abandoned) unlock(wait->fd.get());
    wait->held = error == 0 && !wait->abandoned;
    wait->error = error;
    wait->answered = true;
  }
  wait->answered_cv.notify_all();
  // The duplicate goes: the lock, if the caller has it, stays with the caller's descriptor.
  const ForkGate gate;
  forget_in_forked_child(wait->fd.get());
  wait->fd.reset();
}

void AcquireMutex::take(Clock::time_point give_up, const std::function<bool()>& interrupted,
                        std::chrono::milliseconds interrupt_poll) {
  if (pending_ && pending_owner_ != current_pid()) pending_.reset();  // a forked child's copy
  while (true) {
    if (!pending_) {
      if (try_lock_exclusive(fd_.get())) return;
      pending_ = start_request();
      if (!pending_) return poll_for(give_up, interrupted);  // no helper to be had
      pending_owner_ = current_pid();
    }
    // Made now, or taken over from a caller that gave up: cleared once answered.
    KernelWait& wait = *pending_;
    wait_for(wait, give_up, interrupted, interrupt_poll);
    const bool held = wait.held;
    const int error = wait.error;
    pending_.reset();
    if (held) return;
    // Refused outright (ENOLCK, say): wait as a process without a helper would.
    if (error != 0) return poll_for(give_up, interrupted);
    // Granted after its caller gave up, and let go at once: into the line again.
  }
}

std::shared_ptr<AcquireMutex::KernelWait> AcquireMutex::start_request() {
  auto wait = std::make_shared<KernelWait>();
  {
    // Guarded at once: a child forked while the helper holds the lock must not keep it.
    const ForkGate gate;
    wait->fd = UniqueFd(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 3));
    if (!wait->fd) return nullptr;
    close_in_forked_child(wait->fd.get());
  }
  // The helper takes no signal: handlers run on the caller's threads, as they expect.
  sigset_t all, previous;
  ::sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  bool started = true;
  const int helper_slot = reserve_helper_thread();  // -1: started all the same, not waited for
  try {
    std::thread(request_in_kernel, wait, helper_slot).detach();
  } catch (const std::system_error&) {
    started = false;  // no thread to be had (RLIMIT_NPROC, say)
    helper_thread_not_started(helper_slot);
  }
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  if (started) return wait;
  const ForkGate gate;
  forget_in_forked_child(wait->fd.get());
  wait->fd.reset();
  return nullptr;
}

void AcquireMutex::wait_for(KernelWait& wait, Clock::time_point give_up,
                            const std::function<bool()>& interrupted,
                            std::chrono::milliseconds interrupt_poll) {
  std::unique_lock<std::mutex> guard(wait.mutex);
  wait.abandoned = false;
  while (!wait.answered) {
    Clock::time_point until = give_up;
    if (interrupted) until = std::min(until, Clock::now() + interrupt_poll);
    wait.answered_cv.wait_until(guard, until, [&] { return wait.answered; });
    if (wait.answered) break;
    if (Clock::now() >= give_up) {
      wait.abandoned = true;
      timed_out();
    }
    if (interrupted) {
      guard.unlock();  // the caller's code, maybe slow: the helper must not wait for it
      const bool stop = interrupted();
      guard.lock();
      if (wait.answered) break;
      if (stop) {
        wait.abandoned = true;
        interrupted_error();
      }
    }
  }
}

void AcquireMutex::poll_for(Clock::time_point give_up, const std::function<bool()>& interrupted) {
  thread_local std::minstd_rand jitter(static_cast<unsigned>(::getpid()));
  while (!try_lock_exclusive(fd_.get())) {
    if (Clock::now() >= give_up) timed_out();
    if (interrupted && interrupted()) interrupted_error();
    std::this_thread::sleep_for(std::chrono::microseconds(500 + jitter() % 1500));
  }
}

}  // namespace gpulock
