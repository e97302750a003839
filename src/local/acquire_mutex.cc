// AcquireMutex: taking the machine-wide acquire mutex, sleeping on its wake FIFO in between.
#include "local/acquire_mutex.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "local/fork_guard.h"
#include "local/gpu_lock_file.h"
#include "util/fork_gate.h"

namespace gpulock {

AcquireMutex::AcquireMutex(const LockDirectory& dir, std::chrono::milliseconds safety_interval)
    : dir_(dir), safety_interval_(safety_interval) {}

AcquireMutex::~AcquireMutex() {
  if (!fd_) return;
  const ForkGate gate;  // unguarded and closed in one step
  forget_in_forked_child(fd_.get());
  fd_.reset();
}

void AcquireMutex::Hold::release() {
  if (!mutex_) return;
  mutex_->let_go();
  mutex_ = nullptr;
  threads_.unlock();
}

AcquireMutex::Hold AcquireMutex::hold(Clock::time_point give_up) {
  std::unique_lock<std::mutex> threads(threads_);
  open_files();
  take(give_up);
  return Hold(*this, std::move(threads));
}

void AcquireMutex::open_files() {
  if (!fd_) {
    // A child forked while another thread holds the mutex must not keep it (fork_guard.h), so
    // the descriptor is guarded in the same step as it is opened. The FIFO needs no such care:
    // it holds no lock, and a byte too many only costs an attempt.
    const ForkGate gate;
    fd_ = dir_.open_acquire_mutex();
    reopen_in_forked_child(fd_.get(), dir_.fd(), LockDirectory::kAcquireMutexName);
  }
  // A FIFO that could not be used (not made yet by another user, or its mode not set yet) is
  // tried again now and then, not at every acquisition.
  if (!wake_fd_ && Clock::now() >= next_wake_try_) {
    wake_fd_ = dir_.open_acquire_wake();
    if (!wake_fd_) next_wake_try_ = Clock::now() + kWakeRetryInterval;
  }
}

void AcquireMutex::take(Clock::time_point give_up) {
  const auto started = Clock::now();
  auto pause = std::chrono::microseconds(1000);
  thread_local std::minstd_rand jitter(static_cast<unsigned>(::getpid()));
  while (!try_lock_exclusive(fd_.get())) {
    const auto now = Clock::now();
    if (now >= give_up) {
      throw Error(ErrorCode::kTimedOut,
                  fmt::format("the machine-wide acquire lock {} is held by another process and "
                              "was not released in time (a stopped or misbehaving process?)",
                              (dir_.path() / LockDirectory::kAcquireMutexName).string()));
    }
    const bool long_held = now - started >= std::chrono::milliseconds(100);
    if (wake_fd_) {
      // Until a holder lets go (its byte), or the safety interval passes. A byte written between
      // the failed attempt and the poll is still there, unless another waiter read it: that
      // one tries the mutex, and whoever then holds it writes again when it lets go.
      auto timeout =
          long_held ? std::max(safety_interval_, std::chrono::milliseconds(10)) : safety_interval_;
      timeout = std::min(timeout, std::chrono::ceil<std::chrono::milliseconds>(give_up - now));
      pollfd wake{wake_fd_.get(), POLLIN, 0};
      if (::poll(&wake, 1, static_cast<int>(timeout.count())) > 0 && (wake.revents & POLLIN)) {
        // One read, whatever is left: a FIFO kept full by someone must not keep us from
        // trying the mutex and watching the clock.
        char bytes[4096];
        [[maybe_unused]] const ssize_t drained = ::read(wake_fd_.get(), bytes, sizeof bytes);
      }
    } else if (!long_held) {
      // Short and random: a doubling back-off let later arrivals with short pauses take every
      // free slot from earlier ones.
      std::this_thread::sleep_for(std::chrono::microseconds(20 + jitter() % 180));
    } else {
      // Something is wrong with the holder: spare the CPU.
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(10000));
    }
  }
}

void AcquireMutex::let_go() {
  unlock(fd_.get());
  if (wake_fd_) {
    // Non-blocking: a full FIFO has bytes for whoever waits already.
    const char byte = 1;
    [[maybe_unused]] const ssize_t ignored = ::write(wake_fd_.get(), &byte, 1);
  }
}

}  // namespace gpulock
