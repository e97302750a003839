// RedisPool's views (status, queue) and `gpulock release` of a lease by id.
#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "device_fitness.h"
#include "gpulock/error.hpp"
#include "process/process_identity.h"
#include "redis/redis_pool.h"
#include "redis/redis_scripts.h"
#include "util/random_id.h"
#include "util/strings.h"
#include "util/unix_time.h"

namespace gpulock {

GpuStatus RedisPool::describe(const Gpu& g, const Snapshot& snap) const {
  GpuStatus gpu;
  gpu.device = g.device;
  gpu.host = g.host;
  const HolderRecord* record = nullptr;
  if (const auto it = snap.leases.find(g.lock); it != snap.leases.end() && it->second.record)
    record = &*it->second.record;
  const bool holder_here = record && record->host == settings_.host;
  if (g.device.mig_enabled.value_or(false)) {
    gpu.state = GpuState::kExcluded;
    gpu.note = "MIG enabled: its instances are leased one by one";
  } else if (g.device.compute_mode == ComputeMode::kProhibited) {
    gpu.state = GpuState::kExcluded;
    gpu.note = "compute mode 'prohibited'";
  } else if (g.lock == "!garbage") {
    gpu.state = GpuState::kExcluded;
    gpu.note = "its lock key in Redis holds something that is not a lease (see gpulock doctor)";
  } else if (!g.lock.empty()) {
    gpu.state = GpuState::kLeased;
    if (record) {
      gpu.holder = holder_info(*record, holder_here);
      // On another host, a lease that is being renewed is alive.
      if (!holder_here) gpu.holder->holder_alive = snap.leases.at(g.lock).ttl_ms > 0;
    } else {
      gpu.note = "lease details unavailable (being written, or damaged)";
    }
  } else if (!g.device.processes.empty()) {
    gpu.state = GpuState::kBusy;
  } else if (!g.device.processes_known) {
    gpu.state = GpuState::kBusy;
    gpu.note = g.local ? "its processes cannot be listed (--allow-foreign accepts it)"
                       : "its processes are unknown (host readings missing)";
  }
  for (const auto& process : g.device.processes) {
    ProcessOnGpu shown;
    shown.pid = process.pid;
    shown.used_memory_bytes = process.used_memory_bytes;
    if (g.local) {
      if (const auto uid = process_uid(static_cast<pid_t>(process.pid)))
        shown.user = user_name(*uid);
      shown.foreign = !(record && holder_here && covered_by(process.pid, *record));
    } else {
      // Another host's processes cannot be matched to leases from here.
      shown.foreign = g.lock.empty();
    }
    gpu.processes.push_back(std::move(shown));
  }
  if (gpu.state == GpuState::kLeased && gpu.holder &&
      std::any_of(gpu.processes.begin(), gpu.processes.end(),
                  [](const ProcessOnGpu& x) { return x.foreign; }))
    gpu.note = "processes outside the lease are using this GPU";
  if (excluded_by_config(g.device, config_)) {
    gpu.state = GpuState::kExcluded;
    gpu.note = "excluded by the administrator (" + config_.source + ")";
  }
  return gpu;
}

PoolStatus RedisPool::status(bool whole_pool) {
  PoolStatus status;
  status.host = settings_.host;
  status.device_source = source_->description();
  status.simulated = source_->simulated();
  status.backend = "redis";
  status.backend_location = settings_.endpoint.display();
  status.pool = settings_.pool;
  status.taken_at = std::chrono::system_clock::now();
  RedisConnectionLoan connection(*connections_);
  std::vector<Device> local = register_devices(*connection);
  Snapshot snap = snapshot(*connection, whole_pool ? "" : settings_.host, local);
  if (std::none_of(snap.hosts.begin(), snap.hosts.end(),
                   [&](const HostEntry& h) { return h.name == settings_.host; })) {
    // Our registration is gone (the server restarted empty): register again.
    local = register_devices(*connection, /*force=*/true);
    snap = snapshot(*connection, whole_pool ? "" : settings_.host, local);
  }
  status.warnings = snap.warnings;
  for (const Gpu& g : snap.gpus) status.gpus.push_back(describe(g, snap));
  // The queue is the pool's, whichever hosts are shown.
  status.queue_length = static_cast<int>(snap.tickets.size());
  status.queue_policy = queue_policy_name(config_.policy);
  if (snap.tickets.empty()) return status;  // nothing reserved: no plan needed
  const QueueSnapshot q = plan(snap, nullptr);
  for (std::size_t position = 0; position < q.plan.order.size(); ++position) {
    const Placement& placement = q.plan.order[position];
    if (placement.standing != QueueStanding::kWaiting) continue;
    for (const auto& uuid : placement.gpus)
      for (auto& gpu : status.gpus)
        if (gpu.device.uuid == uuid && gpu.state == GpuState::kFree) {
          gpu.reserved_for = q.entry_at(position, config_);
          gpu.reserved_for->uid = snap.ticket_uids[placement.request];
        }
  }
  return status;
}

QueueStatus RedisPool::queue() {
  QueueStatus status;
  status.policy = queue_policy_name(config_.policy);
  status.config_source = config_.source;
  RedisConnectionLoan connection(*connections_);
  const Snapshot snap = snapshot(*connection, "", source_->devices());
  status.warnings = snap.warnings;
  if (snap.tickets.empty()) return status;
  const QueueSnapshot q = plan(snap, nullptr);
  for (std::size_t position = 0; position < q.plan.order.size(); ++position) {
    QueueEntry e = q.entry_at(position, config_);
    e.uid = snap.ticket_uids[q.plan.order[position].request];  // the uid its host gave it
    status.entries.push_back(std::move(e));
  }
  return status;
}

void RedisPool::release(const std::string& lease_id) {
  if (!is_lease_id(lease_id))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("'{}' is not a lease id (16 hex digits, as `gpulock status` shows)",
                            sanitize_for_display(lease_id, 40)));
  RedisConnectionLoan connection(*connections_);
  const RedisValue fields =
      connection->command({"HGET", settings_.prefix() + "lease:" + lease_id, "record"});
  if (fields.type != RedisValue::Type::kString)
    throw Error(ErrorCode::kNotFound, fmt::format("no lease {} in pool '{}' (it ended, or expired)",
                                                  lease_id, settings_.pool));
  const auto record = parse_holder_record(fields.text);
  const std::string me = user_name(::geteuid());
  if (!record && ::geteuid() != 0)
    throw Error(ErrorCode::kPermissionDenied,
                fmt::format("lease {} has an unreadable record, so its owner is unknown; only "
                            "root may release it",
                            lease_id));
  if (record && record->user != me && ::geteuid() != 0)
    throw Error(ErrorCode::kPermissionDenied,
                fmt::format("lease {} belongs to {}; only they or root may release it", lease_id,
                            sanitize_for_display(record->user, 64)));
  const bool here = record && record->host == settings_.host;
  if (here && record->kind != HolderKind::kDetached && is_alive(record->holder))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("lease {} is held by running process {} ({}); stop that process to "
                            "end it",
                            lease_id, record->holder.pid, holder_kind_name(record->kind)));
  // Compare-and-delete, and a mark that tells the holder's renewals the lease ended.
  connection->run(redis_scripts::kRelease, {settings_.version_key()}, {lease_id});
  if (here && record->kind == HolderKind::kDetached && is_alive(record->holder))
    ::kill(record->holder.pid, SIGTERM);
}

}  // namespace gpulock
