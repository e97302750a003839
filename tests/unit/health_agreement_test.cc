// health_verdicts_differ() (src/backend/health_agreement.h): a Redis waiter pushes its host's
// readings when, and only when, the registered ones would make a waiter elsewhere judge a queued
// request's GPU otherwise than the live ones do.
#include "backend/health_agreement.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpulock {
namespace {

constexpr std::uint64_t kGiB = 1ull << 30;
const std::string kGpuA = "GPU-aaaa1111-0000-4000-8000-000000000000";
const std::string kGpuB = "GPU-bbbb2222-0000-4000-8000-000000000000";

Device Idle(const std::string& uuid) {
  Device d;
  d.uuid = uuid;
  d.memory_total_bytes = 80 * kGiB;
  d.memory_used_bytes = 1 * kGiB;
  d.memory_free_bytes = 79 * kGiB;
  d.utilization_percent = 0;
  d.power_draw_watts = 70.0;
  return d;
}

// A job outside gpulock took 70 GiB and keeps the GPU busy.
Device Busy(const std::string& uuid) {
  Device d = Idle(uuid);
  d.memory_used_bytes = 71 * kGiB;
  d.memory_free_bytes = 9 * kGiB;
  d.utilization_percent = 95;
  d.power_draw_watts = 600.0;
  d.processes = {{4242, 70 * kGiB}};
  return d;
}

Ticket Waiting(std::vector<std::string> candidates) {
  Ticket t;
  t.candidates = std::move(candidates);
  t.allow_foreign_processes = true;  // judged by the filters each test sets
  return t;
}

TEST(HealthVerdictsDiffer, NotWhenTheReadingsAreTheSame) {
  const Device a = Busy(kGpuA);
  Ticket t = Waiting({kGpuA});
  t.min_free_memory_bytes = 20 * kGiB;
  t.allow_foreign_processes = false;
  EXPECT_FALSE(health_verdicts_differ({t}, {{&a, &a}}));
}

TEST(HealthVerdictsDiffer, WhenAFilterInUseJudgesTheTwoReadingsOtherwise) {
  const Device registered = Idle(kGpuA), live = Busy(kGpuA);
  Ticket memory = Waiting({kGpuA});
  memory.min_free_memory_bytes = 20 * kGiB;
  Ticket utilisation = Waiting({kGpuA});
  utilisation.max_utilization_percent = 50;
  Ticket power = Waiting({kGpuA});
  power.max_power_watts = 300.0;
  Ticket foreign = Waiting({kGpuA});
  foreign.allow_foreign_processes = false;
  for (const Ticket& t : {memory, utilisation, power, foreign}) {
    EXPECT_TRUE(health_verdicts_differ({t}, {{&registered, &live}}));
    // And the other way: a GPU that became fit again.
    EXPECT_TRUE(health_verdicts_differ({t}, {{&live, &registered}}));
  }
}

TEST(HealthVerdictsDiffer, NotWhenNoTicketsFilterReadsWhatChanged) {
  const Device registered = Idle(kGpuA), live = Busy(kGpuA);
  // No filter at all (foreign processes allowed).
  EXPECT_FALSE(health_verdicts_differ({Waiting({kGpuA})}, {{&registered, &live}}));
  // A filter that both readings pass.
  Ticket modest = Waiting({kGpuA});
  modest.min_free_memory_bytes = 4 * kGiB;
  modest.max_power_watts = 650.0;
  EXPECT_FALSE(health_verdicts_differ({modest}, {{&registered, &live}}));
}

TEST(HealthVerdictsDiffer, OnlyTheTicketsCandidatesCount) {
  const Device registered = Idle(kGpuA), live = Busy(kGpuA);
  const Device b = Idle(kGpuB);
  Ticket elsewhere = Waiting({kGpuB});
  elsewhere.min_free_memory_bytes = 20 * kGiB;
  EXPECT_FALSE(health_verdicts_differ({elsewhere}, {{&registered, &live}, {&b, &b}}));
  // A second ticket that may use the changed GPU makes the difference.
  Ticket anywhere = Waiting({kGpuB, kGpuA});
  anywhere.min_free_memory_bytes = 20 * kGiB;
  EXPECT_TRUE(health_verdicts_differ({elsewhere, anywhere}, {{&b, &b}, {&registered, &live}}));
}

TEST(HealthVerdictsDiffer, NotWithoutTicketsOrGpus) {
  const Device registered = Idle(kGpuA), live = Busy(kGpuA);
  EXPECT_FALSE(health_verdicts_differ({}, {{&registered, &live}}));
  Ticket t = Waiting({kGpuA});
  t.min_free_memory_bytes = 20 * kGiB;
  EXPECT_FALSE(health_verdicts_differ({t}, {}));
}

}  // namespace
}  // namespace gpulock
