// RedisLeaseKeeper: renews a Redis lease from a background thread every TTL/3, and releases it.
//
// Renewals that fail (Redis unreachable, paused, restarting) are retried with back-off and warned
// about once. The lease counts as lost when a whole TTL passes since the last renewal the
// server confirmed (counted from when that renewal was sent, so the server's copy can only expire
// later), or when the renew script reports another lease on one of its GPUs. A server that
// restarted empty gets the lease back at the next renewal if nobody took its GPUs meanwhile.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>

#include <sys/types.h>
#include <vector>

#include "backend/lease_keeper.h"
#include "redis/redis_connection_cache.h"

namespace gpulock {

struct RedisLeaseTerms {
  std::string version_key;  // KEYS[1] of the scripts: "gpulock:{POOL}:version"
  std::chrono::milliseconds ttl{30000};
  std::string lease_id;
  std::uint64_t token = 0;
  std::vector<std::string> uuids;
  std::string user;
  std::string gpu_host;
  // A shared lease: the memory units it reserves on each of `uuids` (parallel); empty for an
  // exclusive lease. A shared lease is renewed with kRenewShared, and its reservations are what
  // verify() checks.
  std::vector<std::uint64_t> shared_units;
};

class RedisLeaseKeeper final : public LeaseKeeper {
 public:
  using Clock = std::chrono::steady_clock;
  // `confirmed_at`: when the acquire that created the lease was sent.
  RedisLeaseKeeper(RedisLeaseTerms terms, std::string record_json,
                   std::shared_ptr<RedisConnectionCache> connections,
                   Clock::time_point confirmed_at);
  ~RedisLeaseKeeper() override;

  // Publishes the record (as holder_record_json) with a renewal done at once, and returns once
  // the server has it (so that `gpulock status` and `gpulock release` see it next), or when
  // that renewal fails, at most TTL/3 later (the record then goes with a later renewal).
  void publish_record(const HolderRecord& record) override;
  void update_record(const std::string& record_json);
  std::span<const int> lock_fds() const override { return {}; }
  std::uint64_t fencing_token() const override { return terms_.token; }
  const std::string& gpu_host() const override { return terms_.gpu_host; }
  // One MGET of the lease's lock keys, on a connection of this process's own.
  std::uint64_t verify() override;
  // By the clock: true from the instant a whole TTL has passed since the last renewal the server
  // confirmed (counted from when it was sent), whoever asks and whether or not the renewal
  // thread has run since; also true once the server reported the lease taken or released.
  bool lost() const override;
  void on_lost(std::function<void(const std::string&)> callback) override;
  void prepare_fork() override;
  bool belongs_to_this_process() const override;
  void disown() override;
  void resume_in_child() override;

 private:
  void start();
  void stop();
  void run();
  Clock::time_point lost_at() const;
  void declare_lost(const std::string& reason);
  void warn_once(const std::string& message);

  const RedisLeaseTerms terms_;
  std::shared_ptr<RedisConnectionCache> connections_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable published_;
  bool stopping_ = false;
  bool record_dirty_ = false;
  std::uint64_t record_version_ = 0;    // counts update_record() calls
  std::uint64_t record_confirmed_ = 0;  // the version the server confirmed last
  std::uint64_t renewals_tried_ = 0;    // renewals that ended, confirmed or not
  bool disowned_ = false;
  bool warned_ = false;
  bool warned_damage_ = false;  // about damaged reservation keys, once per lease
  std::string record_json_;
  std::function<void(const std::string&)> on_lost_;
  // When the last renewal the server confirmed was sent (its time_since_epoch, for lost()).
  std::atomic<Clock::rep> confirmed_at_;
  std::atomic<bool> lost_{false};
  // The renewal thread, and the process it runs in. A process forked without prepare_fork()
  // (e.g. Python's multiprocessing) has a copy of this object but not the thread: there the
  // keeper does nothing at all, and the lease stays with the process that renews it.
  std::unique_ptr<std::thread> thread_;
  pid_t thread_process_ = 0;
};

}  // namespace gpulock
