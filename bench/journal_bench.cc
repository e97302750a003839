// What the usage journal adds to an uncontended acquire + release (issue 16: <= 5 us median).
//
// Two pools side by side in one run, on simulated GPUs and fresh scratch lock directories: one
// with the journal on (a start and an end record appended to <lock dir>/journal per lease), one
// with it off (journal_dir = "off"). Repetitions alternate between the two so that both see
// the same machine state; each figure is the median of 15 repetitions. The difference of the
// medians is the journal's cost.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <gpulock/gpulock.hpp>

#include "bench_support.h"

namespace {

void run(benchmark::State& state, bool journal) {
  gpulock_bench::TempDir scratch;
  gpulock::PoolOptions options;
  options.lock_dir = scratch.lock_dir();
  gpulock::Config config;
  if (!journal) config.journal_dir = "off";
  options.config = config;
  gpulock::GpuPool pool(gpulock::make_simulated_source(4), options);
  gpulock::LeaseRequest request;
  request.count = 1;
  request.wait = false;
  pool.acquire(request).release();  // lock files and the journal's file exist from here on
  for (auto _ : state) {
    gpulock::Lease lease = pool.acquire(request);
    benchmark::DoNotOptimize(lease.lock_fds().data());
    lease.release();
  }
}

void BM_AcquireReleaseWithoutJournal(benchmark::State& state) {
  run(state, false);
}
void BM_AcquireReleaseWithJournal(benchmark::State& state) {
  run(state, true);
}

// Prints each run as usual and keeps its time, for the medians printed at the end.
class MedianReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& run : runs) times_[run.benchmark_name()].push_back(run.GetAdjustedRealTime());
    ConsoleReporter::ReportRuns(runs);
  }
  double median(const std::string& name) {
    auto values = times_[name];
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  }

 private:
  std::map<std::string, std::vector<double>> times_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  // Alternate: without, with, without, with, … (one repetition each), then aggregate by name.
  for (int i = 0; i < 15; ++i) {
    benchmark::RegisterBenchmark("BM_AcquireReleaseWithoutJournal", BM_AcquireReleaseWithoutJournal)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("BM_AcquireReleaseWithJournal", BM_AcquireReleaseWithJournal)
        ->Unit(benchmark::kMicrosecond);
  }
  MedianReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  const double without = reporter.median("BM_AcquireReleaseWithoutJournal");
  const double with = reporter.median("BM_AcquireReleaseWithJournal");
  std::printf(
      "\nmedian of 15, acquire + release of 1 of 4 GPUs: without journal %.2f us, "
      "with journal %.2f us: the journal adds %.2f us (%.2fx)\n",
      without, with, with - without, without > 0 ? with / without : 0.0);
  return 0;
}
