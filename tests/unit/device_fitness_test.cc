// same_readiness_inputs() (src/backend/device_fitness.h): two readings of one GPU that it calls
// the same get the same unready_reason() for every request, and a change to any reading that
// unready_reason() reads is noticed. (A Redis waiter relies on it to tell when its host's
// registered readings would judge a queued request otherwise than the live ones.)
#include "backend/device_fitness.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

namespace gpulock {
namespace {

constexpr std::uint64_t kGiB = 1ull << 30;

Device Reading() {
  Device d;
  d.uuid = "GPU-aaaa1111-0000-4000-8000-000000000000";
  d.name = "Test GPU";
  d.memory_total_bytes = 80 * kGiB;
  d.memory_used_bytes = 30 * kGiB;
  d.memory_free_bytes = 50 * kGiB;
  d.utilization_percent = 40;
  d.power_draw_watts = 250.0;
  d.power_limit_watts = 700.0;
  return d;
}

// Requests whose verdicts tell apart every change that the cases below make.
std::vector<LeaseRequest> Requests() {
  std::vector<LeaseRequest> out(1);  // no filter but the default: no foreign processes
  out.emplace_back().allow_foreign_processes = true;
  for (std::uint64_t gib : {10, 40, 50, 51, 60})
    out.emplace_back().min_free_memory_bytes = gib * kGiB;
  for (unsigned percent : {0u, 39u, 40u, 50u}) out.emplace_back().max_utilization_percent = percent;
  for (double watts : {100.0, 250.0, 300.0}) out.emplace_back().max_power_watts = watts;
  return out;
}

// Every filter in use (any value; no --allow-foreign).
LeaseRequest AllFilters() {
  LeaseRequest r;
  r.min_free_memory_bytes = 0;
  r.max_utilization_percent = 0;
  r.max_power_watts = 0;
  return r;
}

bool SameVerdicts(const Device& a, const Device& b) {
  for (const LeaseRequest& r : Requests())
    if (unready_reason(a, r).empty() != unready_reason(b, r).empty()) return false;
  return true;
}

TEST(SameReadinessInputs, ReadingsThatNoFilterReadsChangeNothing) {
  Device in_use = Reading();
  in_use.processes = {{10, 1 * kGiB}};
  struct Case {
    Device before;
    std::function<void(Device&)> change;
  };
  const std::vector<Case> cases = {
      {Reading(), [](Device& d) { d.memory_used_bytes = 70 * kGiB; }},
      {Reading(), [](Device& d) { d.power_limit_watts = 400.0; }},
      {in_use,
       [](Device& d) {
         d.processes = {{11, 5 * kGiB}, {12, std::nullopt}};
       }},
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    Device after = cases[i].before;
    cases[i].change(after);
    EXPECT_TRUE(same_readiness_inputs(cases[i].before, after, AllFilters())) << i;
    EXPECT_TRUE(SameVerdicts(cases[i].before, after)) << i;
  }
}

TEST(SameReadinessInputs, EveryReadingAFilterReadsIsCompared) {
  const Device before = Reading();
  const std::vector<std::function<void(Device&)>> changes = {
      [](Device& d) { d.memory_free_bytes = 10 * kGiB; },
      [](Device& d) { d.memory_free_bytes.reset(); },
      [](Device& d) { d.utilization_percent = 0; },
      [](Device& d) { d.utilization_percent.reset(); },
      [](Device& d) { d.power_draw_watts = 280.0; },
      [](Device& d) { d.power_draw_watts.reset(); },
      [](Device& d) { d.processes_known = false; },
      [](Device& d) {
        d.processes = {{10, 1 * kGiB}};
      },
  };
  for (std::size_t i = 0; i < changes.size(); ++i) {
    Device after = before;
    changes[i](after);
    EXPECT_FALSE(same_readiness_inputs(before, after, AllFilters())) << i;
    EXPECT_FALSE(same_readiness_inputs(after, before, AllFilters())) << i;
    // Each change matters to some request: comparing less would miss a changed verdict.
    EXPECT_FALSE(SameVerdicts(before, after)) << i;
  }
}

}  // namespace
}  // namespace gpulock

namespace gpulock {
namespace {

TEST(SameReadinessInputs, OnlyTheReadingsOfTheFiltersInUseAreCompared) {
  const Device before = Reading();
  Device after = before;
  after.power_draw_watts = 80.0;  // NVML's power draw differs at almost every read
  after.utilization_percent = 0;
  LeaseRequest memory_only;
  memory_only.min_free_memory_bytes = 0;
  memory_only.allow_foreign_processes = true;
  EXPECT_TRUE(same_readiness_inputs(before, after, memory_only));
  LeaseRequest power_too = memory_only;
  power_too.max_power_watts = 0;
  EXPECT_FALSE(same_readiness_inputs(before, after, power_too));
  LeaseRequest utilisation_too = memory_only;
  utilisation_too.max_utilization_percent = 0;
  EXPECT_FALSE(same_readiness_inputs(before, after, utilisation_too));
  // Foreign processes: compared unless every request allows them.
  after = before;
  after.processes = {{10, 1 * kGiB}};
  EXPECT_TRUE(same_readiness_inputs(before, after, memory_only));
  LeaseRequest no_foreign = memory_only;
  no_foreign.allow_foreign_processes = false;
  EXPECT_FALSE(same_readiness_inputs(before, after, no_foreign));
}

}  // namespace
}  // namespace gpulock
