// The local backend's queue: planning it from the queue directory and the lock files, and
// describing it to people (`gpulock queue`).
#include <algorithm>
#include <map>
#include <optional>

#include "backend/queue_request.h"
#include "local/gpu_lock_file.h"
#include "local/local_backend.h"
#include "process/process_identity.h"

namespace gpulock {

const std::string& LocalBackend::user_of(uid_t uid) {
  std::lock_guard<std::mutex> lock(user_names_mutex_);
  auto it = user_names_.find(uid);
  if (it == user_names_.end()) it = user_names_.emplace(uid, user_name(uid)).first;
  return it->second;
}

QueueSnapshot LocalBackend::plan(const std::vector<Device>& devices,
                                 QueueDirectory::Listing& listing, const Ticket* newcomer,
                                 const Ticket* own, bool with_records,
                                 std::vector<IndexEntry>* gone) {
  QueueSnapshot snapshot;
  snapshot.tickets = std::move(listing.live);
  listing.live.clear();
  snapshot.warnings = listing.warnings;
  if (newcomer) {
    snapshot.tickets.push_back(*newcomer);
    snapshot.tickets.back().seq = listing.highest_seq + 1;
  }

  // GPUs are read for shared requests (free memory units, shared jobs) only when one takes part.
  bool any_shared = false;
  for (const Ticket& t : snapshot.tickets) any_shared |= t.shared();
  any_shared |= own && own->shared();

  std::map<std::string, const Device*> by_uuid;
  for (const auto& d : devices) {
    by_uuid[d.uuid] = &d;
    PlannedGpu gpu{d.uuid, false, std::nullopt};
    LockState p = probe(d.uuid, with_records);
    gpu.held = p.locked || !p.error.empty();
    if (any_shared && p.error.empty() && (!p.locked || p.shared)) {
      const SharedRoom room = shared_room(d);
      gpu.shared_use = p.locked && room.open;
      if (room.open) {
        gpu.total_units = static_cast<std::uint32_t>(room.total_units);
        gpu.free_units = static_cast<std::uint32_t>(room.free_units);
        gpu.shared_jobs = room.jobs;
      }
    }
    if (p.record) gpu.holder_uid = p.record->uid;
    if (d.memory_total_bytes && *d.memory_total_bytes > 0)
      for (const auto& record : p.shared_records)
        gpu.shared_by.emplace_back(
            record.uid, record.memory_bytes.value_or(0) * kShareScale / *d.memory_total_bytes);
    snapshot.gpus.push_back(std::move(gpu));
    snapshot.locks.push_back(std::move(p));
    snapshot.gpu_names.push_back(d.display_index());
  }
  const auto device_of = [&](const std::string& u) -> const Device* {
    const auto it = by_uuid.find(u);
    return it == by_uuid.end() ? nullptr : it->second;
  };

  std::vector<PlanRequest> requests;
  requests.reserve(snapshot.tickets.size());
  snapshot.unhealthy_reasons.resize(snapshot.tickets.size());
  // A queue of thousands is mostly one user's: look the name and limits up once per user.
  std::optional<uid_t> last_uid;
  std::string last_user;
  UserLimits last_limits;
  std::int64_t last_served_at = 0;
  const std::size_t tickets = snapshot.tickets.size(), listed = listing.index.size();
  for (std::size_t i = 0; i < tickets; ++i) {
    Ticket& t = snapshot.tickets[i];
    // Tickets listed from the index carry only what orders the queue, except our own.
    const bool from_index = i < listed;
    const bool is_own = from_index && own && t.id == own->id;
    if (is_own) t = *own;
    if (last_uid != t.uid) {
      last_uid = t.uid;
      last_user = user_of(t.uid);  // the name this machine gives the ticket's owner
      last_limits = config_.limits_for(last_user);
      const auto it = listing.last_served.find(t.uid);
      last_served_at = it == listing.last_served.end() ? 0 : it->second;
    }
    t.user = last_user;
    PlanRequest& r = requests.emplace_back();  // in place: `requests` has room for every ticket
    fill_plan_request(t, last_limits, r);
    if (t.shared_slots > 0) r.job_cap = t.shared_slots;
    if (config_.max_jobs_per_gpu)
      r.job_cap =
          r.job_cap ? std::min(*r.job_cap, *config_.max_jobs_per_gpu) : *config_.max_jobs_per_gpu;
    r.details_pending = from_index && !is_own;
    // A request that has not registered does not wait yet: the waiting limit is not its
    // concern until it must (acquire() decides then).
    if (newcomer && i + 1 == tickets) r.limits.max_waiting.reset();
    r.user_last_served = last_served_at;
    if (!r.details_pending) {
      snapshot.unhealthy_reasons[i] = unhealthy_candidates(t, device_of);
      for (const auto& [uuid, reason] : snapshot.unhealthy_reasons[i]) r.unhealthy.push_back(uuid);
    }
  }
  // A ticket's details, read when the plan reaches it; a waiter found gone is reported.
  const auto load = [&](std::size_t i, PlanRequest& r) {
    QueueDirectory* queue = queue_dir(false);
    std::optional<Ticket> full = queue ? queue->read_ticket(listing.index[i]) : std::nullopt;
    if (!full) {
      if (gone) gone->push_back(listing.index[i]);
      return false;
    }
    Ticket& t = snapshot.tickets[i];
    const std::string user = t.user;
    t = std::move(*full);
    t.user = user;
    r.candidates = t.candidates;
    r.spread = t.spread;
    snapshot.unhealthy_reasons[i] = unhealthy_candidates(t, device_of);
    for (const auto& [uuid, reason] : snapshot.unhealthy_reasons[i]) r.unhealthy.push_back(uuid);
    return true;
  };
  snapshot.plan = plan_queue(
      config_.policy, snapshot.gpus, requests,
      [this](const std::string& a, const std::string& b) { return source_->distance(a, b); }, load);
  return snapshot;
}

QueueStatus LocalBackend::queue_status(const std::vector<Device>* devices) {
  QueueStatus status;
  status.policy = queue_policy_name(config_.policy);
  status.config_source = config_.source;
  QueueDirectory::Listing listing = list_queue(false);
  status.warnings = listing.warnings;
  // Nobody waits (the usual case): nothing to plan, so no device query or lock probes.
  if (listing.live.empty()) return status;
  const QueueSnapshot snapshot =
      plan(devices ? *devices : source_->devices(), listing, nullptr, nullptr, true);
  for (std::size_t position = 0; position < snapshot.plan.order.size(); ++position) {
    QueueEntry entry = snapshot.entry_at(position, config_);
    const Ticket& t = snapshot.tickets[snapshot.plan.order[position].request];
    if (t.shared_units > 0) entry.memory_bytes = std::uint64_t{t.shared_units} * kSharedUnitBytes;
    if (t.shared_slots > 0) entry.slots = t.shared_slots;
    status.entries.push_back(std::move(entry));
  }
  return status;
}

}  // namespace gpulock
