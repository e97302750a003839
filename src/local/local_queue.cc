// The local backend's queue: planning it from the queue directory and the lock files (for an
// acquire, only the head of its order: plan_head), and describing it to people (`gpulock queue`).
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>

#include "backend/queue_request.h"
#include "local/gpu_lock_file.h"
#include "local/local_backend.h"
#include "local/usability_hint.h"
#include "process/process_identity.h"

namespace gpulock {

const std::string& LocalBackend::user_of(uid_t uid) {
  std::lock_guard<std::mutex> lock(user_names_mutex_);
  auto it = user_names_.find(uid);
  if (it == user_names_.end()) it = user_names_.emplace(uid, user_name(uid)).first;
  return it->second;
}

namespace {

// The first plan of a long queue covers this many requests of its order; twice as many each
// time GPUs are still open behind them.
constexpr std::size_t kFirstHead = 32;

// The device of a UUID among `devices` (which must outlive it), nullptr for one that is gone:
// what unhealthy_candidates() judges a ticket's filters against.
std::function<const Device*(const std::string&)> device_finder(const std::vector<Device>& devices) {
  auto by_uuid = std::make_shared<std::map<std::string, const Device*>>();
  for (const auto& d : devices) (*by_uuid)[d.uuid] = &d;
  return [by_uuid](const std::string& uuid) -> const Device* {
    const auto it = by_uuid->find(uuid);
    return it == by_uuid->end() ? nullptr : it->second;
  };
}

// Judges a ticket's health filters against the devices: why each unhealthy candidate fails (for
// people, into `reasons`) and which they are (for the plan, into `r`).
void judge_health(const Ticket& t,
                  const std::function<const Device*(const std::string&)>& device_of,
                  std::map<std::string, std::string>& reasons, PlanRequest& r) {
  reasons = unhealthy_candidates(t, device_of);
  for (const auto& [uuid, reason] : reasons) r.unhealthy.push_back(uuid);
}

}  // namespace

void LocalBackend::plan_gpus(const std::vector<Device>& devices, bool any_shared, bool with_records,
                             QueueSnapshot& snapshot) {
  for (const auto& d : devices) {
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
    gpu.last_leased_ns = p.last_leased_ns;
    if (d.memory_total_bytes && *d.memory_total_bytes > 0)
      for (const auto& record : p.shared_records)
        gpu.shared_by.emplace_back(
            record.uid, record.memory_bytes.value_or(0) * kShareScale / *d.memory_total_bytes);
    snapshot.gpus.push_back(std::move(gpu));
    snapshot.locks.push_back(std::move(p));
    snapshot.gpu_names.push_back(d.display_index());
  }
}

PlanRequest LocalBackend::plan_request(const Ticket& t, const UserLimits& limits,
                                       std::int64_t user_last_served) const {
  PlanRequest r;
  fill_plan_request(t, limits, r);
  if (t.shared_slots > 0) r.job_cap = t.shared_slots;
  if (config_.max_jobs_per_gpu)
    r.job_cap =
        r.job_cap ? std::min(*r.job_cap, *config_.max_jobs_per_gpu) : *config_.max_jobs_per_gpu;
  r.user_last_served = user_last_served;
  return r;
}

QueueSnapshot LocalBackend::plan(const std::vector<Device>& devices,
                                 QueueDirectory::Listing& listing, const Ticket* newcomer,
                                 const Ticket* own, bool with_records,
                                 std::vector<IndexEntry>* gone) {
  if (newcomer || own) return plan_head(devices, listing, newcomer, own, with_records, gone);
  QueueSnapshot snapshot;
  snapshot.tickets = std::move(listing.live);
  listing.live.clear();
  snapshot.warnings = listing.warnings;

  // GPUs are read for shared requests (free memory units, shared jobs) only when one takes part.
  bool any_shared = false;
  for (const Ticket& t : snapshot.tickets) any_shared |= t.shared();
  plan_gpus(devices, any_shared, with_records, snapshot);
  const std::function<const Device*(const std::string&)> device_of = device_finder(devices);

  std::vector<PlanRequest> requests;
  requests.reserve(snapshot.tickets.size());
  snapshot.unhealthy_reasons.resize(snapshot.tickets.size());
  for (std::size_t i = 0; i < snapshot.tickets.size(); ++i) {
    Ticket& t = snapshot.tickets[i];
    t.user = user_of(t.uid);  // the name this machine gives the ticket's owner
    const auto it = listing.last_served.find(t.uid);
    requests.push_back(plan_request(t, config_.limits_for(t.user),
                                    it == listing.last_served.end() ? 0 : it->second));
    judge_health(t, device_of, snapshot.unhealthy_reasons[i], requests.back());
  }
  snapshot.plan = plan_queue(
      config_.policy, snapshot.gpus, requests,
      [this](const std::string& a, const std::string& b) { return source_->distance(a, b); },
      RequestLoader());
  return snapshot;
}

// The plan of an acquire from the queue's index (see plan_head() in local_backend.h): the order
// of the whole queue, then walks of the head of that order, doubled while GPUs stay open behind
// it, along a sequence that leaves out whoever surely could not claim any of them.
class LocalBackend::HeadPlan {
 public:
  HeadPlan(LocalBackend& pool, const std::vector<Device>& devices,
           const QueueDirectory::Listing& listing, const Ticket* newcomer, const Ticket* own,
           bool with_records, std::vector<IndexEntry>* gone);

  QueueSnapshot make();

 private:
  // What orders the queue, for every request: per user, looked up when the user changes (a
  // queue of thousands is mostly one user's).
  struct UserFacts {
    std::string name;
    UserLimits limits;
    std::int64_t last_served = 0;
  };
  const UserFacts& facts_of(uid_t uid);
  // Which request is ours: the newcomer (last), or our registered ticket.
  void find_me();
  // Orders the whole queue (order_, my_place_).
  void order();
  // The position in the order of the sequence's s-th request.
  std::size_t position_at(std::size_t s) const { return sieved_ ? sequence_[s] : s; }
  // Plans the first `head` requests of the sequence, and ours if it is further back (their
  // positions in `places`). Returns the GPUs still claimable behind them.
  std::vector<ClaimableGpu> walk(std::size_t head, std::vector<std::size_t>& places);
  // The details of the head's k-th request (`members`: the head's requests), read when the plan
  // reaches it. False for a waiter found gone, which is reported.
  bool load(std::size_t k, PlanRequest& r, const std::vector<std::size_t>& members);
  // The sequence behind the first `head` requests: whoever could claim one of `claimable`.
  void sieve(const std::vector<ClaimableGpu>& claimable, std::size_t head);
  // Held-back requests with room now that no walk reached (the positions in `walked`).
  void list_may_enter_beyond_head(const std::vector<std::size_t>& walked);

  LocalBackend& pool_;
  const QueueDirectory::Listing& listing_;
  const std::vector<IndexEntry>& queued_;
  const Ticket* newcomer_;
  const Ticket* own_;
  std::vector<IndexEntry>* gone_;
  const std::size_t gone_before_;
  const std::size_t total_;
  QueueSnapshot snapshot_;
  std::function<const Device*(const std::string&)> device_of_;
  std::map<uid_t, UserFacts> users_;
  std::size_t me_;
  Ticket newcomer_ticket_;
  QueueOrder order_;
  std::size_t my_place_;
  // Tickets read in an earlier, shorter head (nullopt: found gone), so that each is read once
  // per plan however often the head doubles.
  std::map<std::size_t, std::optional<Ticket>> read_before_;
  // Positions in the order that the walk may need, in order: the whole order until GPUs are
  // found open behind the first head, then that head and the sieved rest (ours included).
  std::vector<std::size_t> sequence_;
  bool sieved_ = false;
};

QueueSnapshot LocalBackend::plan_head(const std::vector<Device>& devices,
                                      const QueueDirectory::Listing& listing,
                                      const Ticket* newcomer, const Ticket* own, bool with_records,
                                      std::vector<IndexEntry>* gone) {
  return HeadPlan(*this, devices, listing, newcomer, own, with_records, gone).make();
}

LocalBackend::HeadPlan::HeadPlan(LocalBackend& pool, const std::vector<Device>& devices,
                                 const QueueDirectory::Listing& listing, const Ticket* newcomer,
                                 const Ticket* own, bool with_records,
                                 std::vector<IndexEntry>* gone)
    : pool_(pool),
      listing_(listing),
      queued_(listing.index),
      newcomer_(newcomer),
      own_(own),
      gone_(gone),
      gone_before_(gone ? gone->size() : 0),
      total_(listing.index.size() + (newcomer ? 1 : 0)),
      device_of_(device_finder(devices)),
      me_(total_),
      my_place_(total_) {
  snapshot_.warnings = listing.warnings;
  // GPUs are read for shared requests (free memory units, shared jobs) only when one takes part.
  bool any_shared = (newcomer && newcomer->shared()) || (own && own->shared());
  for (const IndexEntry& e : queued_) any_shared |= e.shared_units > 0 || e.shared_slots > 0;
  pool_.plan_gpus(devices, any_shared, with_records, snapshot_);
}

const LocalBackend::HeadPlan::UserFacts& LocalBackend::HeadPlan::facts_of(uid_t uid) {
  auto [it, added] = users_.try_emplace(uid);
  if (added) {
    it->second.name = pool_.user_of(uid);
    it->second.limits = pool_.config_.limits_for(it->second.name);
    const auto served = listing_.last_served.find(uid);
    it->second.last_served = served == listing_.last_served.end() ? 0 : served->second;
  }
  return it->second;
}

void LocalBackend::HeadPlan::find_me() {
  if (newcomer_) {
    me_ = queued_.size();
    newcomer_ticket_ = *newcomer_;
    newcomer_ticket_.seq = listing_.highest_seq + 1;
    return;
  }
  // By id and seq: the index is world-writable, and a planted slot with our id must not stand
  // in for us.
  for (std::size_t i = 0; i < queued_.size() && me_ == total_; ++i)
    if (queued_[i].id == own_->id && queued_[i].seq == own_->seq) me_ = i;
  // Not in the queue (root removed it): the snapshot does not have it, and the caller
  // registers again.
}

void LocalBackend::HeadPlan::order() {
  std::vector<OrderInput> inputs;
  inputs.reserve(total_);
  const UserFacts* facts = nullptr;
  for (std::size_t i = 0; i < queued_.size(); ++i) {
    const IndexEntry& e = queued_[i];
    if (i == 0 || e.uid != queued_[i - 1].uid) facts = &facts_of(e.uid);
    fill_order_input(inputs.emplace_back(), e, facts->limits.max_waiting, facts->last_served);
  }
  if (newcomer_) inputs.emplace_back();
  // Ours is ordered by our own ticket, not by what the index says of it. A request that has
  // not registered does not wait yet: the waiting limit is not its concern until it must
  // (acquire() decides then).
  if (me_ < total_) {
    const Ticket& t = newcomer_ ? newcomer_ticket_ : *own_;
    const UserFacts& mine = facts_of(t.uid);
    inputs[me_] =
        order_input(t, newcomer_ ? std::nullopt : mine.limits.max_waiting, mine.last_served);
  }
  order_ = order_queue(pool_.config_.policy, snapshot_.gpus, inputs);
  for (std::size_t k = 0; k < total_ && my_place_ == total_; ++k)
    if (order_.order[k] == me_) my_place_ = k;
}

bool LocalBackend::HeadPlan::load(std::size_t k, PlanRequest& r,
                                  const std::vector<std::size_t>& members) {
  const IndexEntry& entry = queued_[members[k]];
  auto known = read_before_.find(members[k]);
  if (known == read_before_.end()) {
    QueueDirectory* queue = pool_.queue_dir(false);
    known =
        read_before_.emplace(members[k], queue ? queue->read_ticket(entry) : std::nullopt).first;
  }
  std::optional<Ticket> full = known->second;
  if (!full) {
    if (gone_) gone_->push_back(entry);
    return false;
  }
  Ticket& t = snapshot_.tickets[k];
  const std::string user = t.user;
  t = std::move(*full);
  t.user = user;
  r.candidates = t.candidates;
  r.spread = t.spread;
  judge_health(t, device_of_, snapshot_.unhealthy_reasons[k], r);
  return true;
}

std::vector<ClaimableGpu> LocalBackend::HeadPlan::walk(std::size_t head,
                                                       std::vector<std::size_t>& places) {
  if (gone_) gone_->resize(gone_before_);
  // The head's requests in order, then ours if it is further back.
  std::vector<std::size_t> members;
  members.reserve(head + 1);
  places.reserve(head + 1);
  for (std::size_t s = 0; s < head; ++s) {
    places.push_back(position_at(s));
    members.push_back(order_.order[places.back()]);
  }
  if (my_place_ < total_ && (head == 0 || my_place_ > position_at(head - 1))) {
    places.push_back(my_place_);
    members.push_back(me_);
  }
  snapshot_.tickets.clear();
  snapshot_.unhealthy_reasons.assign(members.size(), {});
  snapshot_.place_in_queue = places;
  std::vector<PlanRequest> requests;
  requests.reserve(members.size());
  QueueOrder head_order;
  for (std::size_t k = 0; k < members.size(); ++k) {
    const std::size_t i = members[k];
    const bool is_newcomer = newcomer_ && i == queued_.size();
    const bool is_own = !is_newcomer && i == me_;
    Ticket t = is_newcomer ? newcomer_ticket_ : is_own ? *own_ : ticket_of(queued_[i]);
    const UserFacts& user = facts_of(t.uid);
    t.user = user.name;
    PlanRequest r = pool_.plan_request(t, user.limits, user.last_served);
    r.details_pending = !is_newcomer && !is_own;
    if (is_newcomer) r.limits.max_waiting.reset();
    if (!r.details_pending) judge_health(t, device_of_, snapshot_.unhealthy_reasons[k], r);
    snapshot_.tickets.push_back(std::move(t));
    requests.push_back(std::move(r));
    head_order.order.push_back(k);
    head_order.held_back.push_back(order_.held_back[i]);
    head_order.may_enter.push_back(order_.may_enter[i]);
  }
  std::vector<ClaimableGpu> claimable_behind;
  snapshot_.plan = plan_queue_in_order(
      snapshot_.gpus, requests, head_order,
      [this](const std::string& a, const std::string& b) { return pool_.source_->distance(a, b); },
      [&](std::size_t k, PlanRequest& r) { return load(k, r, members); }, head, &claimable_behind);
  return claimable_behind;
}

void LocalBackend::HeadPlan::sieve(const std::vector<ClaimableGpu>& claimable, std::size_t head) {
  // GPUs only close as the walk goes on: whoever cannot claim one now never can.
  const ClaimSieve sieve(claimable, device_of_);
  sequence_.reserve(total_);
  for (std::size_t s = 0; s < head; ++s) sequence_.push_back(s);
  for (std::size_t k = head; k < total_; ++k) {
    const std::size_t i = order_.order[k];
    if (i == me_ || (!order_.held_back[i] &&
                     sieve.may_claim(queued_[i].hint(),
                                     queued_[i].shared_units > 0 || queued_[i].shared_slots > 0,
                                     &snapshot_.unhealthy_beyond_head)))
      sequence_.push_back(k);
  }
  sieved_ = true;
}

void LocalBackend::HeadPlan::list_may_enter_beyond_head(const std::vector<std::size_t>& walked) {
  // Held-back requests come last in the order: those with room now are usually not walked.
  for (std::size_t k = total_; k-- > 0 && order_.held_back[order_.order[k]];) {
    const std::size_t i = order_.order[k];
    if (order_.may_enter[i] && i != me_ && i < queued_.size() &&
        !std::binary_search(walked.begin(), walked.end(), k))
      snapshot_.may_enter_beyond_head.push_back(queued_[i].id);
  }
  std::reverse(snapshot_.may_enter_beyond_head.begin(), snapshot_.may_enter_beyond_head.end());
}

QueueSnapshot LocalBackend::HeadPlan::make() {
  find_me();
  order();
  // Plan the head of that order: a request further back can only wait once no GPU is open
  // behind the head (the plan reads its details, and makes its ticket, only in the head). While
  // GPUs stay open behind it, the head doubles, along a sequence of the order that leaves out
  // whoever surely could not claim any GPU still claimable (their slots' hints against those
  // GPUs): a long queue of requests that cannot use a free GPU costs no more than a short one.
  std::size_t length = total_;
  std::size_t head = std::min(total_, kFirstHead);
  std::vector<std::size_t> walked;  // the last walk's positions, ascending
  for (;; head = std::min(length, head * 2)) {
    std::vector<std::size_t> places;
    const std::vector<ClaimableGpu> claimable_behind = walk(head, places);
    if (claimable_behind.empty() || head == length) {
      walked = std::move(places);
      break;
    }
    if (sieved_) continue;
    sieve(claimable_behind, head);
    length = sequence_.size();
    // Nobody behind the head but ours (walked already): the plan is made.
    if (length == head || (length == head + 1 && sequence_.back() == my_place_)) {
      walked = std::move(places);
      break;
    }
  }
  snapshot_.queue_length = total_;
  list_may_enter_beyond_head(walked);
  return std::move(snapshot_);
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
