// FakeLeaseKeeper: a LeaseKeeper (src/backend/lease_keeper.h) that a test controls: it records
// what it is asked to publish, and declares the lease lost when the test says so, as a Redis
// lease's keeper does when renewal fails. Lets the lease-loss paths of run_command() and the
// detached holder be tested without a server.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/lease_keeper.h"
#include "backend/lease_state.h"
#include "gpulock/error.hpp"
#include "gpulock/lease.hpp"

namespace gpulock::test_support {

class FakeLeaseKeeper final : public LeaseKeeper {
 public:
  // What the test can observe; shared, since the Lease owns (and finally destroys) the keeper.
  struct Log {
    std::mutex mutex;
    std::vector<HolderRecord> published;
    std::atomic<bool> destroyed{false};
    // Called after each publish_record(), e.g. to tell a waiting command.
    std::function<void()> after_publish;
  };

  FakeLeaseKeeper(std::shared_ptr<Log> log, std::uint64_t token, std::string host)
      : log_(std::move(log)), token_(token), host_(std::move(host)) {}
  ~FakeLeaseKeeper() override { log_->destroyed = true; }

  void publish_record(const HolderRecord& record) override {
    std::function<void()> after;
    {
      std::lock_guard<std::mutex> lock(log_->mutex);
      log_->published.push_back(record);
      after = log_->after_publish;
    }
    if (after) after();
  }
  std::span<const int> lock_fds() const override { return {}; }
  std::uint64_t fencing_token() const override { return token_; }
  const std::string& gpu_host() const override { return host_; }
  std::uint64_t verify() override {
    if (lost_.load()) throw Error(ErrorCode::kNotFound, "lost (fake)");
    return token_;
  }
  bool lost() const override { return lost_.load(); }
  void on_lost(std::function<void(const std::string&)> callback) override {
    std::lock_guard<std::mutex> lock(mutex_);
    callback_ = std::move(callback);
  }
  void prepare_fork() override {}
  bool belongs_to_this_process() const override { return true; }
  void disown() override {}
  void resume_in_child() override {}

  // As a keeper's thread does when the lease is lost: once, calling the callback if one is set.
  void declare_lost(const std::string& reason) {
    if (lost_.exchange(true)) return;
    std::function<void(const std::string&)> callback;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      callback = callback_;
    }
    if (callback) callback(reason);
  }

 private:
  std::shared_ptr<Log> log_;
  const std::uint64_t token_;
  const std::string host_;
  std::atomic<bool> lost_{false};
  std::mutex mutex_;
  std::function<void(const std::string&)> callback_;
};

// A Lease of `gpus` simulated GPUs held by `keeper` (which the Lease then owns).
inline Lease FakeLease(std::unique_ptr<FakeLeaseKeeper> keeper, unsigned gpus = 1) {
  auto state = std::make_unique<LeaseState>();
  state->id = "0123456789abcdef";
  for (unsigned i = 0; i < gpus; ++i)
    state->gpus.push_back(
        LeasedGpu{i, std::to_string(i), "GPU-fake-" + std::to_string(i), "Fake GPU", false});
  state->record.lease_id = state->id;
  state->started_at = std::chrono::system_clock::now();
  state->keeper = std::move(keeper);
  return Lease(std::move(state));
}

}  // namespace gpulock::test_support
