// Planning the machine's queue from its files, and describing it to people (`gpulock queue`).
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <map>

#include <fmt/format.h>

#include "backend/device_fitness.h"
#include "local/local_backend.h"
#include "gpulock/error.hpp"
#include "process/process_identity.h"
#include "util/random_id.h"
#include "util/unix_time.h"

namespace gpulock {
namespace {

std::string clock_time(double seconds_since_epoch) {
  // A clock time rather than a duration: it stays true while the reader waits.
  const auto when = static_cast<std::time_t>(seconds_since_epoch);
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&when, &local);
  char text[32];
  std::strftime(text, sizeof text, now - when < 86400 ? "%H:%M:%S" : "%Y-%m-%d %H:%M", &local);
  return text;
}

std::string request_summary(const Ticket& t) {
  return fmt::format("{}'s {}-GPU request", t.user, t.needed);
}

}  // namespace

Ticket ticket_for_request(const LeaseRequest& request, std::size_t needed,
                          const std::string& user) {
  Ticket t;
  t.id = make_lease_id();
  t.uid = ::geteuid();
  t.user = user;
  t.process = self_process_id();
  t.enqueued_at = unix_seconds(std::chrono::system_clock::now());
  t.priority = request.priority;
  t.needed = static_cast<unsigned>(needed);
  t.named_gpus = !request.gpus.empty();
  t.min_free_memory_bytes = request.min_free_memory_bytes;
  t.max_utilization_percent = request.max_utilization_percent;
  t.max_power_watts = request.max_power_watts;
  t.allow_foreign_processes = request.allow_foreign_processes;
  t.label = request.label;
  t.command = request.command;
  return t;
}

PlanRequest plan_request_for(const Ticket& t, const Config& config) {
  PlanRequest r;
  r.seq = t.seq;
  r.uid = t.uid;
  r.priority = t.priority;
  r.needed = t.needed;
  r.named_gpus = t.named_gpus;
  r.entered_over_limit = t.entered_over_limit;
  r.candidates = t.candidates;
  r.limits = config.limits_for(t.user);
  return r;
}

QueueEntry QueueSnapshot::entry_at(std::size_t position, const Config& config) const {
  const Placement& placement = plan.order[position];
  const Ticket& t = tickets[placement.request];
  QueueEntry e;
  e.position = static_cast<int>(position) + 1;
  e.ticket_id = t.id;
  e.uid = t.uid;
  e.user = t.user;
  e.pid = t.process.pid;
  e.priority = t.priority;
  e.gpus_requested = t.needed;
  if (t.named_gpus) e.gpus_named = t.candidates;
  e.label = t.label;
  e.command = t.command;
  e.waiting_since = from_unix_seconds(t.enqueued_at);
  e.standing = placement.standing;
  if (placement.standing == QueueStanding::kWaiting) e.reserved_gpus = placement.gpus;
  e.blocked_by = blocked_by(placement.request, config);
  return e;
}

void check_enclosing_lease(const std::vector<std::string>& own, std::size_t candidates,
                           std::size_t needed, const std::string& lease_id) {
  if (candidates - own.size() >= needed) return;
  throw Error(ErrorCode::kUnsatisfiable,
              fmt::format("{} GPU{} requested, but GPU {} {} held by the lease this process runs "
                          "under ({}, GPULOCK_LEASE_ID), which cannot end while it waits; use "
                          "those GPUs, or run outside that lease",
                          needed, needed == 1 ? "" : "s", fmt::join(own, ", "),
                          own.size() == 1 ? "is" : "are", lease_id));
}

Error not_served(const QueueSnapshot& snapshot, std::size_t me, bool waited,
                 const std::vector<BlockingGpu>& blocking, const std::string& blocked_by) {
  const Placement& mine = snapshot.plan.of(me);
  std::string why =
      waited ? "no GPU became available within the timeout" : "the requested GPUs are not free now";
  if (mine.standing == QueueStanding::kOverGpuLimit ||
      mine.standing == QueueStanding::kOverWaitingLimit)
    why += ": " + blocked_by;
  for (const auto& b : blocking) why += "\n  GPU " + b.display_index + ": " + b.reason;
  if (waited)
    why += fmt::format("\n  (position {} of {} in the queue)", snapshot.plan.position_of[me] + 1,
                       snapshot.tickets.size());
  return Error(ErrorCode::kTimedOut, why);
}

std::map<std::string, std::string> unhealthy_candidates(
    const Ticket& t, const std::function<const Device*(const std::string&)>& device_of) {
  const LeaseRequest filters = health_filters_of(t);
  std::map<std::string, std::string> reasons;
  for (const auto& uuid : t.candidates) {
    const Device* device = device_of(uuid);
    if (device == nullptr) continue;
    std::string reason = unready_reason(*device, filters);
    if (!reason.empty()) reasons.emplace(uuid, std::move(reason));
  }
  return reasons;
}

LeaseRequest health_filters_of(const Ticket& t) {
  LeaseRequest r;
  r.min_free_memory_bytes = t.min_free_memory_bytes;
  r.max_utilization_percent = t.max_utilization_percent;
  r.max_power_watts = t.max_power_watts;
  r.allow_foreign_processes = t.allow_foreign_processes;
  return r;
}

std::string holder_summary(const HolderRecord& r) {
  std::string text =
      fmt::format("leased by {} since {} (lease {}", r.user, clock_time(r.started_at), r.lease_id);
  if (!r.label.empty()) text += ", '" + r.label + "'";
  return text + ")";
}

int QueueSnapshot::gpu_index(const std::string& uuid) const {
  for (std::size_t i = 0; i < gpus.size(); ++i)
    if (gpus[i].uuid == uuid) return static_cast<int>(i);
  return -1;
}

std::vector<BlockingGpu> QueueSnapshot::blocking(std::size_t ticket) const {
  std::vector<BlockingGpu> out;
  const Placement& placement = plan.of(ticket);
  for (const Obstacle& o : placement.obstacles) {
    const int g = gpu_index(o.uuid);
    BlockingGpu b{g >= 0 ? gpu_names[g] : o.uuid, o.uuid, ""};
    switch (o.kind) {
      case Obstacle::Kind::kHeld:
        b.reason = g >= 0 && probes[g].record           ? holder_summary(*probes[g].record)
                   : g >= 0 && !probes[g].error.empty() ? probes[g].error
                                                        : "leased (details unavailable)";
        break;
      case Obstacle::Kind::kReserved:
        b.reason = fmt::format("reserved for {} (position {})", request_summary(tickets[*o.by]),
                               plan.position_of[*o.by] + 1);
        break;
      case Obstacle::Kind::kGiven:
        b.reason = "being taken by " + request_summary(tickets[*o.by]);
        break;
      case Obstacle::Kind::kUnhealthy: {
        const auto& reasons = unhealthy_reasons[ticket];
        const auto it = reasons.find(o.uuid);
        b.reason = it != reasons.end() ? it->second : "fails this request's health filters";
        // The reason names the GPU itself ("GPU 1: 2 GiB free, ..."): keep only what follows.
        if (const auto colon = b.reason.find(": ");
            b.reason.starts_with("GPU ") && colon != std::string::npos)
          b.reason = b.reason.substr(colon + 2);
        break;
      }
      case Obstacle::Kind::kMissing:
        b.reason = "no longer present";
        break;
    }
    out.push_back(std::move(b));
  }
  return out;
}

std::string QueueSnapshot::blocked_by(std::size_t ticket, const Config& config) const {
  const Placement& placement = plan.of(ticket);
  const Ticket& t = tickets[ticket];
  const UserLimits limits = config.limits_for(t.user);
  switch (placement.standing) {
    case QueueStanding::kNext:
      return "its GPUs are free: being served";
    case QueueStanding::kOverGpuLimit: {
      std::size_t held = 0;
      for (const auto& gpu : gpus)
        if (gpu.held && gpu.holder_uid == t.uid) ++held;
      return fmt::format("{} holds {} GPU{}, and {} may hold at most {} at once", t.user, held,
                         held == 1 ? "" : "s", t.user, limits.max_gpus.value_or(0));
    }
    case QueueStanding::kOverWaitingLimit: {
      const unsigned most = limits.max_waiting.value_or(0);
      return fmt::format(
          "{} may have at most {} request{} in the queue; this one joins it when "
          "there is room",
          t.user, most, most == 1 ? "" : "s");
    }
    case QueueStanding::kWaiting:
      break;
  }
  std::string text;
  if (!placement.gpus.empty()) {
    std::string reserved;
    for (const auto& uuid : placement.gpus) {
      const int g = gpu_index(uuid);
      reserved += (reserved.empty() ? "" : ", ") + (g >= 0 ? gpu_names[g] : uuid);
    }
    text =
        fmt::format("GPU{} {} reserved for it; ", placement.gpus.size() == 1 ? "" : "s", reserved);
  }
  // GPUs that wait for the same thing (one lease holding several) share one phrase.
  std::vector<std::pair<std::string, std::vector<std::string>>> grouped;
  for (const auto& b : blocking(ticket)) {
    auto it = std::find_if(grouped.begin(), grouped.end(),
                           [&](const auto& group) { return group.first == b.reason; });
    if (it == grouped.end()) it = grouped.insert(grouped.end(), {b.reason, {}});
    it->second.push_back(b.display_index);
  }
  std::string reasons;
  for (const auto& [reason, names] : grouped) {
    if (!reasons.empty()) reasons += "; ";
    reasons +=
        fmt::format("GPU{} {}: {}", names.size() == 1 ? "" : "s", fmt::join(names, ", "), reason);
  }
  return text + (reasons.empty() ? "waiting for GPUs" : reasons);
}

bool QueueSnapshot::health_dependent() const {
  for (const auto& placement : plan.order)
    for (const auto& o : placement.obstacles)
      if (o.kind == Obstacle::Kind::kUnhealthy) return true;
  return false;
}

const std::string& GpuPool::Impl::user_of(uid_t uid) {
  std::lock_guard<std::mutex> lock(user_names_mutex_);
  auto it = user_names_.find(uid);
  if (it == user_names_.end()) it = user_names_.emplace(uid, user_name(uid)).first;
  return it->second;
}

QueueSnapshot GpuPool::Impl::plan(const std::vector<Device>& devices,
                                  const QueueDirectory::Listing& listing, const Ticket* newcomer,
                                  bool with_records) {
  QueueSnapshot snapshot;
  snapshot.tickets = listing.live;
  snapshot.warnings = listing.warnings;
  if (newcomer) {
    snapshot.tickets.push_back(*newcomer);
    snapshot.tickets.back().seq = listing.highest_seq + 1;
  }

  std::map<std::string, const Device*> by_uuid;
  for (const auto& d : devices) {
    by_uuid[d.uuid] = &d;
    PlannedGpu gpu{d.uuid, false, std::nullopt};
    LockProbe p = probe(d.uuid, with_records);
    gpu.held = p.locked || !p.error.empty();
    if (p.record) gpu.holder_uid = p.record->uid;
    snapshot.gpus.push_back(std::move(gpu));
    snapshot.probes.push_back(std::move(p));
    snapshot.gpu_names.push_back(d.display_index());
  }

  std::vector<PlanRequest> requests;
  for (auto& t : snapshot.tickets) {
    t.user = user_of(t.uid);  // the name this machine gives the ticket's owner
    PlanRequest r = plan_request_for(t, config);
    // A request that has not registered does not wait yet: the waiting limit is not its
    // concern until it must (acquire() decides then).
    if (newcomer && &t == &snapshot.tickets.back()) r.limits.max_waiting.reset();
    if (const auto it = listing.last_served.find(t.uid); it != listing.last_served.end())
      r.user_last_served = it->second;
    const auto& reasons =
        snapshot.unhealthy_reasons.emplace_back(unhealthy_candidates(t, [&](const std::string& u) {
          const auto it = by_uuid.find(u);
          return it == by_uuid.end() ? nullptr : it->second;
        }));
    for (const auto& [uuid, reason] : reasons) r.unhealthy.push_back(uuid);
    requests.push_back(std::move(r));
  }
  snapshot.plan = plan_queue(
      config.policy, snapshot.gpus, requests,
      [this](const std::string& a, const std::string& b) { return source->distance(a, b); });
  return snapshot;
}

QueueStatus GpuPool::Impl::queue_status(const std::vector<Device>* devices) {
  QueueStatus status;
  status.policy = queue_policy_name(config.policy);
  status.config_source = config.source;
  const QueueDirectory::Listing listing = list_queue(false);
  status.warnings = listing.warnings;
  // Nobody waits (the usual case): nothing to plan, so no device query or lock probes.
  if (listing.live.empty()) return status;
  const QueueSnapshot snapshot =
      plan(devices ? *devices : source->devices(), listing, nullptr, true);
  for (std::size_t position = 0; position < snapshot.plan.order.size(); ++position) {
    status.entries.push_back(snapshot.entry_at(position, config));
  }
  return status;
}

}  // namespace gpulock
