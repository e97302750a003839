// Config: the administrator's settings for the queue, read from a TOML file.
//
// The file is /etc/gpulock/config.toml, or the path in GPULOCK_CONFIG. A missing default file
// means "no settings"; a file named by GPULOCK_CONFIG must exist. Every process of a machine
// must read the same file: each one orders the shared queue by it.
//
//   policy = "fair-share"          # or "fifo"
//   exclude_gpus = ["7", "GPU-1a2b3c4d", "NVIDIA T400"]   # index, UUID (or prefix), model name
//
//   [limits]
//   max_gpus_per_user = 4          # GPUs one user may hold at once
//   max_waiting_per_user = 100     # requests of one user that take part in the queue
//
//   [limits.users.alice]           # overrides for one user
//   max_gpus = 8
//   max_waiting = 200
//
//   # Shared leases (several jobs per GPU by memory, `gpulock run --mem 10G`):
//   max_jobs_per_gpu = 8           # shared leases on one GPU at once; unset = no cap
//   shared_memory_reserve = "2G"   # memory of every GPU never handed to shared leases
//
//   # The Redis backend (docs/redis.md); GPULOCK_BACKEND, GPULOCK_POOL, GPULOCK_LEASE_TTL and
//   # GPULOCK_REDIS_PASSWORD override these.
//   backend = "redis://gpulock@redis-host:6379/0"   # or "file" (the default)
//   pool = "lab"                   # the key prefix's name; default: the host name
//   lease_ttl = "30s"
//   redis_password_file = "/etc/gpulock/redis.password"
//
//   # Monitoring (docs/operations.md).
//   idle_after = "30m"             # a leased GPU at 0 % this long is reported idle
//   serve_show_commands = false    # `gpulock serve` shows full command lines over HTTP
//   # The local usage journal (docs/operations.md); GPULOCK_JOURNAL_DIR overrides it.
//   journal_dir = "/var/lib/gpulock/journal"   # or "off"
//   journal_file_size = "64M"                   # rotated past this size
//
//   # Jobs (gpulock submit, docs/jobs.md); GPULOCK_JOBS_DIR overrides jobs_dir.
//   jobs_dir = "/var/tmp/gpulock-jobs"  # the job store, shared by every user (mode 1777)
//   job_logs_readable = false           # every user may read a job's output (--readable-logs)
//   job_log_size = "1G"                 # each log (stdout, stderr) kept up to this; or "off"
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpulock {

enum class QueuePolicy {
  kFairShare,  // the user holding (and already queued for) the fewest GPUs goes first
  kFifo,       // strictly in order of arrival
};
const char* queue_policy_name(QueuePolicy policy) noexcept;  // "fair-share", "fifo"

struct UserLimits {
  std::optional<unsigned> max_gpus;     // GPUs held at once; unset = no limit
  std::optional<unsigned> max_waiting;  // waiting requests that take part in the queue
};

struct Config {
  QueuePolicy policy = QueuePolicy::kFairShare;
  UserLimits default_limits;                   // [limits] max_gpus_per_user, max_waiting_per_user
  std::map<std::string, UserLimits> per_user;  // [limits.users.NAME]
  std::vector<std::string> excluded_gpus;      // as written: index, UUID or prefix, model name
  std::string source;                          // the file read, or "" when none was (defaults)
  std::string backend;                         // "", "file" or a redis:// URL
  std::string pool;                            // the Redis pool's name; "" = default
  std::optional<std::chrono::milliseconds> lease_ttl;
  std::string redis_password_file;
  std::chrono::seconds idle_after{30 * 60};
  bool serve_show_commands = false;
  std::string journal_dir;  // the local usage journal's directory, "off", or "" = the default
  std::uint64_t journal_file_size = 64ull << 20;  // a journal file is rotated past this size
  std::optional<unsigned> max_jobs_per_gpu;       // shared leases per GPU; unset = no cap
  std::uint64_t shared_memory_reserve_bytes = 0;  // kept back from shared leases on each GPU
  std::string jobs_dir;            // the job store; "" = the default (default_jobs_directory)
  bool job_logs_readable = false;  // a job's logs readable by every user unless it says not
  std::uint64_t job_log_size = 1ull << 30;  // each log's cap in bytes; 0 = none ("off")

  // The limits that apply to `user`: their own entries, else the defaults, field by field.
  UserLimits limits_for(const std::string& user) const;
};

// Parses TOML text. `source_name` names the file in errors. Throws Error(kConfig) with
// "FILE:LINE: what is wrong" for malformed TOML, unknown keys, wrong types or bad values.
Config parse_config(std::string_view text, const std::string& source_name);

// GPULOCK_CONFIG if set (the file must exist), else /etc/gpulock/config.toml if it exists,
// else defaults (source ""). Symlinks are followed. Throws Error(kConfig) for an invalid file,
// and for one that cannot be read: named by GPULOCK_CONFIG but missing, a directory, a FIFO or
// another non-regular file (refused without blocking), unreadable, a symlink loop, over 1 MiB.
Config load_config();

// A lease TTL ("30s", "2m", "1.5s"): from 500 ms to 1 day. Throws Error(kInvalidArgument).
std::chrono::milliseconds parse_lease_ttl(std::string_view text);

// The path load_config() reads.
std::string config_path();

}  // namespace gpulock
