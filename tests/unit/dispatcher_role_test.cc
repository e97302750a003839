// DispatcherRole and QuickRechecks: each transition of a waiter's part in the wake-up scheme.
#include "local/dispatcher_role.h"

#include <gtest/gtest.h>

namespace gpulock {
namespace {

using Kind = DispatcherRole::Kind;
using Clock = DispatcherRole::Clock;
using std::chrono::seconds;

TEST(DispatcherRoleTest, ThePlaceInTheQueueGivesThePart) {
  const Clock::time_point t0{};
  DispatcherRole role(t0);
  EXPECT_EQ(role.kind(), Kind::kSleeper);  // before it has a place
  role.place(0, t0);
  EXPECT_EQ(role.kind(), Kind::kOldest);
  role.place(1, t0);
  EXPECT_EQ(role.kind(), Kind::kBackup);
  EXPECT_TRUE(role.dispatches());
  role.place(DispatcherRole::kDispatchers - 1, t0);
  EXPECT_TRUE(role.is_backup());
  role.place(DispatcherRole::kDispatchers, t0);
  EXPECT_EQ(role.kind(), Kind::kSleeper);
  EXPECT_FALSE(role.dispatches());
}

TEST(DispatcherRoleTest, APromotionTakesEffectAtTheNextRoundAndOnlyInTheQueue) {
  const Clock::time_point t0{};
  DispatcherRole role(t0);
  role.place(5, t0);
  role.hear_promotion(true, false);
  EXPECT_EQ(role.kind(), Kind::kSleeper);  // not yet
  EXPECT_FALSE(role.start_round(/*in_queue=*/false, t0));
  EXPECT_EQ(role.kind(), Kind::kSleeper);    // dropped: the request was not in the queue
  EXPECT_FALSE(role.start_round(true, t0));  // nothing heard since

  role.hear_promotion(true, false);
  EXPECT_TRUE(role.start_round(true, t0));  // a sleeper starts to follow releases
  EXPECT_EQ(role.kind(), Kind::kBackup);
  EXPECT_TRUE(role.take_cheap_recheck());   // and looks whether a GPU is free
  EXPECT_FALSE(role.take_cheap_recheck());  // once

  role.hear_promotion(true, true);
  EXPECT_TRUE(role.made_oldest_pending());
  EXPECT_FALSE(role.start_round(true, t0));  // already watching
  EXPECT_EQ(role.kind(), Kind::kOldest);
  EXPECT_FALSE(role.made_oldest_pending());
}

TEST(DispatcherRoleTest, AWakeToPlanDropsAPromotionHeardMeanwhile) {
  const Clock::time_point t0{};
  DispatcherRole role(t0);
  role.place(4, t0);
  role.hear_promotion(true, false);
  role.woke(/*must_plan=*/true, /*event_or_quick=*/true);
  EXPECT_FALSE(role.start_round(true, t0));
  EXPECT_EQ(role.kind(), Kind::kSleeper);
  EXPECT_FALSE(role.take_cheap_recheck());  // a sleeper never keeps its plan
}

TEST(DispatcherRoleTest, OnlyADispatcherWokenByAnEventRechecksCheaply) {
  const Clock::time_point t0{};
  DispatcherRole role(t0);
  role.place(1, t0);
  role.woke(false, true);
  EXPECT_TRUE(role.take_cheap_recheck());
  role.woke(true, true);
  EXPECT_FALSE(role.take_cheap_recheck());
  role.woke(false, false);
  EXPECT_FALSE(role.take_cheap_recheck());
  role.recheck_cheaply();
  EXPECT_TRUE(role.take_cheap_recheck());
}

TEST(DispatcherRoleTest, TheOldestSweepsOncePerIntervalFromWhenItBecameTheOldest) {
  const Clock::time_point t0{};
  DispatcherRole role(t0);
  role.place(1, t0 + seconds(100));
  EXPECT_FALSE(role.sweep_due(t0 + seconds(100), seconds(10)));  // a backup never sweeps
  role.place(0, t0 + seconds(100));
  EXPECT_FALSE(role.sweep_due(t0 + seconds(105), seconds(10)));  // counted from becoming oldest
  EXPECT_TRUE(role.sweep_due(t0 + seconds(110), seconds(10)));
  role.swept(t0 + seconds(110));
  EXPECT_FALSE(role.sweep_due(t0 + seconds(115), seconds(10)));
  role.place(0, t0 + seconds(118));  // still the oldest: its interval runs on
  EXPECT_TRUE(role.sweep_due(t0 + seconds(120), seconds(10)));
}

TEST(QuickRechecksTest, AWakeUpArmsTheShortPausesAgain) {
  QuickRechecks quick;
  EXPECT_FALSE(quick.take());
  quick.arm();
  std::vector<long> pauses;
  while (auto pause = quick.take()) pauses.push_back(static_cast<long>(pause->count()));
  EXPECT_EQ(pauses, (std::vector<long>{1, 4, 20, 100, 500}));
  quick.arm();
  quick.take();
  quick.arm();
  EXPECT_EQ(quick.take()->count(), 1);
}

}  // namespace
}  // namespace gpulock
