// Usage accounting: the usage journal's records (every lease start and end) and what
// `gpulock usage` makes of them (GPU-hours, leases and median wait per group).
//
// GpuPool::journal() reads the records of the pool's backend (local: the journal directory;
// Redis: a capped stream in the pool); summarize_usage() turns them into a UsageReport. The JSON
// documents of `gpulock usage --json` and `gpulock log --json` are described in docs/json.md.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gpulock {

// How a lease ended.
enum class LeaseEnd {
  kReleased,    // its holder let it go (a command's end, `gpulock release`, a Lease destroyed)
  kHolderDied,  // no end was written: seen later with its lock gone (SIGKILL of everything)
  kLost,        // Redis: it expired before it could be renewed, or was taken over
};
const char* lease_end_name(LeaseEnd end) noexcept;  // "released", "holder_died", "lost"

// Why the command run under a lease ended (`gpulock run`, a job of `gpulock submit`).
enum class CommandEnd {
  kExited,      // it exited by itself (any status)
  kSignal,      // a signal killed it (one sent from outside, or forwarded by gpulock run)
  kTimeout,     // stopped at its --time limit
  kCancelled,   // stopped by `gpulock cancel`
  kOverMemory,  // stopped by --on-over-memory=term
  kLeaseLost,   // stopped by --on-lease-loss=kill
};
const char* command_end_name(CommandEnd end) noexcept;  // "exited", "signal", "timeout", ...
std::optional<CommandEnd> command_end_named(std::string_view name) noexcept;

// How the command under a lease ended, as the journal's end record keeps it.
struct CommandOutcome {
  CommandEnd how = CommandEnd::kExited;
  int exit_status = 0;  // what gpulock run exits with: the command's status, 128+N for signal N
  int signal = 0;       // the signal that killed the command; 0 if it exited
};

struct JournalGpu {
  std::string uuid;
  int index = -1;  // the NVML index when the lease started
};

// One line of the journal: a lease's start, or its end.
struct JournalRecord {
  enum class Kind { kStart, kEnd };
  Kind kind = Kind::kStart;
  std::string lease_id;
  double time = 0;  // seconds since the Unix epoch: when the lease started, or ended
  // Start records.
  std::string user;
  unsigned uid = 0;
  std::string host;
  std::vector<JournalGpu> gpus;
  std::string label;
  std::string command;
  double waited_seconds = 0;  // time spent in the queue before the lease started
  // A shared lease: the memory it reserves on each of its GPUs; 0 for whole GPUs. Shared leases
  // coexist on a GPU, so the start of one does not mean that another has ended.
  std::uint64_t memory_bytes = 0;
  // End records.
  LeaseEnd end = LeaseEnd::kReleased;
  bool inferred = false;  // written by a reader that found the lease gone, not by its holder
  // How the command run under the lease ended; unset for a lease that ran none (acquire, the
  // library) and for an end nobody wrote.
  std::optional<CommandOutcome> outcome;
  // Who wrote the record, where the journal knows (the owner of the local file it was read
  // from); unset for Redis. Not part of the record's text.
  std::optional<unsigned> writer_uid;
};

// A lease as the journal tells it: its start, and its end once known.
struct UsageLease {
  JournalRecord start;
  std::optional<double> ended_at;  // unset while the lease still runs
  std::optional<LeaseEnd> end;
  bool end_inferred = false;
  std::optional<CommandOutcome> outcome;  // the end record's
};

// What the journal holds between two times, with notes about damaged records.
struct JournalContents {
  std::vector<JournalRecord> records;  // in time order
  std::vector<std::string> warnings;   // damaged or unreadable records, skipped
  std::string location;                // the directory or stream read
  bool available = true;               // false when there is no journal to read
};

enum class UsageGrouping { kUser, kGpu, kLabel, kDay, kJob };
const char* usage_grouping_name(UsageGrouping grouping) noexcept;  // "user", "gpu", ...
// The grouping usage_grouping_name() calls `name`; nullopt for any other text.
std::optional<UsageGrouping> usage_grouping_named(std::string_view name) noexcept;

struct UsageGroup {
  // The user, GPU UUID, label ("" for none), day (YYYY-MM-DD, UTC) or job id ("" for leases of
  // no job).
  std::string key;
  double gpu_hours = 0;
  unsigned leases = 0;             // leases that overlap the window
  double median_wait_seconds = 0;  // over those leases' waits
  double max_wait_seconds = 0;
  // By GPU: its index and name now (GpuPool::usage() asks the devices), else the index the
  // journal last recorded for it and no name (a GPU gone from this machine, another host's).
  std::string gpu_index;
  std::string gpu_name;
};

struct UsageReport {
  double since = 0;  // the window, seconds since the Unix epoch
  double until = 0;
  UsageGrouping grouping = UsageGrouping::kUser;
  std::vector<UsageGroup> groups;  // by GPU-hours, largest first (by date for kDay)
  UsageGroup total;                // key "total"
  std::vector<std::string> warnings;
};

// Pairs starts with ends. A start whose end is missing is still running (ended_at unset).
// Where the writer is known, a start is believed only from its own user (or root), and a
// written end only from the start's user (or root): nobody can claim or end others' leases
// in their own journal file. Inferred ends are believed from anyone, and a written end
// overrides them.
std::vector<UsageLease> pair_journal_records(const std::vector<JournalRecord>& records);

// GPU-hours are counted only inside [since, until): a lease that overlaps the window counts
// for the overlap; one still running counts until `until` (or `now`, whichever is earlier).
UsageReport summarize_usage(const std::vector<UsageLease>& leases, double since, double until,
                            UsageGrouping grouping, double now);

// `gpulock usage --json`, `gpulock usage --csv`, `gpulock log --json` (docs/json.md).
std::string usage_to_json(const UsageReport& report);
std::string usage_to_csv(const UsageReport& report);
std::string journal_to_json(const JournalContents& contents);

// What sealing the local journal's files append-only did (GpuPool::seal_journal(), `gpulock
// journal seal`; docs/operations.md, "Sealing the journal").
struct JournalSealReport {
  std::string location;               // the journal directory
  bool supported = true;              // false: its file system has no append-only flag
  std::string unsupported_reason;     // why not, where unsupported
  std::vector<std::string> sealed;    // files sealed now
  std::vector<std::string> rotated;   // "usage-1000.log -> usage-1000-<time>-<id>.log"
  std::vector<std::string> problems;  // files left alone, or not sealed, and why
  unsigned already_sealed = 0;
};

// How many leases the journal saw start and end, for the metrics' counters
// (gpulock_leases_started_total, gpulock_leases_ended_total).
struct LeaseCounts {
  bool available = false;  // the journal could be read; else `problem` says why not
  std::string problem;
  std::map<std::string, std::uint64_t> started;                     // per user
  std::map<std::pair<std::string, LeaseEnd>, std::uint64_t> ended;  // per user and how
};

// Counts the leases of pair_journal_records() (available set).
LeaseCounts count_leases(const std::vector<UsageLease>& leases);

// Keeps lease counts up to date for a long-running reader (`gpulock serve`): each
// GpuPool::follow_lease_counts() reads only what the journal gained since the last one (the
// local journal; the Redis journal, a capped stream, is read whole each time and counted
// afresh, so those counts drop when the stream is trimmed). On the local journal its counts only
// grow. A start with no end whose lease is not held at two readings in a row counts as
// "holder_died" (nothing is written to the journal); an end read after that is not counted again.
class LeaseCountFollower {
 public:
  LeaseCountFollower();
  ~LeaseCountFollower();
  LeaseCountFollower(const LeaseCountFollower&) = delete;
  LeaseCountFollower& operator=(const LeaseCountFollower&) = delete;

  const LeaseCounts& counts() const;

  struct State;  // private to the library

 private:
  friend class GpuPool;
  std::unique_ptr<State> state_;
};

// "7d", "12h", "30m" (before now) or a date "2026-11-01" / "2026-11-01T08:00" (UTC) or
// Unix seconds. Throws Error(kInvalidArgument) with what was wrong.
double parse_time_bound(const std::string& text, double now);

}  // namespace gpulock
