// Monitoring a pool for the people who run it: leased GPUs that sit idle, processes that run on
// a GPU leased to someone else (intruders), and the Prometheus text format of it all. Report
// only: nothing here stops a process or ends a lease.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpulock/queue.hpp"
#include "gpulock/status.hpp"
#include "gpulock/usage.hpp"

namespace gpulock {

// Follows leased GPUs' utilisation from one status reading to the next, to tell how long each
// has read 0 % without a break. One `gpulock status` sees a single moment, so the readings are
// kept between runs in a small per-user file (default_idle_record_path()); a long-running
// reader (`gpulock serve`) keeps them in memory. A GPU counts as at 0 % since the first of an
// unbroken run of readings at 0 % for the same lease, no two more than kMaxReadingGap apart
// (a longer gap could hide a busy spell, so the run restarts). A device source that knows the
// time itself (simulated GPUs' `idle_since`) is taken at its word.
class IdleTracker {
 public:
  static constexpr std::chrono::minutes kMaxReadingGap{10};

  // `record`: the file that keeps readings between runs; empty: memory only. A missing,
  // unreadable or damaged file counts as no readings; one that cannot be written is skipped
  // (monitoring never stops a status from being shown).
  explicit IdleTracker(std::filesystem::path record = {});

  // Takes the status's readings in and marks its leased GPUs' idle_since and idle (at 0 % for
  // at least idle_after), and status.idle_after. Thread-safe.
  void observe(PoolStatus& status, std::chrono::seconds idle_after);

 private:
  struct Reading {
    std::string lease_id;
    double zero_since = 0;  // Unix seconds
    double last_seen = 0;
  };
  void load();
  void save() const;

  std::filesystem::path record_;
  std::mutex mutex_;
  std::map<std::string, Reading> readings_;  // by "host/uuid"
};

// $XDG_STATE_HOME/gpulock/idle-readings.txt, else ~/.local/state/gpulock/idle-readings.txt;
// empty (memory only) when neither can be named (no HOME), or the directory named is not one of
// this user's own (root under sudo with the invoking user's HOME).
std::filesystem::path default_idle_record_path();

// A compute process on a leased GPU that the lease's process tree does not contain.
struct Intruder {
  unsigned pid = 0;
  std::string user;  // "" when the process cannot be seen (another container)
  std::optional<std::uint64_t> used_memory_bytes;
  std::string host;
  std::string gpu;  // display index
  std::string gpu_uuid;
  std::string lease_id;     // the lease holding the GPU
  std::string holder_user;  // who holds it
};

// Every intruder of a status, in GPU order.
std::vector<Intruder> intruders_of(const PoolStatus& status);

// "intruder: pid 4711 (bob) on GPU 0 leased by alice (lease 3f2a9c0d4b1e7a65)".
std::string describe_intruder(const Intruder& intruder);

// The Prometheus text exposition format (version 0.0.4) of a status and the queue: per-GPU
// state, holder, utilisation, memory, idle and intruders; queue length and waits per user.
// Names and units: docs/operations.md, "Metrics". With `lease_counts`, also
// gpulock_journal_up and the counters gpulock_leases_started_total{user} and
// gpulock_leases_ended_total{user,how} (only while the journal could be read).
std::string metrics_text(const PoolStatus& status, const QueueStatus& queue,
                         const LeaseCounts* lease_counts = nullptr);

}  // namespace gpulock
