// Shared leases (a share of GPUs' memory) on the local backend: how a GPU stands for them (its
// free memory units and jobs, read from the locks), which GPUs could ever serve a request, and
// taking the byte-range OFD locks all-or-nothing under the machine-wide acquire mutex.
//
// A shared request waits in the same queue as exclusive ones (local_acquire.cc): its ticket
// carries the units it wants, and the planner (queue/schedule.h) serves, reserves and backfills
// by memory.
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "backend/device_fitness.h"
#include "backend/gpu_status.h"
#include "backend/lease_state.h"
#include "backend/process_holder_record.h"
#include "backend/request_checks.h"
#include "gpulock/error.hpp"
#include "gpulock/parse.hpp"
#include "local/fork_guard.h"
#include "local/gpu_lock_file.h"
#include "local/local_backend.h"
#include "local/local_lease_keeper.h"
#include "local/shared_leases.h"
#include "util/random_id.h"

namespace gpulock {

off_t shared_units_wanted(const LeaseRequest& request, off_t total_units) {
  if (request.memory_bytes) return units_for(*request.memory_bytes);
  return std::max<off_t>(1, total_units / static_cast<off_t>(*request.slots));
}

void LocalBackend::check_shared_request(const LeaseRequest& request) const {
  if (request.memory_bytes && *request.memory_bytes == 0)
    throw Error(ErrorCode::kInvalidArgument, "a shared lease's memory (--mem) must be more than 0");
  if (request.memory_bytes && *request.memory_bytes > kSharedMaxUnits * kSharedUnitBytes)
    throw Error(ErrorCode::kInvalidArgument,
                "a shared lease's memory (--mem) must be at most 2 TiB per GPU");
  if (request.slots && *request.slots == 0)
    throw Error(ErrorCode::kInvalidArgument, "slots (--slots) must be at least 1");
  if (request.slots && *request.slots > kMaxSharedUnits)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("slots (--slots) must be at most {}", kMaxSharedUnits));
}

std::vector<const Device*> LocalBackend::shared_candidates(
    const std::vector<Device>& devices, const LeaseRequest& request,
    std::vector<std::string>& never_reasons) const {
  // Devices that could serve it at all: also big enough for the share, once the reserve is
  // kept back.
  const auto too_small = [&](const Device& d) -> std::string {
    const off_t total = static_cast<off_t>(d.memory_total_bytes.value_or(0) / kSharedUnitBytes);
    const off_t reserve = config_.shared_memory_reserve_bytes == 0
                              ? 0
                              : units_for(config_.shared_memory_reserve_bytes);
    if (!d.memory_total_bytes)
      return fmt::format("GPU {}: its memory size is unknown", d.display_index());
    if (total > kSharedMaxUnits)
      return fmt::format("GPU {}: more memory than shared leases support (2 TiB)",
                         d.display_index());
    if (shared_units_wanted(request, total) > total - reserve)
      return fmt::format("GPU {}: {} of memory, {} of it kept in reserve", d.display_index(),
                         format_size(*d.memory_total_bytes),
                         format_size(config_.shared_memory_reserve_bytes));
    return "";
  };
  return candidate_devices(devices, request, config_, never_reasons, too_small);
}

LocalBackend::SharedRoom LocalBackend::shared_room(const Device& d) const {
  SharedRoom room;
  UniqueFd fd;
  try {
    fd = dir_.open_lock_file_for_reading(d.uuid);
  } catch (const Error&) {
    return room;  // an unusable lock file: status explains it
  }
  SharedUsage usage;
  std::uint64_t covered = 0;
  if (fd) {
    const LockMode mode = held_mode(fd.get());
    if (mode == LockMode::kExclusive) return room;
    if (mode == LockMode::kNone && is_locked_elsewhere(fd.get())) return room;  // an outsider
    usage = read_shared_usage(fd.get());
    // Memory the device reports for the shared leases' own processes is inside their
    // reservations, not outside them.
    bool any_process_memory = false;
    for (const GpuProcess& p : d.processes) any_process_memory |= p.used_memory_bytes.has_value();
    if (any_process_memory)
      for (const off_t slot : usage.slots)
        if (auto record = read_shared_record(fd.get(), slot, d.uuid))
          for (const GpuProcess& p : d.processes)
            if (p.used_memory_bytes && covered_by(p.pid, *record)) covered += *p.used_memory_bytes;
  }
  const SharedFit fit = shared_fit(d, usage, config_, covered);
  room.open = true;
  room.total_units = fit.total_units;
  room.free_units = fit.free_units();
  room.jobs = fit.jobs;
  return room;
}

std::optional<Lease> LocalBackend::try_shared_now(const std::vector<const Device*>& candidates,
                                                  const LeaseRequest& request) {
  const std::size_t needed = request.gpus.empty() ? request.count : request.gpus.size();
  std::optional<unsigned> cap = config_.max_jobs_per_gpu;
  if (request.slots) cap = cap ? std::min(*cap, *request.slots) : *request.slots;
  // Shared leases may share a GPU with processes outside gpulock: their memory is counted.
  LeaseRequest health = request;
  health.allow_foreign_processes = true;
  struct Fitting {
    const Device* device;
    off_t total_units;
    off_t free_units;
  };
  std::vector<Fitting> fitting;
  for (const Device* d : candidates) {
    if (!unready_reason(*d, health).empty()) continue;
    const SharedRoom room = shared_room(*d);
    if (!room.open || room.free_units < shared_units_wanted(request, room.total_units) ||
        (cap && room.jobs >= *cap))
      continue;
    fitting.push_back({d, room.total_units, room.free_units});
  }
  if (fitting.size() < needed) return std::nullopt;
  // Pack by default (the least free memory that fits first, so whole GPUs stay whole for
  // exclusive leases); spread with --spread. Ties in index order.
  std::stable_sort(fitting.begin(), fitting.end(), [&](const Fitting& a, const Fitting& b) {
    return request.spread ? a.free_units > b.free_units : a.free_units < b.free_units;
  });
  fitting.resize(needed);
  return try_lock_shared(
      fitting.size(),
      [&](std::size_t i) { return std::make_pair(fitting[i].device, fitting[i].total_units); },
      request);
}

std::optional<Lease> LocalBackend::try_lock_shared(
    std::size_t count, const std::function<std::pair<const Device*, off_t>(std::size_t)>& gpu,
    const LeaseRequest& request) {
  auto lease = std::make_unique<LeaseState>();
  std::vector<UniqueFd> fds;
  std::vector<off_t> offsets;
  std::vector<nlink_t> links;
  std::uint64_t reserved = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const auto [d, total_units] = gpu(i);
    const off_t wanted = shared_units_wanted(request, total_units);
    reserved = static_cast<std::uint64_t>(wanted) * kSharedUnitBytes;
    struct stat opened {};
    UniqueFd fd = dir_.open_lock_file(d->uuid, &opened);
    const std::optional<off_t> slot = lock_shared_units(fd.get(), total_units, wanted);
    if (!slot) return std::nullopt;  // taken outside gpulock's protocol meanwhile
    const std::optional<nlink_t> current = dir_.links_if_current(opened, d->uuid);
    if (!current) return std::nullopt;  // deleted or replaced meanwhile: the lock guards nothing
    fds.push_back(std::move(fd));
    links.push_back(*current);
    offsets.push_back(kSharedRecordBase + *slot * static_cast<off_t>(kHolderRecordSize));
    lease->gpus.push_back(LeasedGpu{d->index, d->display_index(), d->uuid, d->name,
                                    d->is_mig_instance(), d->memory_total_bytes.value_or(0)});
  }
  lease->keeper =
      std::make_unique<LocalLeaseKeeper>(std::move(fds), std::move(links), std::move(offsets));
  lease->id = make_lease_id();
  lease->started_at = std::chrono::system_clock::now();
  HolderRecord& record = lease->record;
  const uid_t uid = ::geteuid();
  record =
      process_holder_record(lease->id, uid, user_of(uid), host_name(), request, lease->started_at);
  record.memory_bytes = reserved;
  for (const auto& g : lease->gpus) record.gpus.push_back(g.uuid);
  lease->keeper->publish_record(record);
  return Lease(std::move(lease));
}

}  // namespace gpulock
