// StatusCache: the documents `gpulock serve` answers with, refreshed by one background thread,
// so that any number of dashboard clients cost one status reading per interval, not one each,
// and idle GPUs are followed at a steady pace whether or not anyone is looking. The lease
// counters of /metrics are kept incrementally: each reading of the usage journal costs what was
// appended since the last one.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "gpulock/gpu_pool.hpp"
#include "gpulock/monitor.hpp"

namespace gpulock::serve {

struct Snapshot {
  std::string status_json;  // as `gpulock status --json`
  std::string queue_json;   // as `gpulock queue --json`
  std::string metrics;      // as `gpulock metrics`
  std::string error;        // set when the readings failed (then the others are empty)
};

class StatusCache {
 public:
  // `show_commands`: keep full command lines (else program names only, serve/redaction.h).
  StatusCache(GpuPool& pool, bool show_commands, std::chrono::milliseconds interval);
  ~StatusCache();  // stops the refresher
  StatusCache(const StatusCache&) = delete;
  StatusCache& operator=(const StatusCache&) = delete;

  // The latest snapshot; never null.
  std::shared_ptr<const Snapshot> current() const;

 private:
  std::shared_ptr<const Snapshot> read();
  void refresh_until_stopped();

  GpuPool& pool_;
  const bool show_commands_;
  const std::chrono::milliseconds interval_;
  IdleTracker idle_tracker_;  // in memory: this process reads often enough on its own
  // The lease counters, from what the journal gained since the last reading, which is taken
  // at most once per kLeaseCountInterval (used by the refresher thread only).
  LeaseCountFollower lease_counts_;
  std::chrono::steady_clock::time_point lease_counts_read_at_{};

  mutable std::mutex mutex_;
  std::condition_variable stop_requested_;
  bool stopping_ = false;
  std::shared_ptr<const Snapshot> snapshot_;
  std::thread refresher_;
};

}  // namespace gpulock::serve
