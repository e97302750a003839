// The queue's plan: who is served next and which free GPUs are held back for whom.
//
// A pure function of the machine's state (which GPUs are held, and by whose users) and the
// waiting requests, so that every process computes the same plan from the same files, and so
// that it can be tested without processes. Every waiter recomputes it under the machine-wide
// acquire mutex, takes its GPUs when the plan says it is served, and wakes the others that are.
//
// Order. Requests of a user beyond that user's max_waiting (by arrival) are held back and come
// last; so are requests that registered while their user was at the limit (entered_over_limit)
// until there is room: then the first of them are marked may_enter, to register again at the
// back of the queue rather than jump ahead of requests that arrived while they were held back. The
// rest: normal priority before low; then by policy:
//   fifo:        by arrival (seq);
//   fair-share:  by the user's share = GPUs the user holds now (a shared lease weighs its part of
//                the GPU's memory) + GPUs requested by that user's earlier waiting requests; ties
//                go to the user served least recently, then by arrival. So a user with 30 queued
//                requests does not starve a colleague with one, the one who uses least goes first,
//                and users with equal shares alternate.
// Walking that order with the set of free GPUs:
//   - a request over its user's max_gpus (counting GPUs given earlier in this plan) waits and
//     reserves nothing;
//   - a request whose usable free GPUs (its candidates, free, healthy for it, not reserved or
//     given earlier in the plan) suffice is served: the best of them by topology for "any N",
//     ties going, when more than one request takes part, to the GPUs whose last lease began
//     longest ago, then to candidate order; exactly its GPUs when it named them. (Leased
//     longest ago first: a free GPU keeps its place in that order until it is leased, so a
//     waiter that plans again takes the GPU it was planned onto, while one just released goes
//     to the back. Lowest first instead left the highest free GPU idle while jobs churned
//     through the lower ones. A request alone gets candidate order, as a lone user expects.)
//   - otherwise it waits and reserves the usable free GPUs it found: later requests may not use
//     them (unless it can never be served because its GPUs are gone from the machine). So a big
//     request gathers GPUs as they free up while smaller ones use only the GPUs it cannot
//     (backfill). When free GPUs do not make up its number, it also holds back GPUs in shared
//     use (fewest shared leases first) against new shared leases, so that they drain and a
//     stream of small jobs cannot starve it.
// Shared requests (a share of each GPU's memory, several jobs per GPU) walk the same order:
//   - one is served on GPUs in shared use or free, not held by an exclusive lease, not given or
//     reserved to an earlier request, healthy for it, with enough free memory units left (after
//     what earlier shared requests were given in this plan) and fewer shared leases than its
//     job cap; packed (least free memory first) or spread (most first);
//   - one that cannot be served reserves the GPUs it waits on (those with the most free memory
//     first): later requests may not use them, so a big shared request is not starved by small
//     ones either, while later requests still use every other GPU (backfill).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpulock/config.hpp"
#include "gpulock/queue.hpp"
#include "queue/selection.h"

namespace gpulock {

// One leasable GPU of the machine.
struct PlannedGpu {
  std::string uuid;
  bool held = false;
  std::optional<uid_t> holder_uid;  // whose lease holds it, when the record says
  // Shared leases on it (several jobs by memory), by user: the part of the GPU each holds, in
  // 1/kShareScale of a GPU (its reserved memory over the GPU's). Fair share counts them so.
  std::vector<std::pair<uid_t, std::uint64_t>> shared_by = {};
  // For shared requests: held by shared leases only (`held` is true too), so that more may be
  // added; its memory in units; the units free for new shared leases (after the administrator's
  // reserve, memory used outside gpulock and the units held); and the shared leases on it.
  // A backend without shared leases leaves these at zero.
  bool shared_use = false;
  std::uint32_t total_units = 0;
  std::uint32_t free_units = 0;
  unsigned shared_jobs = 0;
  // When its last lease began (ns since the epoch; 0 = never, or unknown to the backend). Of the
  // free GPUs, a request takes those leased longest ago first (see "Walking that order").
  std::int64_t last_leased_ns = 0;
};

// Fair-share shares are counted in 1/kShareScale of a GPU, so that a shared lease of half a
// GPU's memory weighs half a GPU.
inline constexpr std::uint64_t kShareScale = 1024;

// One request taking part in the plan.
struct PlanRequest {
  std::uint64_t seq = 0;  // arrival order, unique
  uid_t uid = 0;
  Priority priority = Priority::kNormal;
  unsigned needed = 1;
  bool named_gpus = false;  // needs exactly all of `candidates` (then needed == their number)
  std::vector<std::string> candidates;  // UUIDs it may ever use, in preference order
  std::vector<std::string> unhealthy;   // candidates it cannot use now (health filters)
  UserLimits limits;
  bool entered_over_limit = false;
  std::int64_t user_last_served = 0;  // when its user was last given GPUs (any unit; 0 = never)
  // Only the fields that order the queue are known; candidates and health come from the
  // loader, if the plan needs them (see plan_queue).
  bool details_pending = false;
  // A shared request: the memory units it wants on each of its GPUs, or else 1/shared_slots of
  // each GPU's units; both 0 for an exclusive request (whole GPUs).
  std::uint32_t shared_units = 0;
  std::uint32_t shared_slots = 0;
  std::optional<unsigned> job_cap;  // shared leases a GPU may carry with it (slots, config)
  bool spread = false;              // the emptiest GPUs first instead of packing
  bool shared() const { return shared_units > 0 || shared_slots > 0; }
  // The units it wants on a GPU of `total_units`.
  std::uint32_t units_on(std::uint32_t total_units) const;
};

// Why a request lacks a GPU it could use.
struct Obstacle {
  enum class Kind {
    kHeld,       // a lease holds it
    kReserved,   // free, but reserved for an earlier request (`by`)
    kGiven,      // free, but given to an earlier request in this plan (`by`)
    kUnhealthy,  // free, but fails this request's health filters
    kMissing,    // not among the machine's GPUs now
    kFull,       // in shared use with too little free memory (shared)
    kJobCap,     // in shared use with as many shared leases as the request's job cap (shared)
  };
  std::string uuid;
  Kind kind = Kind::kHeld;
  std::optional<std::size_t> by;   // index into the requests
  std::uint32_t wanted_units = 0;  // kFull: the memory units the request wants on the GPU
};

struct Placement {
  std::size_t request = 0;  // index into the requests
  QueueStanding standing = QueueStanding::kWaiting;
  // kNext: the GPUs it takes (in candidate order); kWaiting: the free GPUs reserved for it.
  std::vector<std::string> gpus;
  std::vector<Obstacle> obstacles;  // kWaiting: why it lacks each other candidate
  bool may_enter = false;           // kOverWaitingLimit: there is room for it now
  // kWaiting: GPUs in shared use held back for it (no new shared lease starts there), so that
  // they drain for an exclusive request or gather memory for a shared one.
  std::vector<std::string> held_back;
};

struct Plan {
  std::vector<Placement> order;  // serving order; held-back requests last
  // The placement of request i (index into `order`).
  const Placement& of(std::size_t request) const;
  std::vector<std::size_t> position_of;  // request index -> index into `order`
};

Plan plan_queue(QueuePolicy policy, const std::vector<PlannedGpu>& gpus,
                const std::vector<PlanRequest>& requests, const DistanceFunction& distance);

// What ordering needs of a request (see plan_queue), and the order it gives: the same for a
// queue of thousands whose other details are never read (LocalBackend plans only its head).
struct OrderInput {
  std::uint64_t seq = 0;
  uid_t uid = 0;
  Priority priority = Priority::kNormal;
  unsigned needed = 1;
  bool entered_over_limit = false;
  std::uint32_t shared_units = 0;
  std::uint32_t shared_slots = 0;
  std::optional<unsigned> max_waiting;  // its user's limit
  std::int64_t user_last_served = 0;
};

// Fills `in` with the order input of anything that carries a request's ordering fields under
// these names (a PlanRequest, a Ticket, an index slot), given its user's waiting limit and when
// the user was last served. In place: a queue of thousands fills one per waiter per plan, and an
// input built aside and copied in stalls the CPU on every copy.
template <typename Request>
void fill_order_input(OrderInput& in, const Request& r, std::optional<unsigned> max_waiting,
                      std::int64_t user_last_served) {
  in.seq = r.seq;
  in.uid = r.uid;
  in.priority = r.priority;
  in.needed = r.needed;
  in.entered_over_limit = r.entered_over_limit;
  in.shared_units = r.shared_units;
  in.shared_slots = r.shared_slots;
  in.max_waiting = max_waiting;
  in.user_last_served = user_last_served;
}

template <typename Request>
OrderInput order_input(const Request& r, std::optional<unsigned> max_waiting,
                       std::int64_t user_last_served) {
  OrderInput in;
  fill_order_input(in, r, max_waiting, user_last_served);
  return in;
}

struct QueueOrder {
  std::vector<std::size_t> order;  // request indices in serving order, held-back ones last
  std::vector<char> held_back;     // by request index: beyond its user's max_waiting
  std::vector<char> may_enter;     // by request index: held back, and there is room for it now
};

QueueOrder order_queue(QueuePolicy policy, const std::vector<PlannedGpu>& gpus,
                       const std::vector<OrderInput>& requests);

// Fills in a request whose details are pending (its candidates and health), and says whether it
// still takes part: false for one found gone (its waiter ended), which then takes and reserves
// nothing.
using RequestLoader = std::function<bool(std::size_t index, PlanRequest& request)>;

// The same plan, reading requests' details only when they matter: the walk calls `load` for a
// request with details_pending when it reaches it while some free GPU is neither given nor
// reserved. Requests it reaches after that cannot change who is served or what is reserved, so
// they are placed as waiting without their obstacles. The cost of a plan thus follows the
// requests ahead of the last free GPU, not the length of the queue.
Plan plan_queue(QueuePolicy policy, const std::vector<PlannedGpu>& gpus,
                std::vector<PlanRequest>& requests, const DistanceFunction& distance,
                const RequestLoader& load);

// A GPU that a request reached later in a walk could still claim (take, reserve, or hold back):
// nobody earlier was given, reserved or held it back as a whole, and it is free or in shared use.
// Such GPUs matter only while some GPU is open (free and not given, or with memory left for
// shared leases): a request walked after the last one closes waits, and claims nothing.
struct ClaimableGpu {
  std::string uuid;
  bool whole = false;       // free, and no part given: an exclusive request may take or reserve it
  bool shared_use = false;  // held by shared leases only (an exclusive request holds it back)
};

// The walk of plan_queue along an order made before (by order_queue, of these requests or of a
// longer queue whose head they are). With `claimable_after`, also says which GPUs were still
// claimable once the first `prefix` requests of the order were walked: none when no GPU was
// open then, and then no request further back in that longer queue could have been served or
// claimed anything; otherwise only a request that could claim one of them could. GPUs only
// close as a walk goes on.
Plan plan_queue_in_order(const std::vector<PlannedGpu>& gpus, std::vector<PlanRequest>& requests,
                         const QueueOrder& order, const DistanceFunction& distance,
                         const RequestLoader& load, std::size_t prefix = 0,
                         std::vector<ClaimableGpu>* claimable_after = nullptr);

}  // namespace gpulock
