// AcquireMutex: the machine-wide mutex under which an acquisition plans the queue and takes its
// GPUs: an OFD lock on the lock directory's ".acquire.lock" (for the processes of the machine)
// and a std::mutex (for the threads of this process).
//
// It is taken with non-blocking attempts, so that a process stopped inside its critical section,
// or one holding the 0666 file's lock on purpose, cannot hang every request: they time out with
// an explanation instead. Between attempts a process sleeps on the FIFO ".acquire.wake", to which
// every holder writes a byte when it lets go, so that the mutex does not stand free while others
// sleep (the holder is on every acquisition's path, and a hand-off waits for it twice). A holder
// that dies lets go without writing, as do versions before this one: a sleeper also tries again
// after `safety_interval`. Where the FIFO cannot be used (a planted file of that name), the
// waiters poll with short random pauses instead.
#pragma once

#include <chrono>
#include <mutex>
#include <utility>

#include "local/lock_directory.h"
#include "util/fd.h"

namespace gpulock {

class AcquireMutex {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::milliseconds kDefaultSafetyInterval{2};

  explicit AcquireMutex(const LockDirectory& dir,
                        std::chrono::milliseconds safety_interval = kDefaultSafetyInterval);
  ~AcquireMutex();
  AcquireMutex(const AcquireMutex&) = delete;
  AcquireMutex& operator=(const AcquireMutex&) = delete;

  // The mutex held for the object's lifetime, or until release().
  class Hold {
   public:
    Hold(Hold&& other) noexcept
        : mutex_(std::exchange(other.mutex_, nullptr)), threads_(std::move(other.threads_)) {}
    Hold& operator=(Hold&&) = delete;
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold() { release(); }
    // Drops the file's lock and wakes the processes waiting for it, then lets this process's
    // other threads in; once.
    void release();

   private:
    friend class AcquireMutex;
    Hold(AcquireMutex& mutex, std::unique_lock<std::mutex> threads)
        : mutex_(&mutex), threads_(std::move(threads)) {}
    AcquireMutex* mutex_;
    std::unique_lock<std::mutex> threads_;
  };

  // Takes the mutex (opening its files on first use), or throws kTimedOut at `give_up`.
  Hold hold(Clock::time_point give_up);

 private:
  // REQUIRES: threads_ held.
  void open_files();
  void take(Clock::time_point give_up);
  void let_go();

  const LockDirectory& dir_;
  const std::chrono::milliseconds safety_interval_;
  std::mutex threads_;
  UniqueFd fd_;
  UniqueFd wake_fd_;  // open for reading and writing; empty where the FIFO is unusable
  Clock::time_point next_wake_try_{};
  static constexpr std::chrono::seconds kWakeRetryInterval{1};
};

}  // namespace gpulock
