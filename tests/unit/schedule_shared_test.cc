// The queue planner with shared requests (several jobs per GPU by memory): serving by free
// units and job caps, packing and spreading, exclusive requests holding GPUs in shared use back
// so that they drain, shared requests reserving the GPUs they wait on, backfill, fair share by
// memory, and reading only the requests ahead of the last open GPU.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "queue/schedule.h"

namespace gpulock {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Strings = std::vector<std::string>;

constexpr std::uint32_t kUnits = 320;  // an 80 GiB GPU in 256 MiB units

std::string Uuid(int i) {
  return "GPU-" + std::to_string(i);
}

Strings All(int n) {
  Strings out;
  for (int i = 0; i < n; ++i) out.push_back(Uuid(i));
  return out;
}

// A GPU nobody holds, with `free` units for shared leases.
PlannedGpu Free(int i, std::uint32_t free = kUnits) {
  PlannedGpu gpu{Uuid(i), false, std::nullopt};
  gpu.total_units = kUnits;
  gpu.free_units = free;
  return gpu;
}

// A GPU held by `jobs` shared leases, with `free` units left.
PlannedGpu Shared(int i, unsigned jobs, std::uint32_t free) {
  PlannedGpu gpu = Free(i, free);
  gpu.held = true;
  gpu.shared_use = true;
  gpu.shared_jobs = jobs;
  return gpu;
}

PlannedGpu Exclusive(int i) {
  PlannedGpu gpu = Free(i, 0);
  gpu.held = true;
  return gpu;
}

PlanRequest Whole(std::uint64_t seq, uid_t uid, unsigned needed, Strings candidates) {
  PlanRequest r;
  r.seq = seq;
  r.uid = uid;
  r.needed = needed;
  r.candidates = std::move(candidates);
  return r;
}

PlanRequest Share(std::uint64_t seq, uid_t uid, std::uint32_t units, Strings candidates,
                  unsigned needed = 1) {
  PlanRequest r = Whole(seq, uid, needed, std::move(candidates));
  r.shared_units = units;
  return r;
}

int NoDistance(const std::string&, const std::string&) {
  return 0;
}

Plan RunPlan(const std::vector<PlannedGpu>& gpus, const std::vector<PlanRequest>& requests,
             QueuePolicy policy = QueuePolicy::kFifo) {
  return plan_queue(policy, gpus, requests, NoDistance);
}

TEST(PlanShared, ServedWhereItsUnitsFitAndPacks) {
  // GPU 0 has 100 units free, GPU 1 200: packing takes the fuller one that fits.
  const Plan plan = RunPlan({Shared(0, 2, 100), Shared(1, 1, 200)}, {Share(1, 1, 40, All(2))});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(0).gpus, ElementsAre(Uuid(0)));
}

TEST(PlanShared, SpreadTakesTheEmptiest) {
  PlanRequest r = Share(1, 1, 40, All(2));
  r.spread = true;
  const Plan plan = RunPlan({Shared(0, 2, 100), Shared(1, 1, 200)}, {r});
  EXPECT_THAT(plan.of(0).gpus, ElementsAre(Uuid(1)));
}

TEST(PlanShared, UnitsGivenEarlierInThePlanCount) {
  // 100 units free: two requests of 40 fit, the third does not.
  const Plan plan = RunPlan({Shared(0, 1, 100)}, {Share(1, 1, 40, All(1)), Share(2, 1, 40, All(1)),
                                                  Share(3, 1, 40, All(1))});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_EQ(plan.of(2).standing, QueueStanding::kWaiting);
  ASSERT_EQ(plan.of(2).obstacles.size(), 1u);
  EXPECT_EQ(plan.of(2).obstacles[0].kind, Obstacle::Kind::kFull);
  EXPECT_EQ(plan.of(2).obstacles[0].wanted_units, 40u);
}

TEST(PlanShared, JobCapCountsLeasesAndThoseGivenInThePlan) {
  PlanRequest a = Share(1, 1, 1, All(1));
  PlanRequest b = Share(2, 1, 1, All(1));
  a.job_cap = b.job_cap = 3;
  const Plan plan = RunPlan({Shared(0, 2, 200)}, {a, b});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kWaiting);
  // Memory is left: the cap, not memory, keeps it waiting, and the obstacle says which.
  ASSERT_EQ(plan.of(1).obstacles.size(), 1u);
  EXPECT_EQ(plan.of(1).obstacles[0].kind, Obstacle::Kind::kJobCap);
}

TEST(PlanShared, SlotsTakeTheirPartOfEachGpu) {
  PlanRequest r = Whole(1, 1, 1, All(1));
  r.shared_slots = 4;  // 80 units of 320
  EXPECT_EQ(RunPlan({Shared(0, 1, 80)}, {r}).of(0).standing, QueueStanding::kNext);
  EXPECT_EQ(RunPlan({Shared(0, 1, 79)}, {r}).of(0).standing, QueueStanding::kWaiting);
}

TEST(PlanShared, AnExclusiveLeaseExcludesSharedOnes) {
  const Plan plan = RunPlan({Exclusive(0)}, {Share(1, 1, 1, All(1))});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_EQ(plan.of(0).obstacles.at(0).kind, Obstacle::Kind::kHeld);
}

TEST(PlanShared, AWholeGpuWaiterOnOneGpuDoesNotStopSharedOnesOnOthers) {
  // The exclusive request names GPU 0 (held); the shared one backfills GPU 1.
  const Plan plan =
      RunPlan({Exclusive(0), Free(1)}, {Whole(1, 1, 1, {Uuid(0)}), Share(2, 2, 40, All(2))});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre(Uuid(1)));
}

TEST(PlanShared, AnExclusiveWaiterHoldsAGpuInSharedUseBackSoItDrains) {
  // Both GPUs in shared use; the exclusive request holds back the one with fewer leases, and a
  // later shared request may only use the other.
  const Plan plan = RunPlan({Shared(0, 3, 200), Shared(1, 1, 200)},
                            {Whole(1, 1, 1, All(2)), Share(2, 2, 40, All(2))});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).held_back, ElementsAre(Uuid(1)));
  EXPECT_THAT(plan.of(0).gpus, IsEmpty());
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre(Uuid(0)));
}

TEST(PlanShared, AnExclusiveWaiterOnTheOnlyGpuStopsNewSharedLeases) {
  const Plan plan = RunPlan({Shared(0, 1, 300)}, {Whole(1, 1, 1, All(1)), Share(2, 2, 4, All(1))});
  EXPECT_THAT(plan.of(0).held_back, ElementsAre(Uuid(0)));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kWaiting);
  EXPECT_EQ(plan.of(1).obstacles.at(0).kind, Obstacle::Kind::kReserved);
}

TEST(PlanShared, AFreeGpuGoesToTheExclusiveWaiterNotToLaterSharedOnes) {
  const Plan plan =
      RunPlan({Free(0), Shared(1, 1, 300)}, {Whole(1, 1, 2, All(2)), Share(2, 2, 4, All(2))});
  EXPECT_THAT(plan.of(0).gpus, ElementsAre(Uuid(0)));
  EXPECT_THAT(plan.of(0).held_back, ElementsAre(Uuid(1)));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kWaiting);
}

TEST(PlanShared, AWaitingSharedRequestReservesTheGpuItWaitsOnOthersBackfill) {
  // The big request waits on GPU 1 (the most free memory); the small one still runs on GPU 0.
  const Plan plan = RunPlan({Shared(0, 1, 20), Shared(1, 1, 100)},
                            {Share(1, 1, 200, All(2)), Share(2, 2, 10, All(2))});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kWaiting);
  EXPECT_THAT(plan.of(0).held_back, ElementsAre(Uuid(1)));
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_THAT(plan.of(1).gpus, ElementsAre(Uuid(0)));
}

TEST(PlanShared, AnExclusiveRequestDoesNotTakeAGpuGivenToAnEarlierSharedOne) {
  const Plan plan = RunPlan({Free(0)}, {Share(1, 1, 40, All(1)), Whole(2, 2, 1, All(1))});
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kWaiting);
  EXPECT_EQ(plan.of(1).obstacles.at(0).kind, Obstacle::Kind::kGiven);
}

TEST(PlanShared, FairShareWeighsSharedLeasesByMemory) {
  // User 1 holds a quarter of a GPU in shared leases, user 2 a whole GPU: user 1 goes first.
  PlannedGpu shared = Shared(0, 1, 240);
  shared.shared_by = {{1, kShareScale / 4}};
  PlannedGpu held = Exclusive(1);
  held.holder_uid = 2;
  const Plan plan =
      RunPlan({shared, held, Exclusive(2)}, {Whole(1, 2, 1, {Uuid(2)}), Share(2, 1, 40, {Uuid(2)})},
              QueuePolicy::kFairShare);
  EXPECT_EQ(plan.order.at(0).request, 1u);
}

TEST(PlanShared, QueuedSharedRequestsWeighTheirPartInTheShare) {
  // User 1 queued two requests of a quarter GPU (weighing half a GPU); user 2 one whole GPU
  // request before: user 1's third request (share 1/2) goes before user 2's second (share 1).
  const Plan plan =
      RunPlan({Exclusive(0)},
              {Share(1, 1, 80, All(1)), Share(2, 1, 80, All(1)), Whole(3, 2, 1, All(1)),
               Whole(4, 2, 1, All(1)), Share(5, 1, 80, All(1))},
              QueuePolicy::kFairShare);
  std::vector<std::size_t> order;
  for (const auto& p : plan.order) order.push_back(p.request);
  // Shares: r0 0, r2 0, r1 1/4, r4 1/2, r3 1.
  EXPECT_THAT(order, ElementsAre(0u, 2u, 1u, 4u, 3u));
}

TEST(PlanShared, OnlyRequestsAheadOfTheLastOpenGpuAreRead) {
  // One GPU with room for two; a thousand identical requests: only those two are served, the
  // third reserves what is left, and nothing further back is read.
  std::vector<PlanRequest> requests;
  for (int i = 0; i < 1000; ++i) {
    requests.push_back(Share(static_cast<std::uint64_t>(i + 1), 1, 40, {}));
    requests.back().details_pending = true;
  }
  std::size_t loaded = 0;
  const Plan plan = plan_queue(QueuePolicy::kFifo, {Shared(0, 6, 90)}, requests, NoDistance,
                               [&](std::size_t, PlanRequest& r) {
                                 ++loaded;
                                 r.candidates = All(1);
                                 return true;
                               });
  EXPECT_EQ(loaded, 3u);
  EXPECT_EQ(plan.of(0).standing, QueueStanding::kNext);
  EXPECT_EQ(plan.of(1).standing, QueueStanding::kNext);
  EXPECT_EQ(plan.of(2).standing, QueueStanding::kWaiting);
  EXPECT_EQ(plan.of(999).standing, QueueStanding::kWaiting);
}

}  // namespace
}  // namespace gpulock
