// What `gpulock run` adds to a command's wall time: `gpulock run -n 1 -- true` against a bare
// `/bin/true`, and `gpulock version` to separate the CLI's start-up from the lease itself.
//
// Each iteration spawns the three commands in turn (interleaved, so drift in the machine's load
// hits all three alike) and times each from posix_spawn() to waitpid(). Children run with
// GPULOCK_FAKE_GPUS=4 and GPULOCK_DIR set to a scratch directory; their output goes to
// /dev/null. Counters (microseconds): p50/p90 of each command, and the time added by gpulock
// run as the difference of the medians (added_p50_us) and of the p90s (added_p90_us).
// Goal (issue): <= 3 ms added. The gpulock binary is the one built with this benchmark, or
// --gpulock=PATH.
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "bench_support.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

std::string g_gpulock = GPULOCK_BENCH_CLI;  // set by CMake; --gpulock=PATH overrides it

// Runs argv (an absolute path) with stdio on /dev/null; returns the wall time in seconds, or
// nullopt if it could not be started or did not exit with status 0.
std::optional<double> time_command(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int fd = 0; fd <= 2; ++fd)
    posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);

  const Clock::time_point start = Clock::now();
  pid_t pid = 0;
  const int error = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) return std::nullopt;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  const Clock::time_point end = Clock::now();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return std::chrono::duration<double>(end - start).count();
}

void BM_RunOverhead(benchmark::State& state) {
  gpulock_bench::TempDir scratch;
  ::setenv("GPULOCK_FAKE_GPUS", "4", 1);
  ::setenv("GPULOCK_DIR", scratch.lock_dir().c_str(), 1);
  const std::vector<std::string> bare = {"/bin/true"};
  const std::vector<std::string> version = {g_gpulock, "version"};
  const std::vector<std::string> run = {g_gpulock, "run", "-n", "1", "--", "true"};

  // Warm-up: page cache, and the lock directory and files gpulock creates on first use.
  for (const auto* command : {&bare, &version, &run}) {
    if (!time_command(*command)) {
      state.SkipWithError(("cannot run " + (*command)[0] + " " +
                           (command->size() > 1 ? (*command)[1] : "") + " (exit status != 0)")
                              .c_str());
      return;
    }
  }

  std::vector<double> bare_s, version_s, run_s, paired_s;
  for (auto _ : state) {
    const auto b = time_command(bare);
    const auto v = time_command(version);
    const auto r = time_command(run);
    if (!b || !v || !r) {
      state.SkipWithError("a command failed");
      break;
    }
    bare_s.push_back(*b);
    version_s.push_back(*v);
    run_s.push_back(*r);
    paired_s.push_back(*r - *b);
    state.SetIterationTime(*r);
  }
  ::unsetenv("GPULOCK_FAKE_GPUS");
  ::unsetenv("GPULOCK_DIR");
  if (run_s.empty()) return;

  using gpulock_bench::quantile;
  constexpr double kMicro = 1e6;
  const double bare50 = quantile(bare_s, 0.5), bare90 = quantile(bare_s, 0.9);
  const double run50 = quantile(run_s, 0.5), run90 = quantile(run_s, 0.9);
  state.counters["bare_p50_us"] = bare50 * kMicro;
  state.counters["bare_p90_us"] = bare90 * kMicro;
  state.counters["version_p50_us"] = quantile(version_s, 0.5) * kMicro;
  state.counters["version_p90_us"] = quantile(version_s, 0.9) * kMicro;
  state.counters["run_p50_us"] = run50 * kMicro;
  state.counters["run_p90_us"] = run90 * kMicro;
  state.counters["added_p50_us"] = (run50 - bare50) * kMicro;
  state.counters["added_p90_us"] = (run90 - bare90) * kMicro;
  state.counters["paired_p50_us"] = quantile(paired_s, 0.5) * kMicro;
}
BENCHMARK(BM_RunOverhead)->UseManualTime()->Iterations(1000)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  // Our own flag, removed before Google Benchmark sees the arguments.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--gpulock=", 10) == 0) {
      g_gpulock = argv[i] + 10;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (g_gpulock.empty() || g_gpulock[0] != '/') {
    char* real = ::realpath(g_gpulock.c_str(), nullptr);
    if (real == nullptr) {
      std::fprintf(stderr, "run_overhead_bench: no gpulock binary at '%s'\n", g_gpulock.c_str());
      return 1;
    }
    g_gpulock = real;
    std::free(real);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
