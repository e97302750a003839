// A GPU's state as `gpulock status` shows it (backend/gpu_status.h).
#include "backend/gpu_status.h"

#include <algorithm>

#include <fmt/format.h>

#include "backend/device_fitness.h"
#include "process/process_identity.h"
#include "util/unix_time.h"

namespace gpulock {

HolderInfo holder_info(const HolderRecord& r, bool on_this_host) {
  HolderInfo info;
  info.lease_id = r.lease_id;
  info.uid = r.uid;
  info.user = r.user;
  info.host = r.host;
  info.kind = holder_kind_name(r.kind);
  info.pid = r.holder.pid;
  info.holder_alive = on_this_host && is_alive(r.holder);
  for (const auto& m : r.members) info.member_pids.push_back(m.pid);
  if (r.session > 0) info.session = r.session;
  info.command = r.command;
  info.label = r.label;
  info.started_at = from_unix_seconds(r.started_at);
  info.gpus = r.gpus;
  info.memory_bytes = r.memory_bytes;
  return info;
}

// A process is covered by a lease if it is the holder, a member, or a descendant of either, or
// a process of the session the lease is held for.
bool covered_by(unsigned pid, const HolderRecord& r) {
  if (is_same_or_descendant(static_cast<pid_t>(pid), r.holder)) return true;
  if (r.session > 0) {
    const auto stat = read_process_stat(static_cast<pid_t>(pid));
    if (stat && stat->session == r.session) return true;
  }
  return std::any_of(r.members.begin(), r.members.end(), [&](const ProcessId& m) {
    return is_same_or_descendant(static_cast<pid_t>(pid), m);
  });
}

GpuStatus gpu_status_of(Device device, const LockState& p, const Config& config, bool device_here,
                        bool holder_here) {
  GpuStatus gpu;
  if (device.mig_enabled.value_or(false)) {
    gpu.state = GpuState::kExcluded;
    gpu.note = "MIG enabled: its instances are leased one by one";
  } else if (device.compute_mode == ComputeMode::kProhibited) {
    gpu.state = GpuState::kExcluded;
    gpu.note = "compute mode 'prohibited'";
  } else if (!p.error.empty()) {
    gpu.state = GpuState::kExcluded;
    gpu.note = p.error;
  } else if (p.locked && p.shared) {
    gpu.state = GpuState::kLeased;
    SharedUse shared;
    shared.jobs = p.shared_jobs;
    shared.reserved_bytes = p.shared_reserved_bytes;
    shared.reserve_bytes = config.shared_memory_reserve_bytes;
    for (const auto& record : p.shared_records) {
      HolderInfo info = holder_info(record, holder_here);
      if (device_here && holder_here)
        for (const auto& process : device.processes)
          if (process.used_memory_bytes && covered_by(process.pid, record))
            info.memory_used_bytes += *process.used_memory_bytes;
      info.over_reservation = info.memory_used_bytes > record.memory_bytes.value_or(0);
      shared.leases.push_back(std::move(info));
    }
    const auto over = std::count_if(shared.leases.begin(), shared.leases.end(),
                                    [](const HolderInfo& h) { return h.over_reservation; });
    if (over > 0)
      gpu.note = fmt::format("{} shared lease{} using more memory than reserved", over,
                             over == 1 ? " is" : "s are");
    gpu.shared = std::move(shared);
  } else if (p.locked) {
    gpu.state = GpuState::kLeased;
    if (p.record) {
      gpu.holder = holder_info(*p.record, holder_here);
    } else {
      gpu.note = "lease details unavailable (being written, or damaged)";
    }
  } else if (!device.processes.empty()) {
    gpu.state = GpuState::kBusy;
  } else if (!device.processes_known) {
    gpu.state = GpuState::kBusy;  // as acquire sees it: not proven idle
    gpu.note = device_here ? "its processes cannot be listed (--allow-foreign accepts it)"
                           : "its processes are unknown (host readings missing)";
  }
  for (const auto& process : device.processes) {
    ProcessOnGpu shown;
    shown.pid = process.pid;
    shown.used_memory_bytes = process.used_memory_bytes;
    if (device_here) {
      if (const auto uid = process_uid(static_cast<pid_t>(process.pid)))
        shown.user = user_name(*uid);
      shown.foreign = !(p.locked && p.record && holder_here && covered_by(process.pid, *p.record));
      for (const auto& record : p.shared_records)
        if (holder_here && covered_by(process.pid, record)) shown.foreign = false;
    } else {
      // Another host's processes cannot be matched to leases from here.
      shown.foreign = !p.locked && p.error.empty();
    }
    gpu.processes.push_back(std::move(shown));
  }
  if (gpu.state == GpuState::kLeased && (gpu.holder || gpu.shared) &&
      std::any_of(gpu.processes.begin(), gpu.processes.end(),
                  [](const ProcessOnGpu& x) { return x.foreign; }))
    gpu.note = "processes outside the lease are using this GPU";
  if (excluded_by_config(device, config)) {
    gpu.state = GpuState::kExcluded;
    gpu.note = "excluded by the administrator (" + config.source + ")";
  }
  gpu.device = std::move(device);
  return gpu;
}

void mark_reservations(PoolStatus& status, const QueueStatus& queue) {
  for (const auto& entry : queue.entries)
    for (const auto& uuid : entry.reserved_gpus)
      for (auto& gpu : status.gpus)
        if (gpu.device.uuid == uuid && gpu.state == GpuState::kFree) gpu.reserved_for = entry;
}

}  // namespace gpulock
