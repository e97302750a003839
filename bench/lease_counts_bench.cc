// What keeping the lease counters costs as the usage journal grows (issue 16): the one-shot
// count of `gpulock metrics` (GpuPool::lease_counts(), the whole journal read) against serve's
// incremental follow (GpuPool::follow_lease_counts(), only what was appended since the last
// reading), each measured with a journal of N leases for two N in one run.
//
// For each N: a scratch pool on 4 simulated GPUs writes N leases (acquire + release); a
// follower takes its first (whole) reading; then 15 times: 10 more leases and one incremental
// follow timed; then 5 times: 10 more leases and one one-shot count timed. Printed: the medians,
// and the ratio of the large journal's median to the small one's for each way (1.0: the cost does
// not grow).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include <gpulock/gpulock.hpp>

#include "bench_support.h"

namespace {

struct Medians {
  double follow_us = 0;
  double whole_us = 0;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

void add_leases(gpulock::GpuPool& pool, int count) {
  gpulock::LeaseRequest request;
  request.count = 1;
  request.wait = false;
  for (int i = 0; i < count; ++i) pool.acquire(request).release();
}

template <typename F>
double microseconds(F&& f) {
  const auto begin = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin)
      .count();
}

Medians measure(int leases) {
  gpulock_bench::TempDir scratch;
  gpulock::PoolOptions options;
  options.lock_dir = scratch.lock_dir();
  gpulock::GpuPool pool(gpulock::make_simulated_source(4), options);
  add_leases(pool, leases);
  gpulock::LeaseCountFollower follower;
  pool.follow_lease_counts(follower);  // the first reading takes the whole journal
  std::vector<double> follow, whole;
  for (int round = 0; round < 15; ++round) {
    add_leases(pool, 10);
    follow.push_back(microseconds([&] { pool.follow_lease_counts(follower); }));
  }
  for (int round = 0; round < 5; ++round) {
    add_leases(pool, 10);
    whole.push_back(microseconds([&] { pool.lease_counts(); }));
  }
  pool.follow_lease_counts(follower);
  const auto& counts = follower.counts();
  std::uint64_t started = 0;
  for (const auto& entry : counts.started) started += entry.second;
  std::printf("%7d leases in the journal: follow %9.1f us   whole %10.1f us   (counted %llu)\n",
              leases, median(follow), median(whole), static_cast<unsigned long long>(started));
  return {median(follow), median(whole)};
}

}  // namespace

int main() {
  const int small = 1000, large = 20000;
  const Medians a = measure(small);
  const Medians b = measure(large);
  std::printf("large/small (%d/%d leases): follow %.2fx   whole %.2fx\n", large, small,
              b.follow_us / a.follow_us, b.whole_us / a.whole_us);
  return 0;
}
