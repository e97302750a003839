// A whole sweep started at once (issue 39): N `gpulock run -n 1 -- true` spawned back to back by
// a posix_spawn loop, against N `flock FILE true` spawned the same way, alternating in one run.
//
// For each lock directory given (a tmpfs one and an ext4 one, say), each N and each repeat, the
// program starts the flock storm, then the gpulock storm, each in a process group of its own,
// and reports the drain (seconds from the first spawn to the last exit), the CPU the storm's
// processes used (their utime + stime, from RUSAGE_CHILDREN) and gpulock's ratio to flock(1)
// for both. A storm that has not drained after --limit seconds is killed as a group and
// reported with how many had exited. Every process is killed when the program ends, however it
// ends (the group is SIGKILLed on a signal too).
//
// Usage: storm_bench [--gpulock=PATH] [--sizes=1000,4000] [--gpus=1] [--repeats=3]
//                    [--limit=300] DIR...
// Each DIR is a scratch directory (made if missing) on the filesystem to measure; the lock
// directory and flock's file are made inside it, and removed afterwards. Children run with
// GPULOCK_FAKE_GPUS=<gpus> and their output on /dev/null; a child that exits non-zero counts
// as failed (reported, never hidden).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::atomic<pid_t> g_group{0};  // the running storm's process group, killed on a signal

void kill_group_and_exit(int sig) {
  const pid_t group = g_group.load();
  if (group > 0) ::kill(-group, SIGKILL);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

double cpu_seconds_of_children() {
  rusage usage{};
  ::getrusage(RUSAGE_CHILDREN, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

struct StormResult {
  double drain_s = 0;
  double cpu_s = 0;
  double spawn_s = 0;  // how long the loop took to start them all
  int exited = 0;
  int failed = 0;
  bool drained = false;
};

// Spawns `n` copies of argv back to back in one new process group, then reaps them.
StormResult storm(const std::vector<std::string>& args, const std::vector<std::string>& env, int n,
                  double limit_s) {
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  for (int fd = 0; fd <= 2; ++fd)
    posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);

  StormResult result;
  const double cpu_before = cpu_seconds_of_children();
  const Clock::time_point start = Clock::now();
  const Clock::time_point give_up =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limit_s));
  int started = 0;
  for (int i = 0; i < n; ++i) {
    posix_spawnattr_setpgroup(&attributes, g_group.load());  // 0 first: a group of its own
    pid_t pid = 0;
    const int error = ::posix_spawn(&pid, argv[0], &actions, &attributes, argv.data(), envp.data());
    if (error != 0) {
      std::fprintf(stderr, "storm_bench: posix_spawn %s: %s\n", argv[0], std::strerror(error));
      break;
    }
    if (g_group.load() == 0) g_group.store(pid);
    ++started;
  }
  result.spawn_s = std::chrono::duration<double>(Clock::now() - start).count();
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);

  while (result.exited < started) {
    int status = 0;
    const pid_t pid = ::waitpid(-g_group.load(), &status, WNOHANG);
    if (pid > 0) {
      ++result.exited;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++result.failed;
      continue;
    }
    if (pid < 0 && errno != EINTR) break;
    if (Clock::now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  result.drained = result.exited == started && started == n;
  result.drain_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (!result.drained) {
    ::kill(-g_group.load(), SIGKILL);
    while (::waitpid(-g_group.load(), nullptr, 0) > 0) {
    }
  }
  g_group.store(0);
  result.cpu_s = cpu_seconds_of_children() - cpu_before;
  return result;
}

std::string filesystem_of(const fs::path& dir) {
  struct statfs st {};
  if (::statfs(dir.c_str(), &st) != 0) return "?";
  switch (st.f_type) {
    case 0x01021994:
      return "tmpfs";
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x794c7630:
      return "overlayfs";
    default:
      return "other";
  }
}

std::vector<int> parse_sizes(const std::string& text) {
  std::vector<int> sizes;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t comma = text.find(',', at);
    sizes.push_back(std::stoi(text.substr(at, comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return sizes;
}

std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  std::size_t at = 0;
  while (at <= dirs.size()) {
    const std::size_t colon = dirs.find(':', at);
    const fs::path candidate = fs::path(dirs.substr(at, colon - at)) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string::npos) break;
    at = colon + 1;
  }
  return name;
}

void print(const char* what, const StormResult& r) {
  std::printf("    %-8s drain %8.2f s  cpu %8.2f s  (spawned in %.2f s)%s", what, r.drain_s,
              r.cpu_s, r.spawn_s, r.drained ? "" : "  NOT DRAINED");
  if (!r.drained) std::printf(": %d exited", r.exited);
  if (r.failed) std::printf("  %d FAILED", r.failed);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string gpulock;
#ifdef GPULOCK_BENCH_CLI
  gpulock = GPULOCK_BENCH_CLI;
#endif
  std::vector<int> sizes = {1000, 4000};
  int gpus = 1, repeats = 3;
  double limit_s = 300;
  std::vector<fs::path> dirs;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&](const char* flag) -> const char* {
      const std::size_t len = std::strlen(flag);
      return arg.compare(0, len, flag) == 0 ? argv[i] + len : nullptr;
    };
    if (const char* v = value("--gpulock=")) {
      gpulock = v;
    } else if (const char* v = value("--sizes=")) {
      sizes = parse_sizes(v);
    } else if (const char* v = value("--gpus=")) {
      gpus = std::atoi(v);
    } else if (const char* v = value("--repeats=")) {
      repeats = std::atoi(v);
    } else if (const char* v = value("--limit=")) {
      limit_s = std::atof(v);
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "storm_bench: unknown flag %s\n", arg.c_str());
      return 2;
    } else {
      dirs.emplace_back(arg);
    }
  }
  if (dirs.empty() || gpulock.empty() || gpus < 1 || repeats < 1) {
    std::fprintf(stderr,
                 "usage: storm_bench [--gpulock=PATH] [--sizes=1000,4000] [--gpus=1] "
                 "[--repeats=3] [--limit=300] DIR...\n");
    return 2;
  }
  gpulock = fs::absolute(gpulock);
  const std::string flock = find_in_path("flock");
  const std::string truth = find_in_path("true");

  rlimit limit{};
  if (::getrlimit(RLIMIT_NPROC, &limit) == 0) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NPROC, &limit);
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it comes, into a file too
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, kill_group_and_exit);

  std::printf("storm: %s, %d GPU%s, %d repeat%s\n", gpulock.c_str(), gpus, gpus == 1 ? "" : "s",
              repeats, repeats == 1 ? "" : "s");
  for (const fs::path& dir : dirs) {
    fs::create_directories(dir);
    const std::string kind = filesystem_of(dir);
    for (const int n : sizes) {
      std::vector<double> drain_ratio, cpu_ratio;
      for (int r = 0; r < repeats; ++r) {
        const fs::path scratch = dir / ("storm-" + std::to_string(::getpid()));
        fs::remove_all(scratch);
        fs::create_directories(scratch);
        const std::string lock_file = scratch / "flock-file";
        ::close(::open(lock_file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
        std::vector<std::string> env;
        for (char** e = environ; *e; ++e) env.emplace_back(*e);
        env.push_back("GPULOCK_FAKE_GPUS=" + std::to_string(gpus));
        env.push_back("GPULOCK_DIR=" + (scratch / "locks").string());
        // The lock directory and its files as a first use makes them, outside the timing.
        storm({gpulock, "run", "-n", "1", "--", truth}, env, 1, limit_s);

        std::printf("  %s (%s), N = %d, repeat %d\n", dir.c_str(), kind.c_str(), n, r + 1);
        const StormResult base = storm({flock, lock_file, truth}, env, n, limit_s);
        print("flock", base);
        const StormResult ours = storm({gpulock, "run", "-n", "1", "--", truth}, env, n, limit_s);
        print("gpulock", ours);
        if (base.drained && ours.drained && base.drain_s > 0 && base.cpu_s > 0) {
          drain_ratio.push_back(ours.drain_s / base.drain_s);
          cpu_ratio.push_back(ours.cpu_s / base.cpu_s);
          std::printf("    ratio    drain %8.2fx     cpu %8.2fx\n", drain_ratio.back(),
                      cpu_ratio.back());
        }
        std::fflush(stdout);
        fs::remove_all(scratch);
      }
      if (!drain_ratio.empty()) {
        std::sort(drain_ratio.begin(), drain_ratio.end());
        std::sort(cpu_ratio.begin(), cpu_ratio.end());
        std::printf("  => %s, N = %d: median ratio drain %.2fx, cpu %.2fx (%zu of %d repeats)\n",
                    kind.c_str(), n, drain_ratio[drain_ratio.size() / 2],
                    cpu_ratio[cpu_ratio.size() / 2], drain_ratio.size(), repeats);
      }
    }
  }
  return 0;
}
