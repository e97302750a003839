// Kernel baselines behind the hand-off figures, without gpulock: what the primitives gpulock's
// waiters are built on (an inotify watch on the lock directory, OFD locks) cost by themselves.
//   BM_InotifyClose: closing an inotify descriptor whose directory watch has just delivered an
//     event raised on another CPU (what a waiter does when acquire() returns). Times close().
//   BM_CloseWriteEvent: a holder closes its locked descriptor; a waiter woken by the resulting
//     IN_CLOSE_WRITE at once asks F_OFD_GETLK whether the lock is gone. Counts how often the
//     lock is still there when the event arrives (still_locked), i.e. how often a waiter that
//     trusts the event alone would go back to sleep. Times the wake-up.
//   BM_KernelFloorLease: open + F_OFD_SETLK + close of a lock file, the least an uncontended
//     lease can cost (also in acquire_release_bench, to compare in one run).
#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench_support.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

bool lock_held_elsewhere(int fd) {
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  return ::fcntl(fd, F_OFD_GETLK, &lock) == 0 && lock.l_type != F_UNLCK;
}

void drain(int inotify_fd) {
  alignas(inotify_event) char buffer[4096];
  while (::read(inotify_fd, buffer, sizeof buffer) > 0) {
  }
}

void BM_InotifyClose(benchmark::State& state) {
  gpulock_bench::TempDir scratch;
  const std::string dir = scratch.path().string();
  const std::string file = dir + "/gpu-x.lock";
  std::atomic<int> phase{0};  // 0 idle, 1 make an event, 2 stop
  std::thread writer([&] {
    while (true) {
      phase.wait(0);
      if (phase.load() == 2) return;
      ::close(::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));  // IN_CLOSE_WRITE
      phase.store(0);
    }
  });
  std::vector<double> samples;
  for (auto _ : state) {
    const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    ::inotify_add_watch(fd, dir.c_str(), IN_CLOSE_WRITE | IN_ONLYDIR);
    phase.store(1);
    phase.notify_one();
    pollfd readable{fd, POLLIN, 0};
    ::poll(&readable, 1, 1000);
    drain(fd);
    const Clock::time_point start = Clock::now();
    ::close(fd);
    const double seconds = seconds_between(start, Clock::now());
    samples.push_back(seconds);
    state.SetIterationTime(seconds);
    while (phase.load() != 0) std::this_thread::yield();
  }
  phase.store(2);
  phase.notify_one();
  writer.join();
  gpulock_bench::add_percentile_counters(state, std::move(samples));
}
BENCHMARK(BM_InotifyClose)->UseManualTime()->Iterations(500)->Unit(benchmark::kMicrosecond);

void BM_CloseWriteEvent(benchmark::State& state) {
  gpulock_bench::TempDir scratch;
  const std::string dir = scratch.path().string();
  const std::string file = dir + "/gpu-x.lock";
  const int inotify_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ::inotify_add_watch(inotify_fd, dir.c_str(), IN_CLOSE_WRITE | IN_ONLYDIR);
  const int probe_fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  drain(inotify_fd);

  // The waiter thread: sleeps in poll() on the watch, then checks the lock at once.
  std::atomic<int> phase{0};  // 0 idle, 1 wait now, 2 waiting, 3 woke, 4 stop
  std::atomic<bool> still_locked{false};
  Clock::time_point woke_at;
  std::thread waiter([&] {
    while (true) {
      int now = phase.load();
      while (now != 1 && now != 4) now = phase.load();  // spin: both threads stay on a CPU
      if (phase.load() == 4) return;
      phase.store(2);
      pollfd readable{inotify_fd, POLLIN, 0};
      ::poll(&readable, 1, 1000);
      woke_at = Clock::now();
      still_locked.store(lock_held_elsewhere(probe_fd));
      drain(inotify_fd);
      phase.store(3);
    }
  });

  std::vector<double> samples;
  int still = 0;
  for (auto _ : state) {
    const int holder = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
    struct flock lock {};
    lock.l_type = F_WRLCK;
    lock.l_whence = SEEK_SET;
    ::fcntl(holder, F_OFD_SETLK, &lock);
    phase.store(1);
    while (phase.load() != 2) {
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // into poll()
    const Clock::time_point released_at = Clock::now();
    ::close(holder);
    while (phase.load() != 3) {
    }
    still += still_locked.load() ? 1 : 0;
    const double seconds = seconds_between(released_at, woke_at);
    samples.push_back(seconds);
    state.SetIterationTime(seconds > 0 ? seconds : 1e-9);
    phase.store(0);
  }
  phase.store(4);
  waiter.join();
  ::close(probe_fd);
  ::close(inotify_fd);
  state.counters["still_locked"] = still;
  gpulock_bench::add_percentile_counters(state, std::move(samples));
}
BENCHMARK(BM_CloseWriteEvent)->UseManualTime()->Iterations(5000)->Unit(benchmark::kMicrosecond);

// The floor of an uncontended lease: open + F_OFD_SETLK + close (bench_support.h).
void BM_KernelFloorLease(benchmark::State& state) {
  gpulock_bench::kernel_floor_lease(state);
}
BENCHMARK(BM_KernelFloorLease)
    ->Unit(benchmark::kMicrosecond)
    ->Repetitions(10)
    ->ReportAggregatesOnly(true);

}  // namespace

BENCHMARK_MAIN();
