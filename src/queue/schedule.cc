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

}  // namespace

const Placement& Plan::of(std::size_t request) const {
  return order.at(position_of.at(request));
}

Plan plan_queue(QueuePolicy policy, const std::vector<PlannedGpu>& gpus,
                const std::vector<PlanRequest>& requests, const DistanceFunction& distance) {
  std::vector<PlanRequest> copy = requests;
  for (auto& r : copy) r.details_pending = false;
  return plan_queue(policy, gpus, copy, distance, RequestLoader());
}

Plan plan_queue(QueuePolicy policy, const std::vector<PlannedGpu>& gpus,
                std::vector<PlanRequest>& requests, const DistanceFunction& distance,
                const RequestLoader& load) {
  // Each user's requests by arrival; those beyond the user's max_waiting are held back.
  std::map<uid_t, std::vector<std::size_t>> by_user;
  for (std::size_t i = 0; i < requests.size(); ++i) by_user[requests[i].uid].push_back(i);
  std::vector<bool> held_back(requests.size(), false);
  std::vector<OrderKey> keys(requests.size());
  std::map<uid_t, std::uint64_t> held_by_user;   // whole GPUs, for max_gpus
  std::map<uid_t, std::uint64_t> share_by_user;  // in 1/kShareScale of a GPU, for fair share
  for (const auto& gpu : gpus) {
    if (gpu.held && gpu.holder_uid) {
      ++held_by_user[*gpu.holder_uid];
      share_by_user[*gpu.holder_uid] += kShareScale;
    }
    for (const auto& [uid, part] : gpu.shared_by) share_by_user[uid] += part;
  }

  for (auto& [uid, indices] : by_user) {
    std::sort(indices.begin(), indices.end(),
              [&](std::size_t a, std::size_t b) { return requests[a].seq < requests[b].seq; });
    std::uint64_t share = share_by_user[uid];
    std::size_t taking_part = 0;
    for (std::size_t i : indices) {
      const PlanRequest& r = requests[i];
      const auto& max_waiting = r.limits.max_waiting;
      if (r.entered_over_limit || (max_waiting && taking_part >= *max_waiting)) {
        held_back[i] = true;
        continue;
      }
      ++taking_part;
      keys[i].priority_class = r.priority == Priority::kLow ? 1 : 0;
      keys[i].share = policy == QueuePolicy::kFairShare ? share : 0;
      keys[i].last_served = policy == QueuePolicy::kFairShare ? r.user_last_served : 0;
      keys[i].seq = r.seq;
      share += std::uint64_t{r.needed} * kShareScale;
    }
  }

  // Room in the queue for requests that registered over the limit: the earliest may enter.
  std::vector<bool> may_enter(requests.size(), false);
  for (const auto& [uid, indices] : by_user) {
    std::size_t taking_part = 0;
    for (std::size_t i : indices) taking_part += held_back[i] ? 0 : 1;
    for (std::size_t i : indices) {
      const auto& max_waiting = requests[i].limits.max_waiting;
      if (!requests[i].entered_over_limit || (max_waiting && taking_part >= *max_waiting)) continue;
      may_enter[i] = true;
      ++taking_part;
    }
  }

  // Sorted as one flat key per request (held-back ones last, by arrival), for a queue of
  // thousands sorted at every plan.
  struct Sortable {
    bool held_back;
    OrderKey key;
    std::size_t index;
  };
  std::vector<Sortable> sortable(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    sortable[i] = Sortable{held_back[i], keys[i], i};
    if (held_back[i]) sortable[i].key = OrderKey{0, 0, 0, requests[i].seq};
  }
  std::sort(sortable.begin(), sortable.end(), [](const Sortable& a, const Sortable& b) {
    if (a.held_back != b.held_back) return !a.held_back;
    return a.key.tie() < b.key.tie();
  });
  std::vector<std::size_t> order(requests.size());
  for (std::size_t i = 0; i < sortable.size(); ++i) order[i] = sortable[i].index;

  // Walk the order over the free GPUs. claimed_by: a free GPU given or reserved, and to whom.
  std::set<std::string> free;
  std::set<std::string> known;
  for (const auto& gpu : gpus) {
    known.insert(gpu.uuid);
    if (!gpu.held) free.insert(gpu.uuid);
  }
  struct Claim {
    std::size_t by;
    bool given;
  };
  std::map<std::string, Claim> claimed;
  std::map<uid_t, std::uint64_t> given_to_user;

  Plan plan;
  plan.position_of.assign(requests.size(), 0);
  for (std::size_t index : order) {
    PlanRequest& r = requests[index];
    Placement placement;
    placement.request = index;
    const bool over_gpu_limit =
        !held_back[index] && r.limits.max_gpus &&
        held_by_user[r.uid] + given_to_user[r.uid] + r.needed > *r.limits.max_gpus;
    if (r.details_pending && !held_back[index] && !over_gpu_limit) {
      // Only a free GPU that nobody earlier was given or reserved can change anything now.
      const bool free_left = free.size() > claimed.size();
      bool takes_part = false;
      if (free_left && load) {
        r.details_pending = false;
        takes_part = load(index, r);
      }
      if (!takes_part) {
        placement.standing = QueueStanding::kWaiting;
        plan.position_of[index] = plan.order.size();
        plan.order.push_back(std::move(placement));
        continue;
      }
    }
    if (held_back[index]) {
      placement.standing = QueueStanding::kOverWaitingLimit;
      placement.may_enter = may_enter[index];
    } else if (over_gpu_limit) {
      placement.standing = QueueStanding::kOverGpuLimit;
    } else {
      const std::set<std::string> unhealthy(r.unhealthy.begin(), r.unhealthy.end());
      std::vector<std::string> usable;
      for (const auto& uuid : r.candidates) {
        Obstacle obstacle{uuid, Obstacle::Kind::kHeld, std::nullopt};
        if (!known.count(uuid)) {
          obstacle.kind = Obstacle::Kind::kMissing;
        } else if (!free.count(uuid)) {
          obstacle.kind = Obstacle::Kind::kHeld;
        } else if (auto claim = claimed.find(uuid); claim != claimed.end()) {
          obstacle.kind = claim->second.given ? Obstacle::Kind::kGiven : Obstacle::Kind::kReserved;
          obstacle.by = claim->second.by;
        } else if (unhealthy.count(uuid)) {
          obstacle.kind = Obstacle::Kind::kUnhealthy;
        } else {
          usable.push_back(uuid);
          continue;
        }
        placement.obstacles.push_back(std::move(obstacle));
      }
      std::optional<std::vector<std::size_t>> chosen;
      if (r.named_gpus) {
        if (placement.obstacles.empty() && !usable.empty()) {
          chosen.emplace(usable.size());
          std::iota(chosen->begin(), chosen->end(), 0);
        }
      } else if (usable.size() >= r.needed && r.needed > 0) {
        chosen = choose_gpus(usable, r.needed, distance);
      }
      if (chosen) {
        placement.standing = QueueStanding::kNext;
        placement.obstacles.clear();
        for (std::size_t position : *chosen) placement.gpus.push_back(usable[position]);
        given_to_user[r.uid] += placement.gpus.size();
      } else {
        placement.standing = QueueStanding::kWaiting;
        // Reserved: later requests may not use them. Unless the request can never be served
        // (its GPUs are gone from the machine): then holding GPUs back would only starve others.
        const auto present =
            std::count_if(r.candidates.begin(), r.candidates.end(),
                          [&](const std::string& uuid) { return known.count(uuid) > 0; });
        if (static_cast<std::size_t>(present) >= r.needed &&
            (!r.named_gpus || present == static_cast<long>(r.candidates.size())))
          placement.gpus = usable;
      }
      const bool given = placement.standing == QueueStanding::kNext;
      for (const auto& uuid : placement.gpus) claimed[uuid] = Claim{index, given};
    }
    plan.position_of[index] = plan.order.size();
    plan.order.push_back(std::move(placement));
  }
  return plan;
}

}  // namespace gpulock
