// PoolStatus: a snapshot of every GPU of the machine, who holds it and what runs on it.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gpulock/device.hpp"
#include "gpulock/queue.hpp"

namespace gpulock {

enum class GpuState {
  kFree,      // nobody holds it and no foreign process runs on it
  kLeased,    // a gpulock lease holds it
  kBusy,      // not leased, but compute processes of someone not using gpulock run on it
  kExcluded,  // not available to gpulock (MIG-enabled parent, compute mode prohibited, bad lock
              // file)
};
const char* gpu_state_name(GpuState state) noexcept;  // "free", "leased", "busy", "excluded"

struct HolderInfo {
  std::string lease_id;
  unsigned uid = 0;
  std::string user;
  std::string host;
  std::string kind;  // "process", "run", "detached"
  int pid = 0;       // the holding process
  bool holder_alive = false;
  std::vector<int> member_pids;  // command / --for-pid processes the lease covers
  // A detached lease held for a session (`gpulock acquire` without --for-pid): the session's id;
  // the lease covers every process of it.
  std::optional<int> session;
  std::string command;
  std::string label;
  std::chrono::system_clock::time_point started_at;
  std::vector<std::string> gpus;  // UUIDs of the whole lease
  // A shared lease: the memory it reserves on each of its GPUs; unset for an exclusive lease.
  std::optional<std::uint64_t> memory_bytes;
  // A shared lease, on the GPU shown: the memory its processes use there (as the driver reports
  // it), and whether that is more than it reserved (cooperative limits are not fences).
  std::uint64_t memory_used_bytes = 0;
  bool over_reservation = false;
};

// A GPU held by shared leases (several jobs by memory, `gpulock run --mem`).
struct SharedUse {
  unsigned jobs = 0;                 // shared leases holding it (kernel locks or Redis)
  std::uint64_t reserved_bytes = 0;  // what they reserve, in all
  std::uint64_t reserve_bytes = 0;   // kept back by the administrator (shared_memory_reserve)
  std::vector<HolderInfo> leases;    // the ones whose records are readable
};

struct ProcessOnGpu {
  unsigned pid = 0;
  std::optional<std::uint64_t> used_memory_bytes;
  std::string user;     // "" when the process cannot be seen (another container)
  bool foreign = true;  // not covered by the lease holding this GPU
};

struct GpuStatus {
  Device device;
  std::string host;  // the host the GPU is in
  GpuState state = GpuState::kFree;
  // For a leased GPU: who holds it. Unset while the details are unreadable (just being written,
  // or damaged): the lease itself is still real.
  std::optional<HolderInfo> holder;
  std::vector<ProcessOnGpu> processes;
  std::string note;  // why excluded, or a warning about the GPU
  // Held by shared leases: who, and how much memory they reserve.
  std::optional<SharedUse> shared;
  // A free GPU held back by the queue for a waiting multi-GPU request.
  std::optional<QueueEntry> reserved_for;
  // A leased GPU whose utilisation has read 0 % since `idle_since` without a break, as an
  // IdleTracker (gpulock/monitor.hpp) has seen it; `idle` once that is at least the config's
  // idle_after. Unset / false where no tracker looked, or the GPU is not leased.
  std::optional<std::chrono::system_clock::time_point> idle_since;
  bool idle = false;
};

struct PoolStatus {
  int schema_version = 1;
  std::string host;
  std::string device_source;  // DeviceSource::description()
  bool simulated = false;
  std::string lock_dir;          // local backend
  std::string backend = "file";  // "file" or "redis"
  std::string backend_location;  // Redis: the server's URL, password masked
  std::string pool;              // Redis: the pool's name
  // The pool holds the GPUs of many hosts, kept by a server that may be unreachable (Redis);
  // false for this machine's own lock files. Views and tools ask this, not `backend`.
  bool spans_hosts = false;
  std::chrono::system_clock::time_point taken_at;
  std::vector<GpuStatus> gpus;
  std::vector<std::string> warnings;
  int queue_length = 0;      // requests waiting in the machine's queue
  std::string queue_policy;  // "fair-share" or "fifo"
  // The config's idle_after, once an IdleTracker has marked idle GPUs; unset before.
  std::optional<std::chrono::seconds> idle_after;
};

}  // namespace gpulock
