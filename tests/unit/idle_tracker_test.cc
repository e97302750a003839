// IdleTracker (gpulock/monitor.hpp): the run of 0 % readings that makes a leased GPU idle, its
// breaks (a busy reading, a new lease, a gap between readings too long to vouch for), the record
// that carries readings from one run to the next, and a source's own idle_since.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>

#include "gpulock/monitor.hpp"
#include "temp_dir.h"

namespace gpulock {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::system_clock;

const Clock::time_point kStart = Clock::time_point(std::chrono::seconds(1'800'000'000));

// One leased GPU at `utilization` percent, read at kStart + `at`, held by `lease` since kStart.
PoolStatus reading(std::chrono::seconds at, unsigned utilization,
                   const std::string& lease = "aaaaaaaaaaaaaaaa") {
  PoolStatus status;
  status.host = "node1";
  status.taken_at = kStart + at;
  GpuStatus gpu;
  gpu.device.uuid = "GPU-1";
  gpu.device.utilization_percent = utilization;
  gpu.state = GpuState::kLeased;
  HolderInfo holder;
  holder.lease_id = lease;
  holder.user = "alice";
  holder.started_at = kStart;
  gpu.holder = holder;
  status.gpus.push_back(gpu);
  return status;
}

// Observes a reading and returns it marked.
PoolStatus observed(IdleTracker& tracker, PoolStatus status,
                    std::chrono::seconds idle_after = 60s) {
  tracker.observe(status, idle_after);
  return status;
}

TEST(IdleTrackerTest, UnbrokenZeroReadingsMakeIdleOnceIdleAfterHasPassed) {
  IdleTracker tracker;
  auto first = observed(tracker, reading(0s, 0));
  ASSERT_TRUE(first.gpus[0].idle_since.has_value());
  EXPECT_EQ(*first.gpus[0].idle_since, kStart);
  EXPECT_FALSE(first.gpus[0].idle);
  EXPECT_FALSE(observed(tracker, reading(30s, 0)).gpus[0].idle);
  auto later = observed(tracker, reading(61s, 0));
  EXPECT_TRUE(later.gpus[0].idle);
  EXPECT_EQ(*later.gpus[0].idle_since, kStart);
  EXPECT_EQ(later.idle_after, 60s);
}

TEST(IdleTrackerTest, ABusyReadingRestartsTheRun) {
  IdleTracker tracker;
  observed(tracker, reading(0s, 0));
  auto busy = observed(tracker, reading(50s, 7));
  EXPECT_FALSE(busy.gpus[0].idle_since.has_value());
  auto again = observed(tracker, reading(100s, 0));
  EXPECT_EQ(*again.gpus[0].idle_since, kStart + 100s);
  EXPECT_FALSE(again.gpus[0].idle);
}

TEST(IdleTrackerTest, ANewLeaseRestartsTheRun) {
  IdleTracker tracker;
  observed(tracker, reading(0s, 0, "aaaaaaaaaaaaaaaa"));
  auto other = observed(tracker, reading(120s, 0, "bbbbbbbbbbbbbbbb"));
  EXPECT_EQ(*other.gpus[0].idle_since, kStart + 120s);
  EXPECT_FALSE(other.gpus[0].idle);
}

TEST(IdleTrackerTest, AGapLongerThanTheMaximumRestartsTheRun) {
  IdleTracker tracker;
  observed(tracker, reading(0s, 0));
  const auto gap = std::chrono::duration_cast<std::chrono::seconds>(IdleTracker::kMaxReadingGap);
  auto after_gap = observed(tracker, reading(gap + 1s, 0));
  EXPECT_EQ(*after_gap.gpus[0].idle_since, kStart + gap + 1s);
  // Readings just within the gap keep the run.
  auto next = observed(tracker, reading(2 * gap + 1s, 0));
  EXPECT_EQ(*next.gpus[0].idle_since, kStart + gap + 1s);
  EXPECT_TRUE(next.gpus[0].idle);
}

TEST(IdleTrackerTest, UnknownUtilisationAndUnleasedGpusAreNeverIdle) {
  IdleTracker tracker;
  auto unknown = reading(0s, 0);
  unknown.gpus[0].device.utilization_percent.reset();
  EXPECT_FALSE(observed(tracker, unknown).gpus[0].idle_since.has_value());
  auto free = reading(0s, 0);
  free.gpus[0].state = GpuState::kFree;
  free.gpus[0].holder.reset();
  EXPECT_FALSE(observed(tracker, free).gpus[0].idle_since.has_value());
}

TEST(IdleTrackerTest, TheRecordCarriesReadingsToTheNextRun) {
  test_support::TempDir dir;
  const auto path = dir.path() / "state" / "idle.json";
  auto first = reading(0s, 0);
  IdleTracker(path).observe(first, 60s);
  auto status = reading(90s, 0);
  IdleTracker(path).observe(status, 60s);
  EXPECT_TRUE(status.gpus[0].idle);
  EXPECT_EQ(*status.gpus[0].idle_since, kStart);
}

TEST(IdleTrackerTest, ADamagedRecordCountsAsNoReadings) {
  test_support::TempDir dir;
  const auto path = dir.path() / "idle.json";
  std::ofstream(path) << "{not json";
  auto status = reading(90s, 0);
  IdleTracker(path).observe(status, 60s);
  EXPECT_EQ(*status.gpus[0].idle_since, kStart + 90s);
  EXPECT_FALSE(status.gpus[0].idle);
  // ... and is replaced by a good one.
  auto next = reading(200s, 0);
  IdleTracker(path).observe(next, 60s);
  EXPECT_TRUE(next.gpus[0].idle);
}

TEST(IdleTrackerTest, ReadingsOfGpusAStatusDidNotCoverAreKept) {
  test_support::TempDir dir;
  const auto path = dir.path() / "idle.txt";
  auto first = reading(0s, 0);
  IdleTracker(path).observe(first, 60s);
  // Another host's status in between (`gpulock status` there, or of another pool): node1's
  // reading stays in the record.
  auto elsewhere = reading(30s, 0, "bbbbbbbbbbbbbbbb");
  elsewhere.host = "node2";
  elsewhere.gpus[0].device.uuid = "GPU-2";
  IdleTracker(path).observe(elsewhere, 60s);
  auto again = reading(90s, 0);
  IdleTracker(path).observe(again, 60s);
  EXPECT_EQ(*again.gpus[0].idle_since, kStart);
  EXPECT_TRUE(again.gpus[0].idle);
}

TEST(IdleTrackerTest, ADamagedLineOfTheRecordIsSkippedAndTheOthersCount) {
  test_support::TempDir dir;
  const auto path = dir.path() / "idle.txt";
  const double start = 1'800'000'000;
  std::ofstream(path) << "gpulock idle readings 1\n"
                      << "node1/GPU-9 aaaaaaaaaaaaaaaa nan 1\n"
                      << "node1/GPU-8 aaaaaaaaaaaaaaaa 1 2 3\n"
                      << "node1/GPU-7 aaaaaaaaaaaaaaaa -1 2\n"
                      << "node1/GPU-6 aaaaaaaaaaaaaaaa 1 1e300\n"
                      << "\xff\xfe 12\n"
                      << "node1/GPU-1 aaaaaaaaaaaaaaaa " << std::fixed << start + 10 << " "
                      << start + 50 << "\n";
  auto status = reading(90s, 0);
  IdleTracker(path).observe(status, 60s);
  EXPECT_EQ(*status.gpus[0].idle_since, kStart + 10s);
  EXPECT_TRUE(status.gpus[0].idle);
}

TEST(IdleTrackerTest, ASourcesOwnIdleSinceIsTakenButNotBeforeTheLease) {
  IdleTracker tracker;
  auto status = reading(3600s, 0);
  status.gpus[0].device.idle_since = kStart + 100s;
  EXPECT_EQ(*observed(tracker, status).gpus[0].idle_since, kStart + 100s);
  auto before_lease = reading(3600s, 0);
  before_lease.gpus[0].device.idle_since = kStart - 5000s;
  auto marked = observed(tracker, before_lease);
  EXPECT_EQ(*marked.gpus[0].idle_since, kStart);
  EXPECT_TRUE(marked.gpus[0].idle);
}

}  // namespace
}  // namespace gpulock
