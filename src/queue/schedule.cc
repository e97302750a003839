// The queue's plan: ordering by policy, then serving and reserving along that order.
#include "queue/schedule.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

namespace gpulock {
namespace {

// The order key of one request: smaller goes first.
struct OrderKey {
  int priority_class = 0;        // 0 normal, 1 low
  std::uint64_t share = 0;       // fair-share only
  std::int64_t last_served = 0;  // fair-share only: when the user was last given GPUs
  std::uint64_t seq = 0;
  auto tie() const { return std::tie(priority_class, share, last_served, seq); }
};

// The memory units a request of `shared_units` (or else `shared_slots`) wants on a GPU of
// `total_units`; 0 for a request of whole GPUs.
std::uint32_t shared_units_on(std::uint32_t shared_units, std::uint32_t shared_slots,
                              std::uint32_t total_units) {
  if (shared_units > 0) return shared_units;
  if (shared_slots == 0) return 0;
  return std::max<std::uint32_t>(1, total_units / shared_slots);
}

// Which of `usable` (free GPUs in candidate order) an exclusive "any N" request takes, as
// positions into it, ascending: choose_gpus over them put in the order their last leases began,
// oldest first (`last_leased`, by position; ties keep candidate order).
std::optional<std::vector<std::size_t>> choose_leased_longest_ago(
    const std::vector<std::string>& usable, const std::vector<std::int64_t>& last_leased,
    std::size_t needed, const DistanceFunction& distance) {
  std::vector<std::size_t> by_age(usable.size());
  std::iota(by_age.begin(), by_age.end(), 0);
  std::stable_sort(by_age.begin(), by_age.end(),
                   [&](std::size_t a, std::size_t b) { return last_leased[a] < last_leased[b]; });
  // A permutation is sorted only when it is the identity: candidate order already.
  if (std::is_sorted(by_age.begin(), by_age.end())) return choose_gpus(usable, needed, distance);
  std::vector<std::string> oldest_first;
  oldest_first.reserve(usable.size());
  for (const std::size_t position : by_age) oldest_first.push_back(usable[position]);
  auto chosen = choose_gpus(oldest_first, needed, distance);
  if (!chosen) return chosen;
  for (std::size_t& position : *chosen) position = by_age[position];
  std::sort(chosen->begin(), chosen->end());
  return chosen;
}

}  // namespace

std::uint32_t PlanRequest::units_on(std::uint32_t total_units) const {
  return shared_units_on(shared_units, shared_slots, total_units);
}

const Placement& Plan::of(std::size_t request) const {
  return order.at(position_of.at(request));
}

Plan plan_queue(QueuePolicy policy, const std::vector<PlannedGpu>& gpus,
                const std::vector<PlanRequest>& requests, const DistanceFunction& distance) {
  std::vector<PlanRequest> copy = requests;
  for (auto& r : copy) r.details_pending = false;
  return plan_queue(policy, gpus, copy, distance, RequestLoader());
}

QueueOrder order_queue(QueuePolicy policy, const std::vector<PlannedGpu>& gpus,
                       const std::vector<OrderInput>& requests) {
  QueueOrder result;
  // As bytes: a vector<bool> costs a shift and mask per look.
  result.may_enter.assign(requests.size(), false);
  result.held_back.assign(requests.size(), false);
  std::map<uid_t, std::uint64_t> share_by_user;  // in 1/kShareScale of a GPU, for fair share
  for (const auto& gpu : gpus) {
    if (gpu.held && gpu.holder_uid) share_by_user[*gpu.holder_uid] += kShareScale;
    for (const auto& [uid, part] : gpu.shared_by) share_by_user[uid] += part;
  }

  // What one GPU of a request weighs in its user's share: a whole GPU, or for a shared request
  // its part of the largest GPU's memory.
  std::uint32_t largest_units = 0;
  for (const auto& gpu : gpus) largest_units = std::max(largest_units, gpu.total_units);
  const auto weight_of = [&](const OrderInput& r) -> std::uint64_t {
    const std::uint32_t units = shared_units_on(r.shared_units, r.shared_slots, largest_units);
    if (units == 0 || largest_units == 0) return kShareScale;
    return std::max<std::uint64_t>(
        1,
        std::min<std::uint64_t>(kShareScale, std::uint64_t{units} * kShareScale / largest_units));
  };

  // The requests by arrival: as given when they are in that order already (a queue read from
  // its index is), else sorted.
  const auto arrived_earlier = [](const OrderInput& a, const OrderInput& b) {
    return a.seq < b.seq;
  };
  const bool given_by_arrival = std::is_sorted(requests.begin(), requests.end(), arrived_earlier);
  std::vector<std::size_t> by_arrival;
  if (!given_by_arrival) {
    by_arrival.resize(requests.size());
    std::iota(by_arrival.begin(), by_arrival.end(), std::size_t{0});
    std::sort(by_arrival.begin(), by_arrival.end(), [&](std::size_t a, std::size_t b) {
      return arrived_earlier(requests[a], requests[b]);
    });
  }
  const auto arrival = [&](std::size_t n) { return given_by_arrival ? n : by_arrival[n]; };

  // What ordering has found so far of each user's requests, looked up again only when the user
  // changes (a queue of thousands is mostly one user's).
  struct UserOrder {
    std::uint64_t share = 0;      // the share the user's next request is ordered by
    std::size_t taking_part = 0;  // the user's requests not held back (and let in)
  };
  std::map<uid_t, UserOrder> user_order;
  const auto order_of = [&](uid_t uid) -> UserOrder& {
    const auto [it, added] = user_order.try_emplace(uid);
    if (added) it->second.share = share_by_user[uid];
    return it->second;
  };

  // Sorted as one flat key per request (held-back ones last, by arrival), for a queue of
  // thousands sorted at every plan. Requests beyond their user's max_waiting (by arrival) are
  // held back, and so are those that registered over it.
  struct Sortable {
    bool held_back;
    OrderKey key;
    std::size_t index;
  };
  std::vector<Sortable> sortable(requests.size());
  bool some_entered_over_limit = false;
  UserOrder* user = nullptr;
  for (std::size_t n = 0; n < requests.size(); ++n) {
    const std::size_t i = arrival(n);
    const OrderInput& r = requests[i];
    if (n == 0 || r.uid != requests[arrival(n - 1)].uid) user = &order_of(r.uid);
    some_entered_over_limit |= r.entered_over_limit;
    if (r.entered_over_limit || (r.max_waiting && user->taking_part >= *r.max_waiting)) {
      sortable[i] = Sortable{true, OrderKey{0, 0, 0, r.seq}, i};
      result.held_back[i] = true;
      continue;
    }
    ++user->taking_part;
    OrderKey key;
    key.priority_class = r.priority == Priority::kLow ? 1 : 0;
    key.share = policy == QueuePolicy::kFairShare ? user->share : 0;
    key.last_served = policy == QueuePolicy::kFairShare ? r.user_last_served : 0;
    key.seq = r.seq;
    sortable[i] = Sortable{false, key, i};
    user->share += std::uint64_t{r.needed} * weight_of(r);
  }
  // Room in the queue for requests that registered over their user's limit: the earliest may
  // enter.
  if (some_entered_over_limit) {
    for (std::size_t n = 0; n < requests.size(); ++n) {
      const std::size_t i = arrival(n);
      const OrderInput& r = requests[i];
      UserOrder& u = user_order.at(r.uid);
      if (!r.entered_over_limit || (r.max_waiting && u.taking_part >= *r.max_waiting)) continue;
      result.may_enter[i] = true;
      ++u.taking_part;
    }
  }

  const auto goes_first = [](const Sortable& a, const Sortable& b) {
    if (a.held_back != b.held_back) return !a.held_back;
    return a.key.tie() < b.key.tie();
  };
  // One user's queue (a sweep) is in order already: checking costs a tenth of sorting.
  if (!std::is_sorted(sortable.begin(), sortable.end(), goes_first))
    std::sort(sortable.begin(), sortable.end(), goes_first);
  result.order.reserve(sortable.size());
  for (const Sortable& in_order : sortable) result.order.push_back(in_order.index);
  return result;
}

Plan plan_queue(QueuePolicy policy, const std::vector<PlannedGpu>& gpus,
                std::vector<PlanRequest>& requests, const DistanceFunction& distance,
                const RequestLoader& load) {
  std::vector<OrderInput> inputs;
  inputs.reserve(requests.size());
  for (const PlanRequest& r : requests)
    fill_order_input(inputs.emplace_back(), r, r.limits.max_waiting, r.user_last_served);
  return plan_queue_in_order(gpus, requests, order_queue(policy, gpus, inputs), distance, load);
}

namespace {

// The walk of plan_queue_in_order() along the order over the GPUs: which are free, in shared use
// and with how much memory left, and which a request earlier in the order was given or reserved
// (or held back) as a whole. Shared requests take units of GPUs that stay open to later shared
// requests.
class PlanWalk {
 public:
  explicit PlanWalk(const std::vector<PlannedGpu>& gpus) {
    for (const auto& gpu : gpus) {
      if (gpu.held && gpu.holder_uid) ++held_by_user_[*gpu.holder_uid];
      GpuWalk& w = walk_[gpu.uuid];
      w.free = !gpu.held;
      w.shared_use = gpu.held && gpu.shared_use;
      w.total_units = gpu.total_units;
      w.units_left = gpu.free_units;
      w.jobs = gpu.shared_jobs;
      w.last_leased_ns = gpu.last_leased_ns;
    }
  }

  // Whether some GPU could still serve or be reserved by a request further back: free and not
  // claimed, or open to shared leases with memory left. Once none is left, none comes back:
  // only a request that takes part claims GPUs, and it needs one that is open. (Remembered, so
  // that thousands of waiters behind the last open GPU cost one look each, not one per GPU.)
  bool open_gpu_left() {
    if (none_left_) return false;
    for (const auto& [uuid, w] : walk_) {
      if (claimed_.count(uuid)) continue;
      if (w.free && !w.shared_given_to) return true;
      if ((w.free || w.shared_use) && w.units_left > 0) return true;
    }
    none_left_ = true;
    return false;
  }

  // Not only the open ones: a request that loads while some GPU is open also holds back GPUs in
  // shared use without memory left, and free ones that shared requests took all of.
  std::vector<ClaimableGpu> claimable_gpus() {
    std::vector<ClaimableGpu> claimable;
    if (!open_gpu_left()) return claimable;
    for (const auto& [uuid, w] : walk_)
      if (!claimed_.count(uuid) && (w.free || w.shared_use))
        claimable.push_back({uuid, w.free && !w.shared_given_to, w.shared_use});
    return claimable;
  }

  // Whether an exclusive request would take its user past max_gpus.
  bool over_gpu_limit(const PlanRequest& r) {
    return !r.shared() && r.limits.max_gpus &&
           held_by_user_[r.uid] + given_to_user_[r.uid] + r.needed > *r.limits.max_gpus;
  }

  // Whether it can ever be served: its GPUs are on the machine. A request that cannot reserves
  // nothing: holding GPUs back would only starve others.
  bool servable_ever(const PlanRequest& r) const {
    const auto present =
        std::count_if(r.candidates.begin(), r.candidates.end(),
                      [&](const std::string& uuid) { return walk_.count(uuid) > 0; });
    return static_cast<std::size_t>(present) >= r.needed &&
           (!r.named_gpus || present == static_cast<long>(r.candidates.size()));
  }

  // The candidates `r` could take now, in candidate order; what stands in the way of each other
  // one goes to placement.obstacles.
  std::vector<std::string> usable_gpus(const PlanRequest& r, Placement& placement) const {
    const std::set<std::string> unhealthy(r.unhealthy.begin(), r.unhealthy.end());
    std::vector<std::string> usable;
    for (const auto& uuid : r.candidates) {
      Obstacle obstacle{uuid, Obstacle::Kind::kHeld, std::nullopt};
      const auto w = walk_.find(uuid);
      const auto claim = claimed_.find(uuid);
      if (w == walk_.end()) {
        obstacle.kind = Obstacle::Kind::kMissing;
      } else if (!w->second.free && !(r.shared() && w->second.shared_use)) {
        obstacle.kind = Obstacle::Kind::kHeld;
      } else if (claim != claimed_.end()) {
        obstacle.kind = claim->second.given ? Obstacle::Kind::kGiven : Obstacle::Kind::kReserved;
        obstacle.by = claim->second.by;
      } else if (!r.shared() && w->second.shared_given_to) {
        obstacle.kind = Obstacle::Kind::kGiven;
        obstacle.by = w->second.shared_given_to;
      } else if (unhealthy.count(uuid)) {
        obstacle.kind = Obstacle::Kind::kUnhealthy;
      } else if (r.shared() && w->second.total_units != 0 && r.job_cap &&
                 w->second.jobs >= *r.job_cap) {
        obstacle.kind = Obstacle::Kind::kJobCap;
      } else if (r.shared() && (w->second.total_units == 0 ||
                                w->second.units_left < r.units_on(w->second.total_units))) {
        obstacle.kind = Obstacle::Kind::kFull;
        obstacle.wanted_units = r.units_on(w->second.total_units);
      } else {
        usable.push_back(uuid);
        continue;
      }
      placement.obstacles.push_back(std::move(obstacle));
    }
    return usable;
  }

  // Which of `usable` `r` takes now, as positions into it, ascending; nullopt when it waits.
  // `alone`: the only request of the plan.
  std::optional<std::vector<std::size_t>> choose(const PlanRequest& r,
                                                 const std::vector<std::string>& usable,
                                                 const Placement& placement, bool alone,
                                                 const DistanceFunction& distance) const {
    if (r.named_gpus) {
      if (!placement.obstacles.empty() || usable.empty()) return std::nullopt;
      std::vector<std::size_t> all(usable.size());
      std::iota(all.begin(), all.end(), 0);
      return all;
    }
    if (usable.size() < r.needed || r.needed == 0) return std::nullopt;
    if (r.shared()) {
      // Pack (the least free memory first, so whole GPUs stay whole for exclusive requests) or
      // spread; ties in candidate order. Then back in candidate order.
      std::vector<std::size_t> by_room(usable.size());
      std::iota(by_room.begin(), by_room.end(), 0);
      std::stable_sort(by_room.begin(), by_room.end(), [&](std::size_t a, std::size_t b) {
        const auto room_a = at(usable[a]).units_left, room_b = at(usable[b]).units_left;
        return r.spread ? room_a > room_b : room_a < room_b;
      });
      by_room.resize(r.needed);
      std::sort(by_room.begin(), by_room.end());
      return by_room;
    }
    // Alone: no waiter's GPU is at stake, and a lone user expects index order.
    if (alone) return choose_gpus(usable, r.needed, distance);
    std::vector<std::int64_t> last_leased(usable.size());
    for (std::size_t i = 0; i < usable.size(); ++i) last_leased[i] = at(usable[i]).last_leased_ns;
    return choose_leased_longest_ago(usable, last_leased, r.needed, distance);
  }

  // Gives request `index` the GPUs of its placement.
  void give(const PlanRequest& r, std::size_t index, const Placement& placement) {
    if (r.shared()) {
      for (const auto& uuid : placement.gpus) {
        GpuWalk& w = walk_[uuid];
        w.units_left -= r.units_on(w.total_units);
        ++w.jobs;
        if (!w.shared_given_to) w.shared_given_to = index;
      }
      return;
    }
    given_to_user_[r.uid] += placement.gpus.size();
    for (const auto& uuid : placement.gpus) claimed_[uuid] = Claim{index, true};
  }

  // Request `index` waits: what it reserves (placement.gpus; later requests may not use them)
  // and holds back against new shared leases (placement.held_back), from the `usable` GPUs.
  void reserve(const PlanRequest& r, std::size_t index, std::vector<std::string> usable,
               Placement& placement) {
    const bool servable = servable_ever(r);
    if (servable && !r.shared()) {
      placement.gpus = std::move(usable);
      // Not enough free GPUs: hold back GPUs in shared use (fewest leases first) against new
      // shared leases, so that they drain and this request gets them.
      const std::size_t wanted = r.named_gpus ? r.candidates.size() : r.needed;
      std::vector<std::string> drain;
      for (const auto& uuid : r.candidates)
        if (const auto w = walk_.find(uuid);
            w != walk_.end() && w->second.shared_use && !claimed_.count(uuid))
          drain.push_back(uuid);
      std::stable_sort(drain.begin(), drain.end(),
                       [&](const auto& a, const auto& b) { return at(a).jobs < at(b).jobs; });
      const std::size_t more = wanted > placement.gpus.size() ? wanted - placement.gpus.size() : 0;
      if (drain.size() > more) drain.resize(more);
      placement.held_back = std::move(drain);
    } else if (servable) {
      // A shared request reserves the GPUs it waits on (the most free memory first), so that
      // smaller requests behind it cannot take that memory as it frees up.
      std::vector<std::string> waits_on;
      for (const auto& uuid : r.candidates)
        if (const auto w = walk_.find(uuid);
            w != walk_.end() && (w->second.free || w->second.shared_use) && !claimed_.count(uuid))
          waits_on.push_back(uuid);
      std::stable_sort(waits_on.begin(), waits_on.end(), [&](const auto& a, const auto& b) {
        return at(a).units_left > at(b).units_left;
      });
      if (!r.named_gpus && waits_on.size() > r.needed) waits_on.resize(r.needed);
      for (auto& uuid : waits_on)
        (at(uuid).free && !at(uuid).shared_given_to ? placement.gpus : placement.held_back)
            .push_back(std::move(uuid));
    }
    for (const auto& uuid : placement.gpus) claimed_[uuid] = Claim{index, false};
    for (const auto& uuid : placement.held_back) claimed_[uuid] = Claim{index, false};
  }

 private:
  struct GpuWalk {
    bool free = false;        // no lease holds it
    bool shared_use = false;  // held by shared leases only
    std::uint32_t total_units = 0;
    std::uint32_t units_left = 0;
    unsigned jobs = 0;
    std::optional<std::size_t> shared_given_to;  // the first shared request given part of it
    std::int64_t last_leased_ns = 0;
  };
  struct Claim {
    std::size_t by;
    bool given;
  };
  // A GPU of the walk (REQUIRES: one of the machine's).
  const GpuWalk& at(const std::string& uuid) const { return walk_.find(uuid)->second; }

  std::map<std::string, GpuWalk> walk_;
  std::map<std::string, Claim> claimed_;
  std::map<uid_t, std::uint64_t> held_by_user_;   // whole GPUs, for max_gpus
  std::map<uid_t, std::uint64_t> given_to_user_;  // by this plan
  bool none_left_ = false;
};

}  // namespace

Plan plan_queue_in_order(const std::vector<PlannedGpu>& gpus, std::vector<PlanRequest>& requests,
                         const QueueOrder& order, const DistanceFunction& distance,
                         const RequestLoader& load, std::size_t prefix,
                         std::vector<ClaimableGpu>* claimable_after) {
  PlanWalk walk(gpus);
  Plan plan;
  plan.position_of.assign(requests.size(), 0);
  plan.order.reserve(requests.size());
  for (std::size_t position = 0; position < order.order.size(); ++position) {
    if (claimable_after && position == prefix) *claimable_after = walk.claimable_gpus();
    const std::size_t index = order.order[position];
    const bool held_back = order.held_back[index] != 0;
    PlanRequest& r = requests[index];
    // Built in place (the order has room for every request): a plan places thousands.
    plan.position_of[index] = plan.order.size();
    Placement& placement = plan.order.emplace_back();
    placement.request = index;
    const bool over_gpu_limit = !held_back && walk.over_gpu_limit(r);
    if (r.details_pending && !held_back && !over_gpu_limit) {
      // Only a GPU that nobody earlier was given or reserved can change anything now.
      bool takes_part = false;
      if (load && walk.open_gpu_left()) {
        r.details_pending = false;
        takes_part = load(index, r);
      }
      if (!takes_part) {
        placement.standing = QueueStanding::kWaiting;
        continue;
      }
    }
    if (held_back) {
      placement.standing = QueueStanding::kOverWaitingLimit;
      placement.may_enter = order.may_enter[index] != 0;
      continue;
    }
    if (over_gpu_limit) {
      placement.standing = QueueStanding::kOverGpuLimit;
      continue;
    }
    std::vector<std::string> usable = walk.usable_gpus(r, placement);
    const std::optional<std::vector<std::size_t>> chosen =
        walk.choose(r, usable, placement, requests.size() == 1, distance);
    if (!chosen) {
      placement.standing = QueueStanding::kWaiting;
      walk.reserve(r, index, std::move(usable), placement);
      continue;
    }
    placement.standing = QueueStanding::kNext;
    placement.obstacles.clear();
    for (std::size_t at : *chosen) placement.gpus.push_back(usable[at]);
    walk.give(r, index, placement);
  }
  if (claimable_after && prefix >= order.order.size()) *claimable_after = walk.claimable_gpus();
  return plan;
}

}  // namespace gpulock
