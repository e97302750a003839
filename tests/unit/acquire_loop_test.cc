// run_acquire_loop() over a scripted round: what the loop itself decides (the refusal, the
// progress and its signature, look_again, the deadline, recover()), apart from any backend.
#include "backend/acquire_loop.h"

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/lease_state.h"

namespace gpulock {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Lease lease_named(const std::string& id) {
  auto state = std::make_unique<LeaseState>();
  state->id = id;
  return Lease(std::move(state));
}

NotServed waits_because(const std::string& why, int position = 1) {
  WaitProgress progress;
  progress.position = position;
  progress.blocked_by = why;
  return NotServed{Error(ErrorCode::kTimedOut, "not served: " + why), progress,
                   std::to_string(position) + why};
}

// Plays back one outcome per look; counts the calls the loop makes.
class ScriptedRound : public AcquireRound {
 public:
  std::deque<std::function<RoundOutcome()>> looks;
  int sleeps = 0;
  std::vector<std::string> kept;  // the refusals keep_waiting() was given
  int recovered = 0;
  bool ride_out = false;  // recover() returns for kEnvironment

  RoundOutcome look() override {
    if (looks.empty()) throw Error(ErrorCode::kInternal, "the loop looked once too often");
    auto next = std::move(looks.front());
    looks.pop_front();
    return next();
  }
  void keep_waiting(Error refusal) override { kept.push_back(refusal.what()); }
  void sleep(Clock::time_point) override { ++sleeps; }
  void recover(const Error& error, Clock::time_point, bool) override {
    ++recovered;
    if (ride_out && error.code() == ErrorCode::kEnvironment) return;
    throw;
  }
};

AcquireWait forever() {
  return AcquireWait{Clock::now(), Clock::time_point::max(), 1};
}

TEST(AcquireLoopTest, AServedLookReturnsItsLeaseWithoutSleeping) {
  ScriptedRound round;
  round.looks.push_back([] { return RoundOutcome::served(lease_named("L1")); });
  LeaseRequest request;
  const Lease lease = run_acquire_loop(round, request, WaitHooks{}, forever());
  EXPECT_EQ(lease.id(), "L1");
  EXPECT_EQ(round.sleeps, 0);
}

TEST(AcquireLoopTest, ARequestThatMayNotWaitGetsTheRoundsRefusal) {
  ScriptedRound round;
  round.looks.push_back([] { return RoundOutcome::waits(waits_because("held")); });
  LeaseRequest request;
  request.wait = false;
  try {
    run_acquire_loop(round, request, WaitHooks{}, forever());
    FAIL() << "served";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kTimedOut);
    EXPECT_STREQ(e.what(), "not served: held");
  }
  EXPECT_EQ(round.sleeps, 0);
  EXPECT_TRUE(round.kept.empty());
}

TEST(AcquireLoopTest, LookAgainStartsTheNextLookWithoutSleeping) {
  ScriptedRound round;
  round.looks.push_back([] { return RoundOutcome::look_again(); });
  round.looks.push_back([] { return RoundOutcome::look_again(); });
  round.looks.push_back([] { return RoundOutcome::served(lease_named("L2")); });
  LeaseRequest request;
  EXPECT_EQ(run_acquire_loop(round, request, WaitHooks{}, forever()).id(), "L2");
  EXPECT_EQ(round.sleeps, 0);
}

TEST(AcquireLoopTest, ProgressIsReportedWhenItsSignatureChanges) {
  ScriptedRound round;
  for (const auto& [why, position] :
       std::vector<std::pair<std::string, int>>{{"a", 2}, {"a", 2}, {"a", 1}, {"b", 1}})
    round.looks.push_back(
        [why, position] { return RoundOutcome::waits(waits_because(why, position)); });
  round.looks.push_back([] { return RoundOutcome::served(lease_named("L3")); });
  std::vector<std::string> seen;
  WaitHooks hooks;
  hooks.on_progress = [&](const WaitProgress& p) {
    seen.push_back(std::to_string(p.position) + p.blocked_by);
  };
  LeaseRequest request;
  run_acquire_loop(round, request, hooks, forever());
  EXPECT_EQ(seen, (std::vector<std::string>{"2a", "1a", "1b"}));
  EXPECT_EQ(round.sleeps, 4);
  EXPECT_EQ(round.kept.size(), 4u);
}

TEST(AcquireLoopTest, ALiveDisplayGetsEveryRound) {
  ScriptedRound round;
  for (int i = 0; i < 3; ++i)
    round.looks.push_back([] { return RoundOutcome::waits(waits_because("a")); });
  round.looks.push_back([] { return RoundOutcome::served(lease_named("L4")); });
  int reports = 0;
  WaitHooks hooks;
  hooks.on_progress = [&](const WaitProgress&) { ++reports; };
  hooks.progress_refresh = milliseconds(10);
  LeaseRequest request;
  run_acquire_loop(round, request, hooks, forever());
  EXPECT_EQ(reports, 3);
}

TEST(AcquireLoopTest, PastTheDeadlineTheRefusalEndsTheWait) {
  ScriptedRound round;
  round.looks.push_back([] { return RoundOutcome::waits(waits_because("held")); });
  LeaseRequest request;
  const AcquireWait wait{Clock::now(), Clock::now(), 1};  // the deadline has come
  EXPECT_THROW(run_acquire_loop(round, request, WaitHooks{}, wait), Error);
  EXPECT_EQ(round.sleeps, 0);
  // The loop's own refusal goes through recover() too, which rethrows it.
  EXPECT_EQ(round.recovered, 1);
}

TEST(AcquireLoopTest, AnErrorTheRoundRidesOutLeadsToAnotherLook) {
  ScriptedRound round;
  round.ride_out = true;
  round.looks.push_back([]() -> RoundOutcome { throw Error(ErrorCode::kEnvironment, "gone"); });
  round.looks.push_back([] { return RoundOutcome::served(lease_named("L5")); });
  LeaseRequest request;
  EXPECT_EQ(run_acquire_loop(round, request, WaitHooks{}, forever()).id(), "L5");
  EXPECT_EQ(round.recovered, 1);
}

TEST(AcquireLoopTest, AnErrorTheRoundDoesNotRideOutEndsTheAcquire) {
  ScriptedRound round;
  round.looks.push_back([]() -> RoundOutcome { throw Error(ErrorCode::kUnsatisfiable, "never"); });
  LeaseRequest request;
  try {
    run_acquire_loop(round, request, WaitHooks{}, forever());
    FAIL() << "served";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsatisfiable);
  }
}

TEST(AcquireLoopTest, SleepSlicesStopJustPastTheDeadlineAndAtTheInterruptPoll) {
  const auto now = Clock::now();
  WaitHooks hooks;
  EXPECT_GE(sleep_slice(now + milliseconds(500), Clock::time_point::max(), hooks).count(), 499);
  EXPECT_LE(sleep_slice(now + milliseconds(500), now + milliseconds(20), hooks).count(), 21);
  EXPECT_EQ(sleep_slice(now - milliseconds(5), Clock::time_point::max(), hooks).count(), 0);
  hooks.interrupted = [] { return false; };
  hooks.interrupt_poll = milliseconds(7);
  EXPECT_EQ(sleep_slice(now + milliseconds(500), Clock::time_point::max(), hooks).count(), 7);
  hooks.interrupted = [] { return true; };
  EXPECT_THROW(check_interrupted(hooks, "stop"), Error);
}

}  // namespace
}  // namespace gpulock
