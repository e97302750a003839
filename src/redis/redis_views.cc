// RedisBackend's views (status, queue) and `gpulock release` of a lease by id.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "backend/device_fitness.h"
#include "backend/gpu_status.h"
#include "backend/release_checks.h"
#include "backend/shared_memory_units.h"
#include "gpulock/error.hpp"
#include "process/process_identity.h"
#include "redis/redis_backend.h"
#include "redis/redis_scripts.h"
#include "util/random_id.h"
#include "util/strings.h"
#include "util/unix_time.h"

namespace gpulock {

LockState RedisBackend::lock_state_of(const Gpu& g, const Snapshot& snap) const {
  LockState lock;
  if (const std::string unusable = g.unusable_reason(); !unusable.empty()) {
    lock.error = unusable;
  } else if (g.shared()) {
    lock.locked = true;
    lock.shared = true;
    for (const Share& share : g.shares) {
      ++lock.shared_jobs;
      lock.shared_reserved_bytes += share.units * kSharedMemoryUnitBytes;
      if (const auto it = snap.leases.find(share.lease_id);
          it != snap.leases.end() && it->second.record)
        lock.shared_records.push_back(*it->second.record);
    }
  } else if (!g.lock.empty()) {
    lock.locked = true;
    if (const auto it = snap.leases.find(g.lock); it != snap.leases.end())
      lock.record = it->second.record;
  }
  return lock;
}

GpuStatus RedisBackend::describe(const Gpu& g, const Snapshot& snap) const {
  const LockState lock = lock_state_of(g, snap);
  bool holder_here = lock.record && lock.record->host == settings_.host;
  // Shared leases may be held from several hosts: their processes are checked here for those
  // of this host, and the others' are put right below.
  if (lock.shared)
    holder_here = std::any_of(lock.shared_records.begin(), lock.shared_records.end(),
                              [&](const HolderRecord& r) { return r.host == settings_.host; });
  GpuStatus gpu = gpu_status_of(g.device, lock, config_, g.local, holder_here);
  gpu.host = g.host;
  // On another host, a lease that is being renewed is alive.
  const auto renewed = [&](const std::string& id) {
    const auto it = snap.leases.find(id);
    return it != snap.leases.end() && it->second.ttl_ms > 0;
  };
  if (gpu.holder && !holder_here) gpu.holder->holder_alive = renewed(g.lock);
  if (gpu.shared)
    for (HolderInfo& h : gpu.shared->leases)
      if (h.host != settings_.host) {
        // Its pids mean nothing here: alive while renewed, its memory use unknown from here.
        h.holder_alive = renewed(h.lease_id);
        h.memory_used_bytes = 0;
        h.over_reservation = false;
      }
  return gpu;
}

const std::filesystem::path& RedisBackend::lock_dir() const {
  static const std::filesystem::path none;
  return none;
}

PoolStatus RedisBackend::status(bool whole_pool) {
  PoolStatus status;
  status.host = settings_.host;
  status.device_source = source_->description();
  status.simulated = source_->simulated();
  status.backend = "redis";
  status.spans_hosts = spans_hosts();
  status.backend_location = settings_.endpoint.display();
  status.pool = settings_.pool;
  status.taken_at = std::chrono::system_clock::now();
  RedisConnectionLoan connection(*connections_);
  std::vector<Device> local = register_devices(*connection);
  const std::vector<std::string> scope;  // empty: every host
  const Snapshot snap =
      registered_snapshot(*connection, whole_pool ? scope : std::vector{settings_.host}, "", local);
  status.warnings = snap.warnings;
  // The snapshot also lists the hosts queued tickets may use: show only what was asked for.
  status.gpus.reserve(snap.gpus.size());  // 800 of ~1 KiB each, for a pool of 100 hosts × 8
  for (const Gpu& g : snap.gpus)
    if (whole_pool || g.host == settings_.host) status.gpus.push_back(describe(g, snap));
  // The queue is the pool's, whichever hosts are shown.
  status.queue_length = static_cast<int>(snap.tickets.size());
  status.queue_policy = queue_policy_name(config_.policy);
  if (!snap.tickets.empty()) mark_reservations(status, queue_of(snap));
  return status;
}

QueueStatus RedisBackend::queue() {
  RedisConnectionLoan connection(*connections_);
  // The tickets' hosts are enough to plan the queue.
  return queue_of(snapshot(*connection, {settings_.host}, "", source_->devices()));
}

QueueStatus RedisBackend::queue_of(const Snapshot& snap) {
  QueueStatus status;
  status.policy = queue_policy_name(config_.policy);
  status.config_source = config_.source;
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

void RedisBackend::release(const std::string& lease_id, bool also_run) {
  check_lease_id(lease_id);
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
  if (record && record->user != me && ::geteuid() != 0) throw not_the_owner(lease_id, *record);
  const bool here = record && record->host == settings_.host;
  if (here && also_run && record->kind == HolderKind::kRun && is_alive(record->holder)) {
    // `gpulock run` passes the signal on and ends the lease once its command has exited.
    if (::kill(record->holder.pid, SIGTERM) != 0)
      throw Error(errno == EPERM ? ErrorCode::kPermissionDenied : ErrorCode::kInternal,
                  fmt::format("cannot stop the holder of lease {} (pid {}): {}", lease_id,
                              record->holder.pid, std::strerror(errno)));
    return;
  }
  if (here && record->kind != HolderKind::kDetached && is_alive(record->holder))
    throw held_by_a_running_process(lease_id, *record);
  // Compare-and-delete, and a mark that tells the holder's renewals the lease ended.
  connection->run(redis_scripts::kRelease, {settings_.version_key()}, {lease_id});
  if (here && record->kind == HolderKind::kDetached && is_alive(record->holder))
    ::kill(record->holder.pid, SIGTERM);
}

}  // namespace gpulock
