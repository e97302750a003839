// Lease: exclusive use of one or more GPUs, held until it is released or destroyed.
//
// It is move-only; destroying it releases the GPUs. On the local (file) backend a Lease owns
// kernel locks on the GPUs' lock files: processes started with the lease's descriptors (see
// lock_fds() and run_command()) share the locks, and the GPUs stay leased until every process
// holding them has exited, however it exits, SIGKILL included. On the Redis backend the lease
// lives in Redis with a TTL that a thread of this process renews; it ends when this process
// releases it or stops renewing it (it exits, or loses its host), after at most the TTL.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sys/types.h>

#include "gpulock/usage.hpp"

namespace gpulock {

struct LeaseState;  // the library's own (src/backend/lease_state.h)

// True if `text` is a lease id: 16 lowercase hex digits, as GPULOCK_LEASE_ID holds.
bool is_lease_id(std::string_view text);

struct LeasedGpu {
  unsigned index = 0;
  std::string display_index;  // "0", or "0:1" for a MIG instance
  std::string uuid;
  std::string name;
  bool is_mig_instance = false;
  std::uint64_t memory_total_bytes = 0;  // shared leases: the GPU's memory (0 when unknown)
};

// How CUDA_VISIBLE_DEVICES names the GPUs: NVML indices (with CUDA_DEVICE_ORDER=PCI_BUS_ID so
// CUDA numbers them the same way), or UUIDs. MIG instances are always named by UUID, the only
// form CUDA accepts for them.
enum class VisibleFormat { kIndex, kUuid };

class Lease {
 public:
  Lease();  // an empty, already-released lease
  Lease(Lease&&) noexcept;
  Lease& operator=(Lease&&) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();

  bool active() const;
  const std::string& id() const;
  const std::vector<LeasedGpu>& gpus() const;
  std::chrono::system_clock::time_point started_at() const;

  // A shared lease: the memory it reserves on each of its GPUs (the request rounded up to 256
  // MiB units); 0 for an exclusive lease.
  std::uint64_t memory_bytes() const;
  // The value for CUDA_VISIBLE_DEVICES.
  std::string cuda_visible_devices(VisibleFormat format = VisibleFormat::kIndex) const;
  // Comma-separated UUIDs (GPULOCK_GPUS).
  std::string uuid_list() const;

  // The descriptors that hold the locks; a child process that inherits them keeps the lease.
  // Empty on the Redis backend.
  std::span<const int> lock_fds() const;

  // Redis backend: the lease's fencing token, strictly increasing per pool (0 on the local
  // backend); the host whose GPUs these are (a lease on another host is a reservation).
  std::uint64_t fencing_token() const;
  const std::string& host() const;
  // Redis backend: true once the lease expired before it could be renewed, or was taken over;
  // a lost lease stays lost. Always false on the local backend (kernel locks cannot be lost).
  bool lost() const;
  // Confirms with the backend, in one round trip, that the lease still holds every one of its
  // GPUs, and returns its fencing token: for a job about to make a write that must not come
  // from a lease that was lost meanwhile. On the local backend the kernel holds the lease, so it
  // asks nothing and returns 0. Throws Error(kNotFound) when the lease is lost (lost() is then
  // true), kEnvironment when Redis cannot be asked (the lease may still hold), kInvalidArgument
  // for a released Lease.
  std::uint64_t verify();
  // Called, from a background thread, when the lease is lost; without it a warning is printed.
  void on_lost(std::function<void(const std::string& reason)> callback);

  // Records that the lease now also covers this process and its descendants, and how it is held,
  // for `gpulock status`. `kind` is "process", "run" or "detached".
  // With `member` (> 0), the lease also covers that process; with `session` (> 0), every process
  // of that session (a detached lease held for it); both in the same single update.
  void set_holder(pid_t holder_pid, const std::string& kind, pid_t member = 0, pid_t session = 0);
  void add_member(pid_t pid);
  // Records how the command run under the lease ended, for the usage journal's end record
  // (written when the lease is released). run_command() records it; a caller that stopped the
  // command for a reason of its own (a time limit, a cancel) records that afterwards.
  void set_outcome(const CommandOutcome& outcome);
  std::optional<CommandOutcome> outcome() const;

  // Releases the GPUs now (for this process: children holding the descriptors keep them).
  void release();

  // Made by the library's backends, which alone can fill in a LeaseState.
  explicit Lease(std::unique_ptr<LeaseState> state);

 private:
  // Hands the lease's keeper to a detached holder across a fork (detach_lease() in run.hpp).
  friend class DetachedHolder;
  // Records the lease's start in the usage journal.
  friend class GpuPool;

  // What the lease is, and its backend's keeper; null once released.
  std::unique_ptr<LeaseState> state_;
};

}  // namespace gpulock
