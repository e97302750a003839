// Helpers for the GpuPool tests (gpu_pool_test.cc, local only, and gpu_pool_contract_test.cc,
// on every backend): requests, simulated GPU names, an idle child process, and an acquire run
// in a thread of its own.
#pragma once

#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <future>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gpulock/error.hpp"
#include "gpulock/gpu_pool.hpp"

namespace gpulock::test_support {

using std::chrono::milliseconds;

inline constexpr std::uint64_t kGiB = 1024ULL * 1024 * 1024;
// Long enough never to be reached by a test that works; only a guard against hanging forever.
inline constexpr milliseconds kHangGuard = std::chrono::minutes(5);

// The UUIDs of make_simulated_source() (docs/simulated-gpus.md).
inline std::string SimUuid(unsigned index) {
  return "GPU-5e1f0a7e-0000-4000-8000-00000000000" + std::to_string(index);
}

// A forked child that does nothing until it is destroyed (then it exits and is reaped).
class IdleChild {
 public:
  IdleChild() {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::close(fds[1]);
      char c;
      while (::read(fds[0], &c, 1) < 0 && errno == EINTR) {
      }
      ::_exit(0);
    }
    ::close(fds[0]);
    write_end_ = fds[1];
  }
  ~IdleChild() {
    ::close(write_end_);  // the child reads end-of-file and exits
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  pid_t pid() const { return pid_; }
  // True while the child has not exited (or been killed).
  bool running() const {
    int status = 0;
    return ::waitpid(pid_, &status, WNOHANG) == 0;
  }

 private:
  pid_t pid_ = -1;
  int write_end_ = -1;
};

inline LeaseRequest Count(unsigned count) {
  LeaseRequest request;
  request.count = count;
  request.wait = false;
  return request;
}

inline LeaseRequest Named(std::vector<std::string> gpus) {
  LeaseRequest request;
  request.gpus = std::move(gpus);
  request.wait = false;
  return request;
}

// A request that waits (up to the hang guard).
inline LeaseRequest Waiting(LeaseRequest request) {
  request.wait = true;
  request.timeout = kHangGuard;
  return request;
}

inline std::vector<unsigned> Indices(const Lease& lease) {
  std::vector<unsigned> out;
  for (const auto& gpu : lease.gpus()) out.push_back(gpu.index);
  return out;
}

// Runs pool.acquire(request, hooks) in a thread; Wait() returns once the acquire has reported
// that it is waiting (or has finished).
class BackgroundAcquire {
 public:
  BackgroundAcquire(GpuPool& pool, LeaseRequest request, WaitHooks hooks = {}) {
    auto user_progress = hooks.on_progress;
    hooks.on_progress = [this, user_progress](const WaitProgress& progress) {
      if (user_progress) user_progress(progress);
      Signal();
    };
    thread_ = std::thread([this, &pool, request = std::move(request), hooks = std::move(hooks)] {
      try {
        lease_.emplace(pool.acquire(request, hooks));
      } catch (...) {
        failure_ = std::current_exception();
      }
      Signal();
    });
  }
  ~BackgroundAcquire() {
    if (thread_.joinable()) thread_.join();
  }

  void WaitUntilWaiting() { waiting_.get_future().wait(); }
  // Joins the thread; the lease it got, or nullopt (failure() says why).
  std::optional<Lease>& Finish() {
    thread_.join();
    return lease_;
  }
  std::exception_ptr failure() const { return failure_; }

 private:
  void Signal() {
    std::call_once(signalled_, [this] { waiting_.set_value(); });
  }

  std::promise<void> waiting_;
  std::once_flag signalled_;
  std::optional<Lease> lease_;
  std::exception_ptr failure_;
  std::thread thread_;
};

inline std::string Describe(std::exception_ptr failure) {
  if (!failure) return "none";
  try {
    std::rethrow_exception(failure);
  } catch (const Error& error) {
    return std::string(error_code_name(error.code())) + ": " + error.what();
  } catch (const std::exception& error) {
    return error.what();
  }
  return "unknown";
}

}  // namespace gpulock::test_support
