// The queue planner (src/queue/schedule.h): order by policy, serving, reserving, backfill, limits.
#include "queue/schedule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "local/usability_hint.h"

namespace gpulock {

// Readable failure messages for the planner's enums (found by GoogleTest through ADL).
inline void PrintTo(QueueStanding standing, std::ostream* os) {
  *os << queue_standing_name(standing);
}
inline void PrintTo(Obstacle::Kind kind, std::ostream* os) {
  switch (kind) {
    case Obstacle::Kind::kHeld:
      *os << "held";
      return;
    case Obstacle::Kind::kReserved:
      *os << "reserved";
      return;
    case Obstacle::Kind::kGiven:
      *os << "given";
      return;
    case Obstacle::Kind::kUnhealthy:
      *os << "unhealthy";
      return;
    case Obstacle::Kind::kMissing:
      *os << "missing";
      return;
    case Obstacle::Kind::kFull:
      *os << "full";
      return;
    case Obstacle::Kind::kJobCap:
      *os << "job cap";
      return;
  }
  *os << "kind " << static_cast<int>(kind);
}

namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using Kind = Obstacle::Kind;
using Strings = std::vector<std::string>;

std::string Uuid(int i) {
  return "GPU-" + std::to_string(i);
}

Strings Uuids(std::initializer_list<int> indices) {
  Strings out;
  for (int i : indices) out.push_back(Uuid(i));
  return out;
}

Strings UuidRange(int n) {
  Strings out;
  for (int i = 0; i < n; ++i) out.push_back(Uuid(i));
  return out;
}

// The index of "GPU-N"; -1 for anything else.
int IndexOf(const std::string& uuid) {
  if (uuid.rfind("GPU-", 0) != 0 || uuid.size() == 4) return -1;
  for (std::size_t i = 4; i < uuid.size(); ++i)
    if (uuid[i] < '0' || uuid[i] > '9') return -1;
  return std::stoi(uuid.substr(4));
}

int ZeroDistance(const std::string&, const std::string&) {
  return 0;
}

int IndexDistance(const std::string& a, const std::string& b) {
  return std::abs(IndexOf(a) - IndexOf(b));
}

PlannedGpu Free(int i) {
  return PlannedGpu{Uuid(i), false, std::nullopt};
}

PlannedGpu Held(int i, std::optional<uid_t> holder = std::nullopt) {
  return PlannedGpu{Uuid(i), true, holder};
}

std::vector<PlannedGpu> FreeGpus(int n) {
  std::vector<PlannedGpu> out;
  for (int i = 0; i < n; ++i) out.push_back(Free(i));
  return out;
}

PlanRequest Any(std::uint64_t seq, uid_t uid, unsigned needed, Strings candidates) {
  PlanRequest request;
  request.seq = seq;
  request.uid = uid;
  request.needed = needed;
  request.candidates = std::move(candidates);
  return request;
}

PlanRequest Named(std::uint64_t seq, uid_t uid, Strings candidates) {
  PlanRequest request;
  request.seq = seq;
  request.uid = uid;
  request.named_gpus = true;
  request.needed = static_cast<unsigned>(candidates.size());
  request.candidates = std::move(candidates);
  return request;
}

PlanRequest Low(PlanRequest request) {
  request.priority = Priority::kLow;
  return request;
}

PlanRequest WithLimits(PlanRequest request, std::optional<unsigned> max_gpus,
                       std::optional<unsigned> max_waiting) {
  request.limits.max_gpus = max_gpus;
  request.limits.max_waiting = max_waiting;
  return request;
}

std::string KindName(Kind kind) {
  std::ostringstream out;
  PrintTo(kind, &out);
  return out.str();
}

std::string Describe(const Plan& plan) {
  std::ostringstream out;
  for (const Placement& p : plan.order) {
    out << "  request " << p.request << ": " << queue_standing_name(p.standing) << " [";
    for (const auto& g : p.gpus) out << ' ' << g;
    out << " ] obstacles:";
    for (const auto& o : p.obstacles) {
      out << ' ' << o.uuid << '=' << KindName(o.kind);
      if (o.by) out << "(by " << *o.by << ')';
    }
    out << '\n';
  }
  return out.str();
}

// Checks the plan's shape: every request exactly once in `order`, and position_of / of() agree.
void ExpectConsistent(const Plan& plan, std::size_t requests) {
  ASSERT_EQ(plan.order.size(), requests) << Describe(plan);
  ASSERT_EQ(plan.position_of.size(), requests) << Describe(plan);
  std::vector<int> seen(requests, 0);
  for (const Placement& p : plan.order) {
    ASSERT_LT(p.request, requests) << Describe(plan);
    ++seen[p.request];
  }
  for (std::size_t i = 0; i < requests; ++i) {
    EXPECT_EQ(seen[i], 1) << "request " << i << "\n" << Describe(plan);
    ASSERT_LT(plan.position_of[i], requests);
    EXPECT_EQ(plan.order[plan.position_of[i]].request, i);
    EXPECT_EQ(&plan.of(i), &plan.order[plan.position_of[i]]);
  }
}

Plan RunPlan(QueuePolicy policy, const std::vector<PlannedGpu>& gpus,
             const std::vector<PlanRequest>& requests,
             const DistanceFunction& distance = ZeroDistance) {
  Plan plan = plan_queue(policy, gpus, requests, distance);
  ExpectConsistent(plan, requests.size());
  return plan;
}

std::vector<std::size_t> OrderOf(const Plan& plan) {
  std::vector<std::size_t> out;
  for (const Placement& p : plan.order) out.push_back(p.request);
  return out;
}

std::optional<Obstacle> ObstacleFor(const Placement& placement, const std::string& uuid) {
  std::optional<Obstacle> found;
  int count = 0;
  for (const Obstacle& o : placement.obstacles)
    if (o.uuid == uuid) {
      found = o;
      ++count;
    }
  EXPECT_LE(count, 1) << "several obstacles for " << uuid;
  return found;
}

// Expects `placement` to list `uuid` as an obstacle of `kind` (by `by`, when given).
void ExpectObstacle(const Placement& placement, const std::string& uuid, Kind kind,
                    std::optional<std::size_t> by = std::nullopt) {
  const std::optional<Obstacle> o = ObstacleFor(placement, uuid);
  ASSERT_TRUE(o.has_value()) << "no obstacle for " << uuid << " of request " << placement.request;
  EXPECT_EQ(o->kind, kind) << uuid << " of request " << placement.request;
  if (kind == Kind::kReserved || kind == Kind::kGiven) {
    ASSERT_TRUE(by.has_value());
    ASSERT_TRUE(o->by.has_value()) << uuid << " of request " << placement.request;
    EXPECT_EQ(*o->by, *by) << uuid << " of request " << placement.request;
  }
}

// --- Order ------------------------------------------------------------------------------------

TEST(PlanOrder, EmptyQueue) {
  const Plan plan = RunPlan(QueuePolicy::kFairShare, FreeGpus(2), {});
  EXPECT_THAT(plan.order, IsEmpty());
  EXPECT_THAT(plan.position_of, IsEmpty());
}

TEST(PlanOrder, FifoBySeqRegardlessOfInputOrder) {
  // Distinct users with very different shares: fifo ignores them.
  const std::vector<PlannedGpu> gpus = {Held(0, 7), Held(1, 7), Held(2, 7)};
  const std::vector<PlanRequest> requests = {
      Any(40, 7, 1, UuidRange(3)), Any(10, 8, 1, UuidRange(3)), Any(30, 7, 2, UuidRange(3)),
      Any(20, 9, 1, UuidRange(3)), Any(50, 8, 1, UuidRange(3))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, requests);
  EXPECT_THAT(OrderOf(plan), ElementsAre(1, 3, 2, 0, 4));
  for (const Placement& p : plan.order) EXPECT_EQ(p.standing, QueueStanding::kWaiting);
}

TEST(PlanOrder, FifoIgnoresUsersQueuedRequests) {
  // Under fifo, a user with 30 queued requests keeps them all ahead of a later colleague.
  std::vector<PlanRequest> requests;
  for (std::uint64_t i = 1; i <= 30; ++i) requests.push_back(Any(i, 1000, 1, Uuids({0})));
  requests.push_back(Any(31, 2000, 1, Uuids({0})));
  const Plan plan = RunPlan(QueuePolicy::kFifo, {Held(0)}, requests);
  EXPECT_EQ(plan.position_of[30], 30u);
}

TEST(PlanOrder, FairShareColleagueWithOneRequestGoesSecond) {
  std::vector<PlanRequest> requests;
  for (std::uint64_t i = 1; i <= 30; ++i) requests.push_back(Any(i, 1000, 1, Uuids({0})));
  requests.push_back(Any(31, 2000, 1, Uuids({0})));
  const Plan plan = RunPlan(QueuePolicy::kFairShare, {Held(0)}, requests);
  // A's first (share 0, seq 1), then B (share 0, seq 31), then A's others by share = rank.
  std::vector<std::size_t> expected = {0, 30};
  for (std::size_t i = 1; i < 30; ++i) expected.push_back(i);
  EXPECT_EQ(OrderOf(plan), expected);
}

// Equal shares: the user served least recently goes first, so users alternate on one GPU
// (user 1 arrived first but was just served; user 2 never was).
TEST(PlanOrder, FairShareTiesGoToTheUserServedLeastRecently) {
  PlanRequest a = Any(1, 1, 1, UuidRange(1));
  a.user_last_served = 2000;
  PlanRequest b = Any(5, 2, 1, UuidRange(1));
  b.user_last_served = 1000;
  const Plan fair = RunPlan(QueuePolicy::kFairShare, FreeGpus(1), {a, b});
  EXPECT_THAT(OrderOf(fair), ElementsAre(1, 0));
  EXPECT_EQ(fair.of(1).standing, QueueStanding::kNext);
  // FIFO ignores it.
  EXPECT_THAT(OrderOf(RunPlan(QueuePolicy::kFifo, FreeGpus(1), {a, b})), ElementsAre(0, 1));
}

TEST(PlanOrder, FairShareUserHoldingAGpuGoesAfterOneHoldingNone) {
  std::vector<PlanRequest> requests;
  for (std::uint64_t i = 1; i <= 30; ++i) requests.push_back(Any(i, 1000, 1, Uuids({1})));
  requests.push_back(Any(31, 2000, 1, Uuids({1})));
  const Plan plan = RunPlan(QueuePolicy::kFairShare, {Held(0, 1000), Held(1)}, requests);
  // B (share 0) first; then A's requests with shares 1, 2, ... in seq order.
  std::vector<std::size_t> expected = {30};
  for (std::size_t i = 0; i < 30; ++i) expected.push_back(i);
  EXPECT_EQ(OrderOf(plan), expected);
}

TEST(PlanOrder, FairShareCountsGpusRequestedNotRequests) {
  // A: a 4-GPU request then a 1-GPU one (share 4). B: four 1-GPU requests (shares 0..3).
  const std::vector<PlanRequest> requests = {
      Any(1, 1000, 4, UuidRange(4)), Any(2, 1000, 1, UuidRange(4)), Any(3, 2000, 1, UuidRange(4)),
      Any(4, 2000, 1, UuidRange(4)), Any(5, 2000, 1, UuidRange(4)), Any(6, 2000, 1, UuidRange(4))};
  const std::vector<PlannedGpu> gpus = {Held(0), Held(1), Held(2), Held(3)};
  const Plan plan = RunPlan(QueuePolicy::kFairShare, gpus, requests);
  EXPECT_THAT(OrderOf(plan), ElementsAre(0, 2, 3, 4, 5, 1));
}

TEST(PlanOrder, FairShareCountsHeldGpusOfTheUserOnly) {
  // A holds 3 GPUs, B holds 1, C's holder is unknown; D holds none.
  const std::vector<PlannedGpu> gpus = {Held(0, 1), Held(1, 1), Held(2, 1),
                                        Held(3, 2), Held(4),    Free(5)};
  const std::vector<PlanRequest> requests = {Any(1, 1, 2, Uuids({9})), Any(2, 2, 2, Uuids({9})),
                                             Any(3, 4, 2, Uuids({9}))};
  const Plan plan = RunPlan(QueuePolicy::kFairShare, gpus, requests);
  EXPECT_THAT(OrderOf(plan), ElementsAre(2, 1, 0));
}

TEST(PlanOrder, FairShareWeighsSharedLeasesByTheirMemory) {
  // A holds half of GPU 0 by memory (share 0.5), B holds GPU 1 (share 1): A goes first, though
  // B arrived first.
  PlannedGpu shared = Held(0);
  shared.shared_by = {{1, kShareScale / 2}};
  const std::vector<PlanRequest> requests = {Any(1, 2, 1, Uuids({2})), Any(2, 1, 1, Uuids({2}))};
  EXPECT_THAT(OrderOf(RunPlan(QueuePolicy::kFairShare, {shared, Held(1, 2), Held(2)}, requests)),
              ElementsAre(1, 0));
  // Three quarters of two GPUs (1.5) weigh more than B's one GPU: B first.
  PlannedGpu other = Held(3);
  other.shared_by = {{1, kShareScale / 4}, {1, kShareScale / 2}, {2, kShareScale / 4}};
  // B: 1 + 0.25 = 1.25; A: 0.5 + 0.75 = 1.25: a tie, by arrival (B's request first).
  EXPECT_THAT(
      OrderOf(RunPlan(QueuePolicy::kFairShare, {shared, Held(1, 2), Held(2), other}, requests)),
      ElementsAre(0, 1));
  other.shared_by = {{1, kShareScale / 2}, {1, kShareScale / 2}};
  EXPECT_THAT(
      OrderOf(RunPlan(QueuePolicy::kFairShare, {shared, Held(1, 2), Held(2), other}, requests)),
      ElementsAre(0, 1));
}

TEST(PlanOrder, FairShareGpuWithUnknownHolderCountsForNobodyNotEvenRoot) {
  // Root (uid 0) arrived first; a GPU held by an unknown holder must not count as root's.
  const std::vector<PlannedGpu> gpus = {Held(0), Held(1)};
  const std::vector<PlanRequest> requests = {Any(2, 1000, 1, Uuids({0})), Any(1, 0, 1, Uuids({0}))};
  const Plan plan = RunPlan(QueuePolicy::kFairShare, gpus, requests);
  EXPECT_THAT(OrderOf(plan), ElementsAre(1, 0));
}

TEST(PlanOrder, FairShareTiesBySeqRegardlessOfInputOrder) {
  // Three users each holding 1 GPU, each with one request: equal shares, so by seq.
  const std::vector<PlannedGpu> gpus = {Held(0, 10), Held(1, 20), Held(2, 30)};
  const std::vector<PlanRequest> requests = {
      Any(9, 10, 1, UuidRange(3)), Any(3, 20, 1, UuidRange(3)), Any(6, 30, 1, UuidRange(3))};
  const Plan plan = RunPlan(QueuePolicy::kFairShare, gpus, requests);
  EXPECT_THAT(OrderOf(plan), ElementsAre(1, 2, 0));
}

TEST(PlanOrder, FairShareOnlyEarlierRequestsOfTheUserCount) {
  // A's request seq 5 (share 0) goes before B's seq 1 that follows B's seq 0 (share 2).
  const std::vector<PlanRequest> requests = {Any(0, 2, 2, UuidRange(2)), Any(1, 2, 1, UuidRange(2)),
                                             Any(5, 1, 1, UuidRange(2))};
  const Plan plan = RunPlan(QueuePolicy::kFairShare, {Held(0), Held(1)}, requests);
  EXPECT_THAT(OrderOf(plan), ElementsAre(0, 2, 1));
}

TEST(PlanOrder, LowPriorityAfterAllNormalFifo) {
  const std::vector<PlanRequest> requests = {
      Low(Any(1, 1, 1, Uuids({0}))), Any(4, 2, 1, Uuids({0})), Low(Any(2, 3, 1, Uuids({0}))),
      Any(3, 4, 1, Uuids({0}))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, {Held(0)}, requests);
  EXPECT_THAT(OrderOf(plan), ElementsAre(3, 1, 0, 2));
}

TEST(PlanOrder, LowPriorityAfterAllNormalFairShare) {
  // The low-priority user holds nothing; the normal one holds 3 GPUs and is queued for more.
  const std::vector<PlannedGpu> gpus = {Held(0, 1), Held(1, 1), Held(2, 1), Held(3)};
  const std::vector<PlanRequest> requests = {Low(Any(1, 2, 1, UuidRange(4))),
                                             Any(2, 1, 4, UuidRange(4)), Any(3, 1, 1, UuidRange(4)),
                                             Low(Any(4, 3, 1, UuidRange(4)))};
  const Plan plan = RunPlan(QueuePolicy::kFairShare, gpus, requests);
  EXPECT_THAT(OrderOf(plan), ElementsAre(1, 2, 0, 3));
}

TEST(PlanOrder, LowPriorityRequestIsNotServedBeforeANormalOne) {
  // One free GPU: the normal request gets it although the low one arrived first.
  const std::vector<PlanRequest> requests = {Low(Any(1, 1, 1, Uuids({0}))),
                                             Any(2, 2, 1, Uuids({0}))};
  for (QueuePolicy policy : {QueuePolicy::kFifo, QueuePolicy::kFairShare}) {
    const Plan plan = RunPlan(policy, FreeGpus(1), requests);
    EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
    EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-0"));
    EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
    ExpectObstacle(plan.of(0), "GPU-0", Kind::kGiven, 1);
  }
}

// --- Serving ----------------------------------------------------------------------------------

TEST(PlanServe, TwoFreeGpusThreeRequests) {
  // Input order differs from seq order, so `by` must be request indices, not positions.
  const std::vector<PlanRequest> requests = {Any(3, 1, 1, UuidRange(2)), Any(1, 2, 1, UuidRange(2)),
                                             Any(2, 3, 1, UuidRange(2))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(2), requests);
  ASSERT_THAT(OrderOf(plan), ElementsAre(1, 2, 0));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_EQ(plan.of(2).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-0"));
  EXPECT_THAT(plan.of(2).gpus, ElementsAre("GPU-1"));
  const Placement& third = plan.of(0);
  EXPECT_EQ(third.standing, QueueStanding::kWaiting);
  EXPECT_THAT(third.gpus, IsEmpty());
  ASSERT_EQ(third.obstacles.size(), 2u) << Describe(plan);
  ExpectObstacle(third, "GPU-0", Kind::kGiven, 1);
  ExpectObstacle(third, "GPU-1", Kind::kGiven, 2);
}

TEST(PlanServe, AnyNTakesFirstUsableInPreferenceOrderWithoutTopology) {
  const std::vector<PlanRequest> requests = {Any(1, 1, 2, Uuids({3, 1, 2, 0}))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(4), requests);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-3", "GPU-1"));
}

TEST(PlanServe, AnyNSkipsHeldGpus) {
  const std::vector<PlannedGpu> gpus = {Held(0), Free(1), Held(2), Free(3), Free(4)};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, {Any(1, 1, 2, UuidRange(5))});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-1", "GPU-3"));
}

TEST(PlanServe, AnyNUsesOnlyItsCandidates) {
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(4),
                            {Any(1, 1, 1, Uuids({2})), Any(2, 2, 2, Uuids({2, 3}))});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-2"));
  // Free GPUs 0 and 1 are not its candidates: it waits, reserving GPU-3.
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-3"));
  ExpectObstacle(plan.of(1), "GPU-2", Kind::kGiven, 0);
  EXPECT_FALSE(ObstacleFor(plan.of(1), "GPU-0").has_value());
}

TEST(PlanServe, TopologyPrefersCloseGpus) {
  // Free: 0, 2, 3. Distance 1 for neighbours, 10 beyond: {2, 3} is the close pair.
  const DistanceFunction distance = [](const std::string& a, const std::string& b) {
    return std::abs(IndexOf(a) - IndexOf(b)) >= 2 ? 10 : 1;
  };
  const std::vector<PlannedGpu> gpus = {Free(0), Held(1), Free(2), Free(3)};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, {Any(1, 1, 2, UuidRange(4))}, distance);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-2", "GPU-3"));
}

TEST(PlanServe, TopologyConsidersOnlyUsableGpus) {
  // GPU-1 is free but given to the first request; the second picks the closest of 0, 2, 3.
  const DistanceFunction distance = [](const std::string& a, const std::string& b) {
    return std::abs(IndexOf(a) - IndexOf(b)) >= 2 ? 10 : 1;
  };
  const std::vector<PlanRequest> requests = {Any(1, 1, 1, Uuids({1})), Any(2, 2, 2, UuidRange(4))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(4), requests, distance);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-1"));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-2", "GPU-3"));
}

TEST(PlanServe, HeldGpusAreHeldObstacles) {
  const std::vector<PlannedGpu> gpus = {Held(0, 5), Held(1)};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, {Any(1, 1, 1, UuidRange(2))});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, IsEmpty());
  ASSERT_EQ(plan.of(0).obstacles.size(), 2u);
  ExpectObstacle(plan.of(0), "GPU-0", Kind::kHeld);
  ExpectObstacle(plan.of(0), "GPU-1", Kind::kHeld);
}

// Free GPUs whose last leases began at `leased` (ns; 0 = never): GPU i at leased[i].
std::vector<PlannedGpu> FreeLeasedAt(std::initializer_list<std::int64_t> leased) {
  std::vector<PlannedGpu> out;
  for (const std::int64_t at : leased) {
    out.push_back(Free(static_cast<int>(out.size())));
    out.back().last_leased_ns = at;
  }
  return out;
}

// `first`, and behind it another waiter (for a GPU that is not on the machine, so that it takes
// and reserves nothing): the free GPUs leased longest ago go first only while others wait.
std::vector<PlanRequest> WithAnotherWaiting(PlanRequest first) {
  return {first, Any(first.seq + 1, 9, 1, Uuids({99}))};
}

TEST(PlanServe, TheFreeGpuLeasedLongestAgoGoesFirst) {
  const std::vector<PlanRequest> requests = {Any(1, 1, 1, UuidRange(4)),
                                             Any(2, 2, 1, UuidRange(4))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeLeasedAt({40, 30, 10, 20}), requests);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-2"));
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-3"));
}

// With nobody else waiting, no waiter's GPU is at stake: index order, as a lone user expects
// (and as the acquire's fast path for one GPU does).
TEST(PlanServe, ARequestAloneTakesTheFreeGpusInCandidateOrder) {
  const std::vector<PlannedGpu> gpus = FreeLeasedAt({40, 30, 10, 20});
  EXPECT_THAT(RunPlan(QueuePolicy::kFifo, gpus, {Any(1, 1, 1, UuidRange(4))}).of(0).gpus,
              ElementsAre("GPU-0"));
  EXPECT_THAT(RunPlan(QueuePolicy::kFifo, gpus, {Any(1, 1, 2, UuidRange(4))}).of(0).gpus,
              ElementsAre("GPU-0", "GPU-1"));
  EXPECT_THAT(
      RunPlan(QueuePolicy::kFifo, gpus, WithAnotherWaiting(Any(1, 1, 2, UuidRange(4)))).of(0).gpus,
      ElementsAre("GPU-2", "GPU-3"));
}

TEST(PlanServe, AGpuNeverLeasedGoesBeforeOnesThatWere) {
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeLeasedAt({40, 30, 0, 20}),
                            WithAnotherWaiting(Any(1, 1, 1, UuidRange(4))));
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-2"));
}

TEST(PlanServe, GpusLeasedAtTheSameTimeGoInCandidateOrder) {
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeLeasedAt({30, 10, 20, 10}),
                            WithAnotherWaiting(Any(1, 1, 1, Uuids({3, 0, 1, 2}))));
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-3"));
}

// Several GPUs: the ones leased longest ago, listed in candidate order (the order a lease
// presents them in).
TEST(PlanServe, AnyNTakesTheGpusLeasedLongestAgoInCandidateOrder) {
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeLeasedAt({10, 40, 20, 30, 50}),
                            WithAnotherWaiting(Any(1, 1, 3, Uuids({4, 3, 2, 1, 0}))));
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-3", "GPU-2", "GPU-0"));
}

// Topology comes first; among equally close sets, the GPUs leased longest ago.
TEST(PlanServe, TopologyFirstThenTheGpusLeasedLongestAgo) {
  const DistanceFunction distance = [](const std::string& a, const std::string& b) {
    return IndexOf(a) / 2 == IndexOf(b) / 2 ? 1 : 10;  // pairs {0, 1} and {2, 3}
  };
  const std::vector<PlanRequest> requests = WithAnotherWaiting(Any(1, 1, 2, UuidRange(4)));
  EXPECT_THAT(
      RunPlan(QueuePolicy::kFifo, FreeLeasedAt({40, 30, 10, 20}), requests, distance).of(0).gpus,
      ElementsAre("GPU-2", "GPU-3"));
  EXPECT_THAT(
      RunPlan(QueuePolicy::kFifo, FreeLeasedAt({40, 10, 30, 20}), requests, distance).of(0).gpus,
      ElementsAre("GPU-0", "GPU-1"))
      << "of two equally close pairs, the one holding the GPU leased longest ago";
  EXPECT_THAT(
      RunPlan(QueuePolicy::kFifo, FreeLeasedAt({40, 10, 20, 30}), requests, distance).of(0).gpus,
      ElementsAre("GPU-0", "GPU-1"));
}

// Why the rule: the waiter first in line is planned onto the GPU that is free longest; when it
// plans again (woken), another GPU has been released meanwhile, but that one is newer, so it
// still takes the GPU it was planned onto, and the one just released goes to the next waiter.
// (Lowest index first would move it to the lower GPU each time, and leave the highest idle while
// short jobs churn through the lower ones.)
TEST(PlanServe, AWaiterPlanningAgainKeepsItsGpuWhenALowerOneIsReleased) {
  std::vector<PlannedGpu> gpus = {Held(0), Held(1), Free(2)};
  gpus[2].last_leased_ns = 10;
  const std::vector<PlanRequest> requests = {Any(1, 1, 1, UuidRange(3)),
                                             Any(2, 2, 1, UuidRange(3))};
  EXPECT_THAT(RunPlan(QueuePolicy::kFifo, gpus, requests).of(0).gpus, ElementsAre("GPU-2"));
  gpus[0] = Free(0);  // released; its lease began after GPU 2's
  gpus[0].last_leased_ns = 20;
  const Plan again = RunPlan(QueuePolicy::kFifo, gpus, requests);
  EXPECT_THAT(again.of(0).gpus, ElementsAre("GPU-2"));
  EXPECT_THAT(again.of(1).gpus, ElementsAre("GPU-0"));
}

// --- Reservation and backfill ------------------------------------------------------------------

TEST(PlanReserve, BigHeadReservesTheFreeGpuAndBlocksLaterRequests) {
  const std::vector<PlannedGpu> gpus = {Held(0, 1), Held(1, 2), Held(2, 3), Free(3)};
  const std::vector<PlanRequest> requests = {Any(1, 4, 4, UuidRange(4)),
                                             Any(2, 5, 1, UuidRange(4))};
  for (QueuePolicy policy : {QueuePolicy::kFifo, QueuePolicy::kFairShare}) {
    const Plan plan = RunPlan(policy, gpus, requests);
    ASSERT_THAT(OrderOf(plan), ElementsAre(0, 1));
    const Placement& head = plan.of(0);
    EXPECT_EQ(head.standing, QueueStanding::kWaiting);
    EXPECT_THAT(head.gpus, ElementsAre("GPU-3"));
    ASSERT_EQ(head.obstacles.size(), 3u) << Describe(plan);
    for (int i = 0; i < 3; ++i) ExpectObstacle(head, Uuid(i), Kind::kHeld);
    const Placement& small = plan.of(1);
    EXPECT_EQ(small.standing, QueueStanding::kWaiting);
    EXPECT_THAT(small.gpus, IsEmpty());
    ExpectObstacle(small, "GPU-3", Kind::kReserved, 0);
    ExpectObstacle(small, "GPU-0", Kind::kHeld);
  }
}

TEST(PlanReserve, WaitingRequestReservesAllItsUsableFreeGpus) {
  // Needs 3 of 4; two are free: it reserves both, and the next one takes neither.
  const std::vector<PlannedGpu> gpus = {Free(0), Held(1), Free(2), Held(3)};
  const std::vector<PlanRequest> requests = {Any(1, 1, 3, UuidRange(4)),
                                             Any(2, 2, 1, UuidRange(4))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, requests);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, UnorderedElementsAre("GPU-0", "GPU-2"));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(1).gpus, IsEmpty());
  ExpectObstacle(plan.of(1), "GPU-0", Kind::kReserved, 0);
  ExpectObstacle(plan.of(1), "GPU-2", Kind::kReserved, 0);
  ExpectObstacle(plan.of(1), "GPU-1", Kind::kHeld);
  ExpectObstacle(plan.of(1), "GPU-3", Kind::kHeld);
}

TEST(PlanReserve, BackfillUsesGpusTheHeadCannotUse) {
  // 5 GPUs; the head wants 4 of GPUs 0-3 (3 held): it reserves GPU-3, and a later 1-GPU request
  // may use GPU-4, which the head cannot.
  const std::vector<PlannedGpu> gpus = {Held(0, 1), Held(1, 1), Held(2, 1), Free(3), Free(4)};
  const std::vector<PlanRequest> requests = {Any(1, 2, 4, UuidRange(4)), Any(2, 3, 1, UuidRange(5)),
                                             Any(3, 4, 1, UuidRange(5))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, requests);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-3"));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-4"));
  EXPECT_EQ(plan.of(2).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(2).gpus, IsEmpty());
  ExpectObstacle(plan.of(2), "GPU-3", Kind::kReserved, 0);
  ExpectObstacle(plan.of(2), "GPU-4", Kind::kGiven, 1);
}

TEST(PlanReserve, BackfillBehindNamedHead) {
  // The head names GPUs 0-3; GPU-4 is not one of them.
  const std::vector<PlannedGpu> gpus = {Held(0, 1), Free(1), Held(2, 1), Free(3), Free(4)};
  const std::vector<PlanRequest> requests = {Named(1, 2, UuidRange(4)), Any(2, 3, 1, UuidRange(5))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, requests);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, UnorderedElementsAre("GPU-1", "GPU-3"));
  ExpectObstacle(plan.of(0), "GPU-0", Kind::kHeld);
  ExpectObstacle(plan.of(0), "GPU-2", Kind::kHeld);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-4"));
}

TEST(PlanReserve, ReservationsChainAlongTheOrder) {
  // Three 2-GPU requests over GPUs {0,1,2}, one free at a time for each: each reserves what it
  // finds, in order.
  const std::vector<PlannedGpu> gpus = {Free(0), Free(1), Held(2), Free(3)};
  const std::vector<PlanRequest> requests = {
      Any(1, 1, 2, Uuids({0, 2})), Any(2, 2, 2, Uuids({0, 1, 2})), Any(3, 3, 1, Uuids({1, 3}))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, requests);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-0"));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-1"));
  ExpectObstacle(plan.of(1), "GPU-0", Kind::kReserved, 0);
  ExpectObstacle(plan.of(1), "GPU-2", Kind::kHeld);
  EXPECT_EQ(plan.of(2).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(2).gpus, ElementsAre("GPU-3"));
}

// --- Named GPUs --------------------------------------------------------------------------------

TEST(PlanNamed, ServedOnlyWhenAllNamedAreUsable) {
  const std::vector<PlannedGpu> gpus = {Free(0), Held(1), Free(2)};
  const std::vector<PlanRequest> requests = {
      Named(1, 1, Uuids({0, 1})), Any(2, 2, 1, Uuids({0, 1, 2})), Any(3, 3, 1, Uuids({0}))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, requests);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-0"));
  ASSERT_EQ(plan.of(0).obstacles.size(), 1u) << Describe(plan);
  ExpectObstacle(plan.of(0), "GPU-1", Kind::kHeld);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-2"));
  EXPECT_EQ(plan.of(2).standing, QueueStanding::kWaiting);
  ExpectObstacle(plan.of(2), "GPU-0", Kind::kReserved, 0);
}

TEST(PlanNamed, TakesExactlyItsGpusInCandidateOrderIgnoringTopology) {
  // Topology would prefer {2, 3}; a named request takes exactly what it named.
  const DistanceFunction distance = [](const std::string& a, const std::string& b) {
    return std::abs(IndexOf(a) - IndexOf(b)) >= 2 ? 10 : 1;
  };
  const Plan plan =
      RunPlan(QueuePolicy::kFifo, FreeGpus(4), {Named(1, 1, Uuids({3, 0}))}, distance);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-3", "GPU-0"));
}

TEST(PlanNamed, NamedGpuGivenEarlierBlocks) {
  const std::vector<PlanRequest> requests = {Any(1, 1, 1, Uuids({1})), Named(2, 2, Uuids({0, 1}))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(2), requests);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-0"));
  ExpectObstacle(plan.of(1), "GPU-1", Kind::kGiven, 0);
}

// --- Health filters -----------------------------------------------------------------------------

TEST(PlanUnhealthy, UnhealthyForOneRequestIsFineForAnother) {
  PlanRequest a = Any(1, 1, 1, Uuids({0}));
  a.unhealthy = Uuids({0});
  const std::vector<PlanRequest> requests = {a, Any(2, 2, 1, Uuids({0}))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(1), requests);
  ASSERT_THAT(OrderOf(plan), ElementsAre(0, 1));
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, IsEmpty());
  ASSERT_EQ(plan.of(0).obstacles.size(), 1u);
  ExpectObstacle(plan.of(0), "GPU-0", Kind::kUnhealthy);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-0"));
}

TEST(PlanUnhealthy, WaitingRequestReservesOnlyHealthyGpus) {
  PlanRequest a = Any(1, 1, 2, UuidRange(3));
  a.unhealthy = Uuids({0});
  const std::vector<PlannedGpu> gpus = {Free(0), Free(1), Held(2)};
  const std::vector<PlanRequest> requests = {a, Any(2, 2, 1, UuidRange(3))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, requests);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-1"));
  ExpectObstacle(plan.of(0), "GPU-0", Kind::kUnhealthy);
  ExpectObstacle(plan.of(0), "GPU-2", Kind::kHeld);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-0"));
}

TEST(PlanUnhealthy, AnyNServedFromHealthyOnes) {
  PlanRequest a = Any(1, 1, 2, UuidRange(4));
  a.unhealthy = Uuids({0, 2});
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(4), {a});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-1", "GPU-3"));
}

TEST(PlanUnhealthy, NamedRequestWithAnUnhealthyGpuWaits) {
  PlanRequest a = Named(1, 1, Uuids({0, 1}));
  a.unhealthy = Uuids({1});
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(2), {a, Any(2, 2, 1, Uuids({1}))});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-0"));
  ExpectObstacle(plan.of(0), "GPU-1", Kind::kUnhealthy);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-1"));
}

// --- Missing GPUs
// ---------------------------------------------------------------------------------

TEST(PlanMissing, CandidateNotOnTheMachineIsMissing) {
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(3), {Any(1, 1, 1, {"GPU-9"})});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, IsEmpty());
  ASSERT_EQ(plan.of(0).obstacles.size(), 1u);
  ExpectObstacle(plan.of(0), "GPU-9", Kind::kMissing);
}

TEST(PlanMissing, NamedRequestWithAMissingGpuIsNeverServed) {
  const std::vector<PlanRequest> requests = {Named(1, 1, {"GPU-0", "GPU-gone"})};
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(4), requests);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  ExpectObstacle(plan.of(0), "GPU-gone", Kind::kMissing);
  for (const auto& g : plan.of(0).gpus) EXPECT_NE(g, "GPU-gone");
}

TEST(PlanMissing, AnyNWithAMissingCandidateUsesTheOthers) {
  const Plan plan =
      RunPlan(QueuePolicy::kFifo, FreeGpus(2), {Any(1, 1, 2, {"GPU-7", "GPU-0", "GPU-1"})});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-0", "GPU-1"));
}

// A request that can never be served (its GPUs are gone) must not hold back GPUs for ever.
TEST(PlanMissing, AnyNShortBecauseOfAMissingCandidateWaitsWithoutReserving) {
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(2),
                            {Any(1, 1, 2, {"GPU-7", "GPU-0"}), Any(2, 2, 1, {"GPU-0"})});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, IsEmpty());
  ExpectObstacle(plan.of(0), "GPU-7", Kind::kMissing);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-0"));
}

// A request that registered while its user was at max_waiting stays held back, even once there
// is room, until it registers again at the back (may_enter tells it to); so it cannot jump
// ahead of another user's request that arrived while it was held back.
TEST(PlanWaitingLimit, RequestThatEnteredOverTheLimitWaitsToReEnter) {
  PlanRequest a2 = WithLimits(Any(2, 1, 1, UuidRange(1)), {}, 2);
  PlanRequest a3 = WithLimits(Any(3, 1, 1, UuidRange(1)), {}, 2);
  a3.entered_over_limit = true;
  PlanRequest a4 = WithLimits(Any(4, 1, 1, UuidRange(1)), {}, 2);
  a4.entered_over_limit = true;
  const PlanRequest b = Any(5, 2, 1, UuidRange(1));
  const Plan plan = RunPlan(QueuePolicy::kFifo, {Held(0, 1)}, {a2, a3, a4, b});
  EXPECT_THAT(OrderOf(plan), ElementsAre(0, 3, 1, 2));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kOverWaitingLimit);
  EXPECT_TRUE(plan.of(1).may_enter);   // room for one more of user 1's requests
  EXPECT_FALSE(plan.of(2).may_enter);  // but only one
  EXPECT_FALSE(plan.of(0).may_enter);
}

// --- max_gpus
// -------------------------------------------------------------------------------------

TEST(PlanGpuLimit, UserAtLimitWaitsReservesNothingAndOthersGetTheGpu) {
  const std::vector<PlannedGpu> gpus = {Held(0, 1), Held(1, 1), Free(2)};
  const std::vector<PlanRequest> requests = {WithLimits(Any(1, 1, 1, UuidRange(3)), 2, {}),
                                             Any(2, 2, 1, UuidRange(3))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, requests);
  ASSERT_THAT(OrderOf(plan), ElementsAre(0, 1));
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kOverGpuLimit);
  EXPECT_THAT(plan.of(0).gpus, IsEmpty());
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-2"));
}

TEST(PlanGpuLimit, BelowTheLimitIsServed) {
  const std::vector<PlannedGpu> gpus = {Held(0, 1), Free(1), Free(2)};
  const Plan plan =
      RunPlan(QueuePolicy::kFifo, gpus, {WithLimits(Any(1, 1, 2, UuidRange(3)), 3, {})});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-1", "GPU-2"));
}

TEST(PlanGpuLimit, RequestThatWouldExceedTheLimitIsOverIt) {
  // Holds 1 of at most 2, asks for 2 more: serving it would exceed the limit.
  const std::vector<PlannedGpu> gpus = {Held(0, 1), Free(1), Free(2)};
  const std::vector<PlanRequest> requests = {WithLimits(Any(1, 1, 2, UuidRange(3)), 2, {}),
                                             Any(2, 2, 1, UuidRange(3))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, requests);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kOverGpuLimit);
  EXPECT_THAT(plan.of(0).gpus, IsEmpty());
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-1"));
}

TEST(PlanGpuLimit, OtherUsersHeldGpusDoNotCount) {
  const std::vector<PlannedGpu> gpus = {Held(0, 2), Held(1, 2), Held(2), Free(3)};
  const Plan plan =
      RunPlan(QueuePolicy::kFifo, gpus, {WithLimits(Any(1, 1, 1, UuidRange(4)), 1, {})});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-3"));
}

TEST(PlanGpuLimit, CountsGpusGivenEarlierInThePlan) {
  const std::vector<PlanRequest> requests = {WithLimits(Any(1, 1, 1, UuidRange(2)), 1, {}),
                                             WithLimits(Any(2, 1, 1, UuidRange(2)), 1, {}),
                                             Any(3, 2, 1, UuidRange(2))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(2), requests);
  ASSERT_THAT(OrderOf(plan), ElementsAre(0, 1, 2));
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre("GPU-0"));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kOverGpuLimit);
  EXPECT_THAT(plan.of(1).gpus, IsEmpty());
  // The second reserved nothing, so the third gets the other free GPU.
  EXPECT_EQ(plan.of(2).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(2).gpus, ElementsAre("GPU-1"));
}

TEST(PlanGpuLimit, ReservationsAndWaitingRequestsDoNotCountAsGiven) {
  // Limit 3. The user's first request (3 GPUs) waits, reserving GPUs 0 and 1; the second asks
  // for 2: only held and given GPUs count (0 + 0 + 2 <= 3), not the 2 reserved nor the 3 asked.
  const std::vector<PlannedGpu> gpus = {Free(0), Free(1), Held(2), Free(3), Free(4)};
  const std::vector<PlanRequest> requests = {WithLimits(Any(1, 1, 3, Uuids({0, 1, 2})), 3, {}),
                                             WithLimits(Any(2, 1, 2, Uuids({0, 1, 3, 4})), 3, {})};
  const Plan plan = RunPlan(QueuePolicy::kFifo, gpus, requests);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).gpus, UnorderedElementsAre("GPU-0", "GPU-1"));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre("GPU-3", "GPU-4"));
}

TEST(PlanGpuLimit, ZeroLimitNeverServes) {
  const Plan plan = RunPlan(QueuePolicy::kFairShare, FreeGpus(2),
                            {WithLimits(Any(1, 1, 1, UuidRange(2)), 0, {})});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kOverGpuLimit);
  EXPECT_THAT(plan.of(0).gpus, IsEmpty());
}

// --- max_waiting
// ----------------------------------------------------------------------------------

TEST(PlanWaitingLimit, RequestsBeyondTheLimitAreHeldBackLast) {
  // User 1 may have 2 requests in the queue; it has 4 (input order shuffled). GPUs are free,
  // yet the two latest ones take no part.
  const auto limited = [](std::uint64_t seq) {
    return WithLimits(Any(seq, 1, 1, UuidRange(8)), {}, 2);
  };
  const std::vector<PlanRequest> requests = {limited(4), limited(2), Any(5, 2, 1, UuidRange(8)),
                                             limited(3), limited(1)};
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(8), requests);
  const std::vector<std::size_t> order = OrderOf(plan);
  EXPECT_THAT(std::vector<std::size_t>(order.begin(), order.begin() + 3), ElementsAre(4, 1, 2));
  EXPECT_THAT(std::vector<std::size_t>(order.begin() + 3, order.end()), UnorderedElementsAre(0, 3));
  for (std::size_t i : {4, 1, 2}) EXPECT_EQ(plan.of(i).standing, QueueStanding::kNext);
  for (std::size_t i : {0, 3}) {
    EXPECT_EQ(plan.of(i).standing, QueueStanding::kOverWaitingLimit);
    EXPECT_THAT(plan.of(i).gpus, IsEmpty());
  }
}

TEST(PlanWaitingLimit, HeldBackRequestsReserveNothing) {
  // Only GPU-0 is free. User 1's held-back request would otherwise be before user 2's under
  // fair share (share 1 < 5), but it is held back: it neither reserves nor takes GPU-0.
  const std::vector<PlannedGpu> gpus = {Free(0),    Held(1, 2), Held(2, 2),
                                        Held(3, 2), Held(4, 2), Held(5, 2)};
  const std::vector<PlanRequest> requests = {WithLimits(Any(1, 1, 1, Uuids({1})), {}, 1),
                                             WithLimits(Any(2, 1, 1, Uuids({0})), {}, 1),
                                             Any(3, 2, 1, Uuids({0}))};
  const Plan plan = RunPlan(QueuePolicy::kFairShare, gpus, requests);
  EXPECT_THAT(OrderOf(plan), ElementsAre(0, 2, 1));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kOverWaitingLimit);
  EXPECT_THAT(plan.of(1).gpus, IsEmpty());
  EXPECT_EQ(plan.of(2).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(2).gpus, ElementsAre("GPU-0"));
}

TEST(PlanWaitingLimit, ByArrivalEvenAcrossPriorities) {
  // The limit keeps the user's earliest request (low priority), holding back the later normal.
  const std::vector<PlanRequest> requests = {Low(WithLimits(Any(1, 1, 1, Uuids({0})), {}, 1)),
                                             WithLimits(Any(2, 1, 1, Uuids({0})), {}, 1)};
  const Plan plan = RunPlan(QueuePolicy::kFifo, FreeGpus(1), requests);
  EXPECT_THAT(OrderOf(plan), ElementsAre(0, 1));
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kOverWaitingLimit);
}

TEST(PlanWaitingLimit, ZeroHoldsBackEveryRequestOfTheUser) {
  const std::vector<PlanRequest> requests = {WithLimits(Any(1, 1, 1, UuidRange(2)), {}, 0),
                                             WithLimits(Any(2, 1, 1, UuidRange(2)), {}, 0),
                                             Any(3, 2, 1, UuidRange(2))};
  for (QueuePolicy policy : {QueuePolicy::kFifo, QueuePolicy::kFairShare}) {
    const Plan plan = RunPlan(policy, FreeGpus(2), requests);
    EXPECT_EQ(plan.order.front().request, 2u);
    EXPECT_EQ(plan.of(2).standing, QueueStanding::kNext);
    EXPECT_THAT(plan.of(2).gpus, ElementsAre("GPU-0"));
    for (std::size_t i : {0, 1}) {
      EXPECT_EQ(plan.of(i).standing, QueueStanding::kOverWaitingLimit);
      EXPECT_THAT(plan.of(i).gpus, IsEmpty());
    }
  }
}

TEST(PlanWaitingLimit, HeldBackLastEvenBehindLowPriority) {
  const std::vector<PlanRequest> requests = {WithLimits(Any(1, 1, 1, Uuids({0})), {}, 1),
                                             WithLimits(Any(2, 1, 1, Uuids({0})), {}, 1),
                                             Low(Any(3, 2, 1, Uuids({0})))};
  const Plan plan = RunPlan(QueuePolicy::kFifo, {Held(0)}, requests);
  EXPECT_THAT(OrderOf(plan), ElementsAre(0, 2, 1));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kOverWaitingLimit);
  EXPECT_EQ(plan.of(2).standing, QueueStanding::kWaiting);
}

// --- Randomized invariants
// ------------------------------------------------------------------------

struct Scenario {
  QueuePolicy policy = QueuePolicy::kFairShare;
  std::vector<PlannedGpu> gpus;
  std::vector<PlanRequest> requests;
  bool topology = false;
  bool priority_per_user = false;
  bool lease_times = false;            // the GPUs carry when their last leases began
  std::map<uid_t, UserLimits> limits;  // each user's, the same on all of its requests
  std::map<uid_t, Priority> priority;  // each user's, when priority_per_user
};

Scenario RandomScenario(std::mt19937& rng) {
  const auto chance = [&rng](double p) { return std::bernoulli_distribution(p)(rng); };
  const auto uniform = [&rng](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  Scenario s;
  s.policy = chance(0.5) ? QueuePolicy::kFifo : QueuePolicy::kFairShare;
  s.topology = chance(0.3);
  s.priority_per_user = chance(0.5);
  s.lease_times = chance(0.6);

  const int gpu_count = uniform(0, 7);
  const double held = std::uniform_real_distribution<double>(0.0, 0.8)(rng);
  for (int i = 0; i < gpu_count; ++i) {
    PlannedGpu gpu{Uuid(i), chance(held), std::nullopt};
    if (gpu.held && chance(0.8)) gpu.holder_uid = static_cast<uid_t>(uniform(0, 3));
    // When its last lease began: in some scenarios none known (as from Redis), else few values,
    // so that ties are common.
    if (s.lease_times) gpu.last_leased_ns = uniform(0, 3);
    s.gpus.push_back(gpu);
  }
  // Machine GPUs plus two that are not on the machine.
  Strings universe = UuidRange(gpu_count);
  universe.push_back("GPU-missing-a");
  universe.push_back("GPU-missing-b");

  std::map<uid_t, UserLimits>& limits = s.limits;
  std::map<uid_t, Priority>& priority = s.priority;
  for (uid_t uid = 0; uid <= 3; ++uid) {
    if (chance(0.35)) limits[uid].max_gpus = static_cast<unsigned>(uniform(0, 4));
    if (chance(0.35)) limits[uid].max_waiting = static_cast<unsigned>(uniform(0, 3));
    priority[uid] = chance(0.3) ? Priority::kLow : Priority::kNormal;
  }

  const int request_count = uniform(0, 9);
  std::vector<std::uint64_t> seqs;
  std::uint64_t seq = static_cast<std::uint64_t>(uniform(0, 3));
  for (int i = 0; i < request_count; ++i) {
    seqs.push_back(seq);
    seq += static_cast<std::uint64_t>(uniform(1, 5));
  }
  std::shuffle(seqs.begin(), seqs.end(), rng);
  for (int i = 0; i < request_count; ++i) {
    PlanRequest r;
    r.seq = seqs[static_cast<std::size_t>(i)];
    r.uid = static_cast<uid_t>(uniform(0, 3));
    r.limits = limits[r.uid];
    r.priority =
        s.priority_per_user ? priority[r.uid] : (chance(0.3) ? Priority::kLow : Priority::kNormal);
    // Candidates: a random nonempty subset of the universe in random order, mostly machine GPUs.
    Strings pool = universe;
    std::shuffle(pool.begin(), pool.end(), rng);
    for (const auto& uuid : pool) {
      const bool missing = IndexOf(uuid) < 0;
      if (chance(missing ? 0.08 : 0.6)) r.candidates.push_back(uuid);
    }
    if (r.candidates.empty()) r.candidates.push_back(pool.front());
    if (chance(0.5)) {
      // Most requests keep the machine's preference (index) order.
      std::stable_sort(
          r.candidates.begin(), r.candidates.end(), [](const std::string& a, const std::string& b) {
            return static_cast<unsigned>(IndexOf(a)) < static_cast<unsigned>(IndexOf(b));
          });
    }
    for (const auto& uuid : r.candidates)
      if (chance(0.15)) r.unhealthy.push_back(uuid);
    r.named_gpus = chance(0.3);
    if (r.named_gpus) {
      r.needed = static_cast<unsigned>(r.candidates.size());
    } else {
      const int most = static_cast<int>(r.candidates.size()) + (chance(0.1) ? 1 : 0);
      r.needed = static_cast<unsigned>(uniform(1, std::max(1, std::min(most, 4))));
    }
    s.requests.push_back(r);
  }
  return s;
}

std::string DescribeScenario(const Scenario& s) {
  std::ostringstream out;
  out << "policy " << queue_policy_name(s.policy) << (s.topology ? ", index distance" : "")
      << "\ngpus:";
  for (const auto& g : s.gpus) {
    out << ' ' << g.uuid << (g.held ? "(held" : "(free");
    if (g.holder_uid) out << " by " << *g.holder_uid;
    if (g.last_leased_ns) out << " leased at " << g.last_leased_ns;
    out << ')';
  }
  out << "\nrequests:\n";
  for (std::size_t i = 0; i < s.requests.size(); ++i) {
    const PlanRequest& r = s.requests[i];
    out << "  " << i << ": seq " << r.seq << " uid " << r.uid << ' ' << priority_name(r.priority)
        << (r.named_gpus ? " named" : " any ") << (r.named_gpus ? "" : std::to_string(r.needed))
        << " of [";
    for (const auto& c : r.candidates) out << ' ' << c;
    out << " ] unhealthy [";
    for (const auto& c : r.unhealthy) out << ' ' << c;
    out << " ]";
    if (r.limits.max_gpus) out << " max_gpus " << *r.limits.max_gpus;
    if (r.limits.max_waiting) out << " max_waiting " << *r.limits.max_waiting;
    out << '\n';
  }
  return out.str();
}

// Checks every contract of the header for one scenario, recomputing what the plan must be
// independently of the implementation.
void CheckScenario(const Scenario& s) {
  const DistanceFunction distance = s.topology ? DistanceFunction(IndexDistance) : ZeroDistance;
  const Plan plan = plan_queue(s.policy, s.gpus, s.requests, distance);
  SCOPED_TRACE(DescribeScenario(s) + "plan:\n" + Describe(plan));
  ExpectConsistent(plan, s.requests.size());
  if (::testing::Test::HasFatalFailure()) return;
  const std::size_t n = s.requests.size();

  std::map<std::string, const PlannedGpu*> machine;
  for (const auto& g : s.gpus) machine[g.uuid] = &g;
  const auto held_by = [&](uid_t uid) {
    unsigned count = 0;
    for (const auto& g : s.gpus)
      if (g.held && g.holder_uid == uid) ++count;
    return count;
  };

  // Which requests take part: each user's first max_waiting by seq.
  std::vector<bool> held_back(n, false);
  {
    std::map<uid_t, std::vector<std::size_t>> by_user;
    for (std::size_t i = 0; i < n; ++i) by_user[s.requests[i].uid].push_back(i);
    for (auto& [uid, list] : by_user) {
      std::sort(list.begin(), list.end(), [&](std::size_t a, std::size_t b) {
        return s.requests[a].seq < s.requests[b].seq;
      });
      for (std::size_t k = 0; k < list.size(); ++k) {
        const auto& limit = s.requests[list[k]].limits.max_waiting;
        if (limit && k >= *limit) held_back[list[k]] = true;
      }
    }
  }

  // Order: participants first, then the held-back; participants sorted by the policy's key.
  std::size_t participants = 0;
  for (std::size_t i = 0; i < n; ++i) participants += held_back[i] ? 0 : 1;
  for (std::size_t pos = 0; pos < n; ++pos) {
    const std::size_t i = plan.order[pos].request;
    const bool back = held_back[i];
    EXPECT_EQ(back, pos >= participants) << "request " << i << " at position " << pos;
    EXPECT_EQ(back, plan.order[pos].standing == QueueStanding::kOverWaitingLimit)
        << "request " << i;
  }
  const auto share = [&](std::size_t i) {
    std::uint64_t total = held_by(s.requests[i].uid);
    for (std::size_t j = 0; j < n; ++j)
      if (j != i && !held_back[j] && s.requests[j].uid == s.requests[i].uid &&
          s.requests[j].seq < s.requests[i].seq)
        total += s.requests[j].needed;
    return total;
  };
  const bool check_share = s.policy == QueuePolicy::kFifo || s.priority_per_user;
  for (std::size_t pos = 1; pos < participants; ++pos) {
    const PlanRequest& a = s.requests[plan.order[pos - 1].request];
    const PlanRequest& b = s.requests[plan.order[pos].request];
    const int pa = a.priority == Priority::kLow ? 1 : 0;
    const int pb = b.priority == Priority::kLow ? 1 : 0;
    EXPECT_LE(pa, pb) << "low before normal at position " << pos;
    if (pa != pb || !check_share) continue;
    if (s.policy == QueuePolicy::kFifo) {
      EXPECT_LT(a.seq, b.seq) << "fifo out of order at position " << pos;
    } else {
      const auto ka = std::make_pair(share(plan.order[pos - 1].request), a.seq);
      const auto kb = std::make_pair(share(plan.order[pos].request), b.seq);
      EXPECT_LT(ka, kb) << "fair share out of order at position " << pos << ": share " << ka.first
                        << " before " << kb.first;
    }
  }

  // Replay the walk along the plan's order.
  struct Claim {
    Kind kind;
    std::size_t by;
  };
  std::map<std::string, Claim> claimed;  // given or reserved earlier in the plan
  std::map<uid_t, unsigned> given_to;
  for (std::size_t pos = 0; pos < participants; ++pos) {
    const Placement& p = plan.order[pos];
    const PlanRequest& r = s.requests[p.request];
    SCOPED_TRACE("request " + std::to_string(p.request));
    const std::optional<unsigned>& max_gpus = r.limits.max_gpus;
    const bool over = max_gpus && held_by(r.uid) + given_to[r.uid] + r.needed > *max_gpus;
    EXPECT_EQ(p.standing == QueueStanding::kOverGpuLimit, over) << "max_gpus";
    if (p.standing == QueueStanding::kOverGpuLimit) {
      EXPECT_THAT(p.gpus, IsEmpty()) << "over the GPU limit yet reserves or takes GPUs";
      continue;
    }
    if (over) continue;

    const std::set<std::string> unhealthy(r.unhealthy.begin(), r.unhealthy.end());
    Strings usable;
    for (const auto& c : r.candidates) {
      const auto it = machine.find(c);
      if (it == machine.end() || it->second->held || unhealthy.count(c) || claimed.count(c))
        continue;
      usable.push_back(c);
    }
    const bool servable =
        r.named_gpus ? usable.size() == r.candidates.size() : usable.size() >= r.needed;
    if (servable) {
      EXPECT_EQ(p.standing, QueueStanding::kNext) << "could have been served";
      Strings expected;
      if (r.named_gpus) {
        expected = r.candidates;
      } else {
        // choose_gpus over the usable GPUs leased longest ago first (ties in candidate order)
        // while others wait, the chosen ones listed in candidate order.
        Strings oldest_first = usable;
        if (n > 1)
          std::stable_sort(oldest_first.begin(), oldest_first.end(),
                           [&](const std::string& a, const std::string& b) {
                             return machine[a]->last_leased_ns < machine[b]->last_leased_ns;
                           });
        std::set<std::string> chosen_set;
        if (const auto chosen = choose_gpus(oldest_first, r.needed, distance))
          for (std::size_t k : *chosen) chosen_set.insert(oldest_first[k]);
        for (const auto& g : usable)
          if (chosen_set.count(g)) expected.push_back(g);
      }
      EXPECT_EQ(p.gpus, expected) << "GPUs given";
      EXPECT_EQ(p.gpus.size(), r.needed);
      if (p.standing == QueueStanding::kNext) {
        for (const auto& g : p.gpus) claimed.emplace(g, Claim{Kind::kGiven, p.request});
        given_to[r.uid] += static_cast<unsigned>(p.gpus.size());
      }
      continue;
    }

    EXPECT_EQ(p.standing, QueueStanding::kWaiting) << "cannot be served";
    // A request whose GPUs are gone from the machine can never be served: it reserves nothing.
    const auto present = std::count_if(r.candidates.begin(), r.candidates.end(),
                                       [&](const std::string& c) { return machine.count(c) > 0; });
    const bool never_servable = r.named_gpus ? present != static_cast<long>(r.candidates.size())
                                             : present < static_cast<long>(r.needed);
    if (never_servable) {
      EXPECT_THAT(p.gpus, IsEmpty()) << "can never be served, yet reserves GPUs";
      usable.clear();  // its usable GPUs stay free for later requests, unexplained
    }
    EXPECT_EQ(std::set<std::string>(p.gpus.begin(), p.gpus.end()),
              std::set<std::string>(usable.begin(), usable.end()))
        << "reserved GPUs are not exactly its usable free ones";
    EXPECT_EQ(p.gpus.size(), std::set<std::string>(p.gpus.begin(), p.gpus.end()).size());
    if (p.standing != QueueStanding::kWaiting) continue;

    // Obstacles: one for each candidate it did not reserve, of a kind that is true.
    std::set<std::string> explained;
    for (const Obstacle& o : p.obstacles) {
      SCOPED_TRACE("obstacle " + o.uuid + "=" + KindName(o.kind));
      EXPECT_TRUE(explained.insert(o.uuid).second) << "twice";
      EXPECT_TRUE(std::find(r.candidates.begin(), r.candidates.end(), o.uuid) != r.candidates.end())
          << "not a candidate";
      EXPECT_TRUE(std::find(usable.begin(), usable.end(), o.uuid) == usable.end())
          << "usable, yet an obstacle";
      const auto it = machine.find(o.uuid);
      const auto claim = claimed.find(o.uuid);
      switch (o.kind) {
        case Kind::kMissing:
          EXPECT_TRUE(it == machine.end());
          break;
        case Kind::kHeld:
          EXPECT_TRUE(it != machine.end() && it->second->held);
          break;
        case Kind::kUnhealthy:
          EXPECT_TRUE(it != machine.end() && !it->second->held && unhealthy.count(o.uuid));
          break;
        case Kind::kReserved:
        case Kind::kGiven:
          EXPECT_TRUE(it != machine.end() && !it->second->held);
          ASSERT_TRUE(claim != claimed.end()) << "not claimed earlier";
          EXPECT_EQ(claim->second.kind, o.kind);
          ASSERT_TRUE(o.by.has_value());
          EXPECT_EQ(*o.by, claim->second.by);
          break;
        case Kind::kFull:
        case Kind::kJobCap:
          ADD_FAILURE() << "only shared requests meet full GPUs";
          break;
      }
    }
    for (const auto& c : r.candidates) {
      if (std::find(p.gpus.begin(), p.gpus.end(), c) == p.gpus.end()) {
        if (never_servable && !explained.count(c)) continue;  // usable, but not reserved
        EXPECT_TRUE(explained.count(c)) << "no obstacle for " << c;
      }
    }
    for (const auto& g : p.gpus) claimed.emplace(g, Claim{Kind::kReserved, p.request});
  }
  for (std::size_t pos = participants; pos < n; ++pos)
    EXPECT_THAT(plan.order[pos].gpus, IsEmpty()) << "held back, yet reserves or takes GPUs";

  // Global invariants, straight from the placements.
  std::map<std::string, int> given, reserved;
  for (const Placement& p : plan.order) {
    const PlanRequest& r = s.requests[p.request];
    const std::set<std::string> unhealthy(r.unhealthy.begin(), r.unhealthy.end());
    for (const auto& g : p.gpus) {
      if (p.standing == QueueStanding::kNext) ++given[g];
      if (p.standing == QueueStanding::kWaiting) ++reserved[g];
      const auto it = machine.find(g);
      ASSERT_TRUE(it != machine.end()) << g << " is not on the machine";
      EXPECT_FALSE(it->second->held) << g << " is held";
      EXPECT_FALSE(unhealthy.count(g)) << g << " is unhealthy for request " << p.request;
      EXPECT_TRUE(std::find(r.candidates.begin(), r.candidates.end(), g) != r.candidates.end())
          << g << " is no candidate of request " << p.request;
    }
  }
  for (const auto& [g, count] : given) {
    EXPECT_EQ(count, 1) << g << " given several times";
    EXPECT_EQ(reserved.count(g), 0u) << g << " given and reserved";
  }
  for (const auto& [g, count] : reserved) EXPECT_EQ(count, 1) << g << " reserved several times";
}

TEST(PlanProperty, RandomScenariosKeepTheContract) {
  for (unsigned seed = 1; seed <= 500; ++seed) {
    std::mt19937 rng(seed);
    const Scenario scenario = RandomScenario(rng);
    SCOPED_TRACE("seed " + std::to_string(seed));
    CheckScenario(scenario);
    if (::testing::Test::HasFailure()) break;  // one failing scenario is enough to read
  }
}

// Same generator, many more requests per machine: a second scenario's requests join the first's
// queue (long chains of reservations).
Scenario RandomBusyScenario(std::mt19937& rng) {
  Scenario scenario = RandomScenario(rng);
  const Scenario more = RandomScenario(rng);
  std::uint64_t base = 0;
  for (const auto& r : scenario.requests) base = std::max(base, r.seq + 1);
  for (PlanRequest r : more.requests) {
    // Keep the candidates that exist in this scenario's universe; uids keep their limits.
    Strings kept;
    for (const auto& c : r.candidates)
      if (IndexOf(c) < 0 || IndexOf(c) < static_cast<int>(scenario.gpus.size())) kept.push_back(c);
    if (kept.empty()) continue;
    if (r.named_gpus) r.needed = static_cast<unsigned>(kept.size());
    r.candidates = kept;
    Strings unhealthy;
    for (const auto& u : r.unhealthy)
      if (std::find(kept.begin(), kept.end(), u) != kept.end()) unhealthy.push_back(u);
    r.unhealthy = unhealthy;
    r.seq += base;
    r.limits = scenario.limits[r.uid];
    if (scenario.priority_per_user) r.priority = scenario.priority[r.uid];
    scenario.requests.push_back(r);
  }
  return scenario;
}

TEST(PlanProperty, RandomBusyScenariosKeepTheContract) {
  for (unsigned seed = 1000; seed < 1300; ++seed) {
    std::mt19937 rng(seed);
    const Scenario scenario = RandomBusyScenario(rng);
    SCOPED_TRACE("seed " + std::to_string(seed));
    CheckScenario(scenario);
    if (::testing::Test::HasFailure()) break;
  }
}

// Expects each of `members` (request indices) to be placed in `partial` (of the members, in
// that order) as the whole queue's plan places it.
void ExpectPlacedAsInWhole(const Plan& partial, const std::vector<std::size_t>& members,
                           const Plan& whole, const std::string& what) {
  for (std::size_t k = 0; k < members.size(); ++k) {
    SCOPED_TRACE(what + ", request " + std::to_string(members[k]));
    const Placement& mine = partial.of(k);
    const Placement& theirs = whole.of(members[k]);
    EXPECT_EQ(mine.standing, theirs.standing);
    EXPECT_EQ(mine.gpus, theirs.gpus);
    EXPECT_EQ(mine.held_back, theirs.held_back);
    EXPECT_EQ(mine.may_enter, theirs.may_enter);
    ASSERT_EQ(mine.obstacles.size(), theirs.obstacles.size());
    for (std::size_t o = 0; o < mine.obstacles.size(); ++o) {
      EXPECT_EQ(mine.obstacles[o].uuid, theirs.obstacles[o].uuid);
      EXPECT_EQ(mine.obstacles[o].kind, theirs.obstacles[o].kind);
      EXPECT_EQ(mine.obstacles[o].by.has_value(), theirs.obstacles[o].by.has_value());
      if (mine.obstacles[o].by && theirs.obstacles[o].by) {
        EXPECT_EQ(members[*mine.obstacles[o].by], *theirs.obstacles[o].by);
      }
    }
  }
}

// Hides a request's details (candidates and health) until a walk reads them, as plan_head does
// for every request but its own.
void HideDetails(PlanRequest& r) {
  r.details_pending = true;
  r.candidates.clear();
  r.unhealthy.clear();
}

// The walk of only the requests at `places` of the order (ascending), their details read on
// demand from the scenario except where `known` (a request index) says they are known.
Plan WalkOf(const Scenario& s, const QueueOrder& order, const std::vector<std::size_t>& places,
            const std::function<bool(std::size_t)>& known, std::vector<std::size_t>& members) {
  const DistanceFunction distance = s.topology ? DistanceFunction(IndexDistance) : ZeroDistance;
  members.clear();
  for (const std::size_t place : places) members.push_back(order.order[place]);
  std::vector<PlanRequest> walked;
  QueueOrder walk_order;
  for (std::size_t k = 0; k < members.size(); ++k) {
    walked.push_back(s.requests[members[k]]);
    if (!known(members[k])) HideDetails(walked.back());
    walk_order.order.push_back(k);
    walk_order.held_back.push_back(order.held_back[members[k]]);
    walk_order.may_enter.push_back(order.may_enter[members[k]]);
  }
  const RequestLoader load = [&](std::size_t k, PlanRequest& r) {
    r.candidates = s.requests[members[k]].candidates;
    r.unhealthy = s.requests[members[k]].unhealthy;
    return true;
  };
  return plan_queue_in_order(s.gpus, walked, walk_order, distance, load);
}

// The whole queue's walk as plan_head walked it before it had a head: every request but `ours`
// read on demand. Its placements are by request index.
Plan WholeWalkOf(const Scenario& s, const QueueOrder& order, std::size_t ours) {
  const DistanceFunction distance = s.topology ? DistanceFunction(IndexDistance) : ZeroDistance;
  std::vector<PlanRequest> requests = s.requests;
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (i != ours) HideDetails(requests[i]);
  const RequestLoader load = [&](std::size_t i, PlanRequest& r) {
    r.candidates = s.requests[i].candidates;
    r.unhealthy = s.requests[i].unhealthy;
    return true;
  };
  return plan_queue_in_order(s.gpus, requests, order, distance, load);
}

// Walks only the requests at `places` of the order (ascending), every one's details known, and
// expects each to be placed as the whole queue's plan places it.
void ExpectMembersPlacedAsInWhole(const Scenario& s, const QueueOrder& order, const Plan& whole,
                                  const std::vector<std::size_t>& places, const std::string& what) {
  std::vector<std::size_t> members;
  const Plan partial = WalkOf(
      s, order, places, [](std::size_t) { return true; }, members);
  ExpectPlacedAsInWhole(partial, members, whole, what);
}

QueueOrder OrderOf(const Scenario& s) {
  std::vector<OrderInput> inputs;
  for (const PlanRequest& r : s.requests)
    inputs.push_back(order_input(r, r.limits.max_waiting, r.user_last_served));
  return order_queue(s.policy, s.gpus, inputs);
}

// The GPUs still claimable after the first h requests of the order (none if no GPU is open).
std::vector<ClaimableGpu> ClaimableAfter(const Scenario& s, const QueueOrder& order,
                                         std::size_t h) {
  const DistanceFunction distance = s.topology ? DistanceFunction(IndexDistance) : ZeroDistance;
  std::vector<ClaimableGpu> open;
  std::vector<PlanRequest> copy = s.requests;
  (void)plan_queue_in_order(s.gpus, copy, order, distance, RequestLoader(), h, &open);
  return open;
}

// What LocalBackend::plan_head relies on: once no GPU is open after the first h requests of the
// whole queue's order, walking only those h (and one request from further back, placed after
// them) decides for them, and for that one, what the whole queue's plan decides.
void CheckHeadsOf(const Scenario& s) {
  const DistanceFunction distance = s.topology ? DistanceFunction(IndexDistance) : ZeroDistance;
  const QueueOrder order = OrderOf(s);
  const Plan whole = plan_queue(s.policy, s.gpus, s.requests, distance);
  ASSERT_EQ(order.order.size(), s.requests.size());
  for (std::size_t k = 0; k < s.requests.size(); ++k)
    ASSERT_EQ(whole.order[k].request, order.order[k]) << "the same order as plan_queue's";
  for (std::size_t h = 1; h < s.requests.size(); h *= 2) {
    if (!ClaimableAfter(s, order, h).empty()) continue;
    // The head, and the last request of the order (ours, standing behind everyone).
    std::vector<std::size_t> places(h);
    std::iota(places.begin(), places.end(), 0);
    places.push_back(s.requests.size() - 1);
    ExpectMembersPlacedAsInWhole(s, order, whole, places, "head " + std::to_string(h));
  }
}

TEST(PlanHead, AHeadWithNoGpuOpenBehindItDecidesAsTheWholeQueue) {
  for (unsigned seed = 1; seed <= 500; ++seed) {
    std::mt19937 rng(seed);
    // Longer queues, so that heads shorter than the queue are tried.
    const Scenario scenario = RandomBusyScenario(rng);
    SCOPED_TRACE("seed " + std::to_string(seed));
    CheckHeadsOf(scenario);
    if (::testing::Test::HasFailure()) break;
  }
}

// Adds shared leases to a scenario: some held GPUs become GPUs in shared use (with memory left
// or not), free ones get memory units, and some requests become shared ones.
void AddSharedUse(Scenario& s, std::mt19937& rng) {
  const auto chance = [&rng](double p) { return std::bernoulli_distribution(p)(rng); };
  const auto uniform = [&rng](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  for (PlannedGpu& g : s.gpus) {
    g.total_units = 8;
    if (!g.held) {
      g.free_units = 8;
    } else if (chance(0.5)) {
      g.shared_use = true;
      g.free_units = static_cast<std::uint32_t>(uniform(0, 8));
      g.shared_jobs = static_cast<unsigned>(uniform(1, 3));
    }
  }
  for (PlanRequest& r : s.requests) {
    if (!chance(0.35)) continue;
    r.shared_units = static_cast<std::uint32_t>(uniform(1, 8));
    if (chance(0.3)) r.job_cap = static_cast<unsigned>(uniform(1, 3));
    r.spread = chance(0.3);
  }
}

// What plan_head relies on when GPUs are open behind its head: leaving out every request behind
// it that ClaimSieve says cannot claim a GPU still claimable (by its hint: candidates, and the
// default health filter judged from the devices) changes nobody's placement. Walked as plan_head
// walks (details read on demand), ours anywhere behind the head, with shared leases or without.
TEST(PlanHead, LeavingOutWhomTheSieveRejectsDecidesAsTheWholeQueue) {
  std::size_t sieved_out = 0;
  for (unsigned seed = 1; seed <= 1000; ++seed) {
    std::mt19937 rng(seed);
    Scenario s = RandomBusyScenario(rng);
    const auto chance = [&rng](double p) { return std::bernoulli_distribution(p)(rng); };
    if (seed % 2 == 0) AddSharedUse(s, rng);
    // Processes outside gpulock on some GPUs; requests whose only filter is the default one are
    // unhealthy exactly there (unless they allow them), the others keep their random health.
    std::vector<Device> devices;
    std::set<std::string> foreign;
    for (const PlannedGpu& g : s.gpus) {
      Device& d = devices.emplace_back();
      d.uuid = g.uuid;
      if (chance(0.4)) {
        d.processes.push_back(GpuProcess{4242, std::nullopt});
        foreign.insert(g.uuid);
      }
    }
    std::vector<UsabilityHint> hints;
    for (PlanRequest& r : s.requests) {
      Ticket t;
      t.candidates = r.candidates;
      if (chance(0.6)) {
        t.allow_foreign_processes = chance(0.3);
        r.unhealthy.clear();
        for (const auto& uuid : r.candidates)
          if (!t.allow_foreign_processes && foreign.count(uuid)) r.unhealthy.push_back(uuid);
      } else {
        t.max_utilization_percent = 50;  // some other filter: its health is not judged
      }
      hints.push_back(chance(0.1) ? UsabilityHint() : UsabilityHint::of(t));
    }
    const auto device_of = [&devices](const std::string& uuid) -> const Device* {
      for (const Device& d : devices)
        if (d.uuid == uuid) return &d;
      return nullptr;
    };
    SCOPED_TRACE("seed " + std::to_string(seed) + "\n" + DescribeScenario(s));
    const std::size_t n = s.requests.size();
    const QueueOrder order = OrderOf(s);
    for (std::size_t h = 1; h < n; h *= 2) {
      const std::vector<ClaimableGpu> claimable = ClaimableAfter(s, order, h);
      if (claimable.empty()) continue;
      const ClaimSieve sieve(claimable, device_of);
      // Ours: a request behind the head, always walked with its details known.
      const std::size_t our_place =
          h + std::uniform_int_distribution<std::size_t>(0, n - h - 1)(rng);
      const std::size_t ours = order.order[our_place];
      const Plan whole = WholeWalkOf(s, order, ours);
      std::vector<std::size_t> places(h);
      std::iota(places.begin(), places.end(), 0);
      for (std::size_t k = h; k < n; ++k) {
        const std::size_t i = order.order[k];
        if (k == our_place ||
            (!order.held_back[i] && sieve.may_claim(hints[i], s.requests[i].shared())))
          places.push_back(k);
        else
          ++sieved_out;
      }
      std::vector<std::size_t> members;
      const Plan partial = WalkOf(
          s, order, places, [ours](std::size_t i) { return i == ours; }, members);
      ExpectPlacedAsInWhole(partial, members, whole, "sieved head " + std::to_string(h));
    }
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(sieved_out, 100u) << "the scenarios leave few requests out: the test tests little";
}

}  // namespace
}  // namespace gpulock

namespace gpulock {
namespace {

// --- details read on demand (issue 12) ----------------------------------------------------

// A queue whose requests carry only what orders them: the loader supplies their candidates,
// and records which it was asked for.
struct PendingQueue {
  std::vector<PlanRequest> requests;
  std::vector<Strings> details;  // each request's candidates, as its ticket would say
  std::set<std::size_t> gone;    // requests whose waiter ended
  std::vector<std::size_t> loaded;

  void Add(PlanRequest request) {
    details.push_back(request.candidates);
    request.candidates.clear();
    request.details_pending = true;
    requests.push_back(std::move(request));
  }
  Plan Run(const std::vector<PlannedGpu>& gpus) {
    return plan_queue(QueuePolicy::kFifo, gpus, requests, ZeroDistance,
                      [this](std::size_t i, PlanRequest& r) {
                        loaded.push_back(i);
                        if (gone.count(i)) return false;
                        r.candidates = details[i];
                        return true;
                      });
  }
};

TEST(PlanOnDemand, ReadsOnlyTheRequestsAheadOfTheLastFreeGpu) {
  PendingQueue queue;
  for (int i = 0; i < 1000; ++i)
    queue.Add(Any(static_cast<std::uint64_t>(i) + 1, 1000, 1, UuidRange(4)));
  const Plan plan = queue.Run({Held(0), Free(1), Held(2), Free(3)});
  EXPECT_THAT(queue.loaded, ElementsAre(0u, 1u)) << "two free GPUs: two requests matter";
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre(Uuid(1)));
  EXPECT_THAT(plan.of(1).gpus, ElementsAre(Uuid(3)));
  EXPECT_EQ(plan.of(2).standing, QueueStanding::kWaiting);
  ExpectConsistent(plan, 1000);
}

TEST(PlanOnDemand, SamePlanAsWithEveryDetailKnown) {
  // Backfill, reservations and named GPUs, planned both ways.
  std::vector<PlanRequest> full = {Any(1, 1000, 3, UuidRange(4)), Named(2, 1001, Uuids({3})),
                                   Any(3, 1002, 1, Uuids({0, 1})), Any(4, 1003, 1, UuidRange(4)),
                                   Named(5, 1004, Uuids({2}))};
  const std::vector<PlannedGpu> gpus = {Held(0), Free(1), Free(2), Free(3)};
  PendingQueue queue;
  for (const auto& r : full) queue.Add(r);
  const Plan lazy = queue.Run(gpus);
  const Plan eager = RunPlan(QueuePolicy::kFifo, gpus, full);
  for (std::size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(lazy.of(i).standing, eager.of(i).standing) << "request " << i;
    EXPECT_EQ(lazy.of(i).gpus, eager.of(i).gpus) << "request " << i;
  }
}

TEST(PlanOnDemand, AGoneRequestTakesAndReservesNothing) {
  PendingQueue queue;
  queue.Add(Any(1, 1000, 2, UuidRange(2)));  // would reserve GPU 1
  queue.Add(Any(2, 1001, 1, UuidRange(2)));
  queue.gone.insert(0);
  const Plan plan = queue.Run({Held(0), Free(1)});
  EXPECT_THAT(plan.of(0).gpus, IsEmpty());
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre(Uuid(1)));
}

TEST(PlanOnDemand, ARequestOverItsUsersGpuLimitIsNotRead) {
  // One user at max_gpus with a long queue and a free GPU: nothing of the queue need be read.
  PendingQueue queue;
  for (int i = 0; i < 50; ++i)
    queue.Add(
        WithLimits(Any(static_cast<std::uint64_t>(i) + 1, 1000, 1, UuidRange(2)), 1, std::nullopt));
  const Plan plan = queue.Run({Held(0, 1000), Free(1)});
  EXPECT_THAT(queue.loaded, IsEmpty());
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kOverGpuLimit);
}

TEST(PlanOnDemand, NothingIsReadWhenNoGpuIsFree) {
  PendingQueue queue;
  for (int i = 0; i < 10; ++i)
    queue.Add(Any(static_cast<std::uint64_t>(i) + 1, 1000, 1, UuidRange(2)));
  const Plan plan = queue.Run({Held(0), Held(1)});
  EXPECT_THAT(queue.loaded, IsEmpty());
  for (std::size_t i = 0; i < 10; ++i) EXPECT_EQ(plan.of(i).standing, QueueStanding::kWaiting);
}

}  // namespace
}  // namespace gpulock
