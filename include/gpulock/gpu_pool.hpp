// GpuPool: the GPUs of this machine and the leases on them. The entry point of the library.
//
//   auto pool = gpulock::GpuPool::open();          // devices and lock directory from the env
//   gpulock::LeaseRequest request;
//   request.count = 2;
//   gpulock::Lease lease = pool.acquire(request);  // waits until two GPUs are free
//   setenv("CUDA_VISIBLE_DEVICES", lease.cuda_visible_devices().c_str(), 1);
//
// Thread-safe: one pool may serve several threads.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpulock/config.hpp"
#include "gpulock/device_source.hpp"
#include "gpulock/doctor.hpp"
#include "gpulock/lease.hpp"
#include "gpulock/request.hpp"
#include "gpulock/status.hpp"
#include "gpulock/usage.hpp"

namespace gpulock {

class LeaseBackend;  // the library's own (src/backend/lease_backend.h)

struct PoolOptions {
  // Where the lock files live; default_lock_directory() when unset (GPULOCK_DIR, then
  // /run/lock/gpulock, then /var/tmp/gpulock).
  std::optional<std::filesystem::path> lock_dir;
  // While a wait depends on GPU health (free memory, utilisation, power, foreign processes),
  // which no event announces, readings are refreshed this often. Releases of leases wake
  // waiters at once and do not depend on it.
  std::chrono::milliseconds health_recheck_interval{2000};
  // A safety re-check while waiting on leases only, in case an event was missed. Only the
  // queue's dispatcher (its oldest waiter) uses it; the others re-check 60 times less often.
  std::chrono::milliseconds safety_recheck_interval{10000};
  // Local backend: how long the backup dispatchers (the second and third oldest waiters) leave
  // a release or a departure to the oldest waiter before they act on it themselves. Shorter
  // hands a GPU on sooner while the oldest waiter is stopped (Ctrl-Z), at the cost of more
  // plans per release; the oldest waiter, and one told that it is the oldest now, act at once.
  // Never past a request's deadline; 0 to 24 h (outside, the nearest end).
  std::chrono::milliseconds backup_dispatcher_delay{20};
  // The administrator's settings; load_config() (GPULOCK_CONFIG or /etc/gpulock/config.toml)
  // when unset.
  std::optional<Config> config;

  // The backend: "file" (lock files on this machine, the default) or a Redis URL
  // "redis://[user:password@]host:port/db". Unset: GPULOCK_BACKEND, then the config's `backend`.
  std::optional<std::string> backend;
  // Redis backend: the pool's name (the key prefix gpulock:{NAME}:); unset: GPULOCK_POOL, then
  // the config's `pool`, then the host name.
  std::optional<std::string> pool_name;
  // Redis backend: the name this machine's GPUs are registered under; unset: GPULOCK_HOST, then
  // the host name.
  std::optional<std::string> host_name;
  // Redis backend: the lease TTL; unset: GPULOCK_LEASE_TTL, then the config's `lease_ttl`, 30 s.
  std::optional<std::chrono::milliseconds> lease_ttl;
};

class GpuPool {
 public:
  // Devices from open_device_source() and options from the environment.
  static GpuPool open(PoolOptions options = {});
  GpuPool(std::unique_ptr<DeviceSource> devices, PoolOptions options = {});
  GpuPool(GpuPool&&) noexcept;
  GpuPool& operator=(GpuPool&&) noexcept;
  ~GpuPool();

  // Leases GPUs as the request asks, waiting as it allows. Throws Error: kInvalidArgument for a
  // malformed request, kUnsatisfiable if it can never be served (more GPUs than exist, an unknown
  // GPU), kTimedOut if not served in time (or at once with wait = false), kInterrupted if
  // hooks.interrupted() asked to stop.
  Lease acquire(const LeaseRequest& request, const WaitHooks& hooks = {});

  // Every device of this machine with its state, holder and processes, and the queue's length.
  // Takes no lock.
  PoolStatus status();
  // The same for every host of the pool (Redis backend; the local backend has one host).
  PoolStatus pool_status();
  // Checks of the set-up: the backend's connection, permissions, and what it holds.
  std::vector<DoctorCheck> doctor();
  // "file" or "redis".
  std::string backend_name() const;
  // Whether the pool holds many hosts' GPUs behind a server (Redis), not only this machine's.
  bool spans_hosts() const;

  // The waiting requests in serving order, with what each waits for. Takes no lock.
  QueueStatus queue();
  const Config& config() const;

  // A fresh device inventory.
  std::vector<Device> devices();

  // Ends a detached lease (`gpulock acquire`) by stopping its holder. Only the user who took it,
  // or root, may. Throws kNotFound, kPermissionDenied, or kInvalidArgument for a lease that is
  // held by a running process or command (stop that instead).
  void release(const std::string& lease_id);
  // As release(), and also a lease of `gpulock run` on this host (`gpulock cancel LEASE_ID`):
  // `gpulock run` passes SIGTERM on to its command, and the lease ends when that has exited.
  // The file backend waits up to 10 s for the lease to end (kInternal if it has not by then);
  // the Redis backend returns once the signal is sent.
  void stop_lease(const std::string& lease_id);
  // The ids of the leases holding these GPUs of this host (named as LeaseRequest::gpus names
  // them: "0", "0:1", a UUID or a unique prefix), each once, in the order named: for
  // `gpulock release --gpus`. Throws kUnsatisfiable for an unknown GPU, kInvalidArgument for an
  // ambiguous or repeated name or a GPU held by shared leases, kNotFound for one not leased.
  std::vector<std::string> leases_holding(const std::vector<std::string>& gpus);

  // Local backend: creates the lock file of every GPU now, and when run as root makes the directory
  // and all lock files root-owned, so that no user can delete another's lock file (which would let
  // a second job lease a held GPU). Meant for boot time: `gpulock init`.
  void prepare();

  // The usage journal's records (docs/operations.md). A start without an end whose lease no
  // longer holds its GPUs gets an inferred "holder_died" end, which is written to the journal
  // too. Throws kEnvironment where the backend cannot be asked (Redis unreachable).
  JournalContents journal();
  // GPU-hours, leases and waits per group in [since, until) (seconds since the Unix epoch).
  UsageReport usage(double since, double until, UsageGrouping grouping);
  // Lease starts and ends per user in the whole journal (read as journal() does). Never throws:
  // a journal that cannot be read gives counts with available unset and the problem.
  LeaseCounts lease_counts();
  // Brings `follower` up to date with what the journal gained since its last reading (see
  // LeaseCountFollower); never throws. Returns its counts.
  const LeaseCounts& follow_lease_counts(LeaseCountFollower& follower);
  // Local backend, as root: seals the usage journal's files append-only and rotates those past
  // journal_file_size (`gpulock journal seal`, from a timer). Throws Error(kPermissionDenied)
  // when not root, Error(kEnvironment) when the journal is off, absent, or on Redis.
  JournalSealReport seal_journal();
  // Where the usage journal is kept, for people; "off" when it is turned off.
  std::string journal_location() const;

  DeviceSource& device_source();
  const std::filesystem::path& lock_dir() const;  // empty on the Redis backend
  // Notes about a doubtful set-up (e.g. the lock directory's mode), for the CLI to print.
  std::vector<std::string> warnings() const;

 private:
  std::unique_ptr<LeaseBackend> backend_;  // where the leases are kept: lock files or Redis
};

}  // namespace gpulock
