// AcquireMutex: the machine-wide mutex under which an acquisition plans the queue and takes its
// GPUs: an OFD lock on the lock directory's ".acquire.lock" (for the processes of the machine)
// and a std::mutex (for the threads of this process).
//
// A process that finds it held waits for it in the kernel (F_OFD_SETLKW): the kernel keeps its
// blocked lock requests in arrival order and a release wakes the next in line, so entering the
// queue costs the same whether one process or four thousand arrive together, and nobody spins.
// The blocking request is made by a helper thread on a duplicate of the descriptor (which shares
// the lock), while the caller waits for the helper's answer until its deadline and checks the
// caller's interrupt: a process stopped inside its critical section, or one holding the 0666
// file's lock on purpose, cannot hang every request, which times out with an explanation
// instead. A caller that gave up leaves its request queued; the helper lets go of the lock as
// soon as the kernel grants it, unless the same pool asks for the mutex again meanwhile, which
// then takes that place in the line instead of joining at its end.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include <sys/types.h>

#include "local/lock_directory.h"
#include "util/fd.h"

namespace gpulock {

class AcquireMutex {
 public:
  using Clock = std::chrono::steady_clock;

  explicit AcquireMutex(const LockDirectory& dir);
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
    // Drops the file's lock (the kernel hands it to the next in line), then lets this process's
    // other threads in; once.
    void release();

   private:
    friend class AcquireMutex;
    Hold(AcquireMutex& mutex, std::unique_lock<std::mutex> threads)
        : mutex_(&mutex), threads_(std::move(threads)) {}
    AcquireMutex* mutex_;
    std::unique_lock<std::mutex> threads_;
  };

  // Takes the mutex (opening its file on first use), or throws kTimedOut at `give_up`, or
  // kInterrupted once `interrupted` (asked at least every `interrupt_poll` while waiting) says so.
  Hold hold(Clock::time_point give_up, const std::function<bool()>& interrupted = {},
            std::chrono::milliseconds interrupt_poll = std::chrono::milliseconds(100));

 private:
  struct KernelWait;  // a blocking request queued in the kernel by a helper thread

  // REQUIRES: threads_ held.
  void open_file();
  // Starts a helper thread that queues a blocking request; nullptr if none can be started.
  std::shared_ptr<KernelWait> start_request();
  // The helper's body: the request, then the answer handed over.
  static void request_in_kernel(const std::shared_ptr<KernelWait>& wait, int helper_slot);
  void take(Clock::time_point give_up, const std::function<bool()>& interrupted,
            std::chrono::milliseconds interrupt_poll);
  // Waits for `wait` to be granted; throws (leaving it queued, abandoned) as hold() says.
  void wait_for(KernelWait& wait, Clock::time_point give_up,
                const std::function<bool()>& interrupted, std::chrono::milliseconds interrupt_poll);
  // Where no helper thread can be started: non-blocking attempts with short pauses.
  void poll_for(Clock::time_point give_up, const std::function<bool()>& interrupted);
  [[noreturn]] void timed_out() const;

  const LockDirectory& dir_;
  std::mutex threads_;
  UniqueFd fd_;
  // A request left queued by a caller that gave up, which the next hold() takes over; made by
  // the process `pending_owner_` (a forked child drops its parent's: the helper is not there).
  std::shared_ptr<KernelWait> pending_;
  pid_t pending_owner_ = 0;
};

}  // namespace gpulock
