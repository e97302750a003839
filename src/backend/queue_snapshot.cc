// A planned queue's explanations for people (backend/queue_snapshot.h).
#include "backend/queue_snapshot.h"

#include <algorithm>
#include <ctime>

#include <fmt/format.h>

#include "backend/shared_memory_units.h"
#include "gpulock/parse.hpp"
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
  if (t.shared()) return fmt::format("{}'s shared request", t.user);
  return fmt::format("{}'s {}-GPU request", t.user, t.needed);
}

}  // namespace

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
  const bool shared = snapshot.tickets[me].shared();
  std::string why = waited   ? shared ? "no GPU memory became available within the timeout"
                                      : "no GPU became available within the timeout"
                    : shared ? "the requested GPU memory is not free now"
                             : "the requested GPUs are not free now";
  if (mine.standing == QueueStanding::kOverGpuLimit ||
      mine.standing == QueueStanding::kOverWaitingLimit)
    why += ": " + blocked_by;
  for (const auto& b : blocking) why += "\n  GPU " + b.display_index + ": " + b.reason;
  if (waited)
    why += fmt::format("\n  (position {} of {} in the queue)", snapshot.position(me) + 1,
                       snapshot.length());
  return Error(ErrorCode::kTimedOut, why);
}

namespace {

// Whom a detached lease (`gpulock acquire`) is held for: a session, or one process
// (--for-pid); both 0 for other leases.
struct HeldFor {
  int session = 0;
  int pid = 0;
};
HeldFor held_for(const HolderRecord& r) {
  if (r.kind != HolderKind::kDetached) return {};
  if (r.session > 0) return {r.session, 0};
  return {0, r.members.empty() ? 0 : r.members.front().pid};
}

}  // namespace

std::string holder_summary(const HolderRecord& r) {
  std::string text =
      fmt::format("leased by {} since {} (lease {}", r.user, clock_time(r.started_at), r.lease_id);
  if (!r.label.empty()) text += ", '" + r.label + "'";
  const HeldFor held = held_for(r);
  if (held.session > 0) text += fmt::format(", held for session {}", held.session);
  if (held.pid > 0) text += fmt::format(", held until pid {} exits", held.pid);
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
        b.reason = g >= 0 && locks[g].shared
                       ? fmt::format("in shared use by {} lease{}", locks[g].shared_jobs,
                                     locks[g].shared_jobs == 1 ? "" : "s")
                   : g >= 0 && locks[g].record         ? holder_summary(*locks[g].record)
                   : g >= 0 && !locks[g].error.empty() ? locks[g].error
                                                       : "leased (details unavailable)";
        if (g >= 0 && !locks[g].shared && locks[g].record) {
          const HeldFor held = held_for(*locks[g].record);
          b.held_for_session = held.session;
          b.held_for_pid = held.pid;
        }
        break;
      case Obstacle::Kind::kReserved:
        b.reason = fmt::format("reserved for {} (position {})", request_summary(tickets[*o.by]),
                               position(*o.by) + 1);
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
      case Obstacle::Kind::kFull:
        b.reason = g < 0 || gpus[g].total_units == 0
                       ? "not enough free memory"
                       : fmt::format("not enough free memory: {} free for shared leases, {} wanted",
                                     format_size(gpus[g].free_units * kSharedMemoryUnitBytes),
                                     format_size(o.wanted_units * kSharedMemoryUnitBytes));
        if (g >= 0 && gpus[g].shared_jobs > 0)
          b.reason += fmt::format(" ({} shared lease{} on it)", gpus[g].shared_jobs,
                                  gpus[g].shared_jobs == 1 ? "" : "s");
        break;
      case Obstacle::Kind::kJobCap:
        b.reason = fmt::format(
            "as many shared leases as allowed ({}: the request's --slots or the "
            "config's cap)",
            g >= 0 ? gpus[g].shared_jobs : 0);
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
  if (!placement.held_back.empty()) {
    std::vector<std::string> names;
    for (const auto& uuid : placement.held_back) {
      const int g = gpu_index(uuid);
      names.push_back(g >= 0 ? gpu_names[g] : uuid);
    }
    text += fmt::format("no new shared lease starts on GPU{} {} for it; ",
                        names.size() == 1 ? "" : "s", fmt::join(names, ", "));
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
  if (unhealthy_beyond_head) return true;
  for (const auto& placement : plan.order)
    for (const auto& o : placement.obstacles)
      if (o.kind == Obstacle::Kind::kUnhealthy) return true;
  return false;
}

}  // namespace gpulock
