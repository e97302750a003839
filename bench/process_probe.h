// Multi-process benchmark plumbing: spawning worker processes, reading their scheduler counters
// from /proc, waiting until they are all asleep, and fixed-size messages over a shared pipe.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace gpulock_bench {

// CLOCK_MONOTONIC in nanoseconds (system-wide, so comparable between processes).
inline std::int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

inline void sleep_ns(std::int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

inline bool write_all(int fd, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

inline bool read_all(int fd, void* data, std::size_t size) {
  auto* bytes = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

// Reads exactly `size` bytes, giving up (false) if nothing arrives for timeout_ms.
inline bool read_all_within(int fd, void* data, std::size_t size, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  return read_all(fd, data, size);
}

// A pipe whose ends are close-on-exec and numbered 10 or above, so that a spawned child can get
// them as descriptors 3 and 4 by dup2 without clashing.
struct Pipe {
  int read_end = -1;
  int write_end = -1;
  static Pipe make() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    Pipe p;
    p.read_end = ::fcntl(fds[0], F_DUPFD_CLOEXEC, 10);
    p.write_end = ::fcntl(fds[1], F_DUPFD_CLOEXEC, 10);
    ::close(fds[0]);
    ::close(fds[1]);
    if (p.read_end < 0 || p.write_end < 0) throw std::runtime_error("fcntl(F_DUPFD) failed");
    return p;
  }
  void close_both() {
    if (read_end >= 0) ::close(read_end);
    if (write_end >= 0) ::close(write_end);
    read_end = write_end = -1;
  }
};

// Starts `path` with `args` (argv[0] included) and exactly the environment `env`; the child gets
// report_fd as descriptor 3 and command_fd as descriptor 4 (/dev/null for -1).
inline pid_t spawn_process(const std::string& path, const std::vector<std::string>& args,
                           const std::vector<std::string>& env, int report_fd, int command_fd) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (report_fd >= 0) posix_spawn_file_actions_adddup2(&actions, report_fd, 3);
  if (command_fd >= 0) {
    posix_spawn_file_actions_adddup2(&actions, command_fd, 4);
  } else {
    posix_spawn_file_actions_addopen(&actions, 4, "/dev/null", O_RDONLY, 0);
  }
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int error = ::posix_spawn(&pid, path.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) throw std::runtime_error(std::string("posix_spawn: ") + std::strerror(error));
  return pid;
}

// One process's scheduler counters, from /proc/PID/{stat,status,schedstat}.
struct ProcSample {
  bool ok = false;
  char state = '?';           // R, S, D, ...
  long long cpu_ticks = 0;    // utime + stime, in clock ticks (sysconf(_SC_CLK_TCK))
  long long runtime_ns = 0;   // time on a CPU (schedstat), nanoseconds
  long long voluntary = 0;    // voluntary context switches: the task went to sleep
  long long involuntary = 0;  // preempted
};

inline std::string read_small_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out(4096, '\0');
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

// The number after `key` in a /proc status text, or -1.
inline long long status_field(std::string_view text, std::string_view key) {
  const auto at = text.find(key);
  if (at == std::string_view::npos) return -1;
  return std::strtoll(text.data() + at + key.size(), nullptr, 10);
}

inline ProcSample sample_process(pid_t pid) {
  ProcSample s;
  const std::string base = "/proc/" + std::to_string(pid);
  const std::string stat = read_small_file(base + "/stat");
  const auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return s;
  s.state = stat[close + 2];
  // Fields after the command: 3 state ... 14 utime, 15 stime.
  const char* p = stat.c_str() + close + 2;
  for (int field = 3; field < 14 && *p != '\0'; ++field) {
    p = std::strchr(p, ' ');
    if (p == nullptr) return s;
    ++p;
  }
  char* end = nullptr;
  const long long utime = std::strtoll(p, &end, 10);
  const long long stime = std::strtoll(end, nullptr, 10);
  s.cpu_ticks = utime + stime;
  const std::string schedstat = read_small_file(base + "/schedstat");
  s.runtime_ns = std::strtoll(schedstat.c_str(), nullptr, 10);
  const std::string status = read_small_file(base + "/status");
  s.voluntary = status_field(status, "\nvoluntary_ctxt_switches:");
  s.involuntary = status_field(status, "\nnonvoluntary_ctxt_switches:");
  s.ok = s.voluntary >= 0 && s.involuntary >= 0;
  return s;
}

inline std::vector<ProcSample> sample_processes(const std::vector<pid_t>& pids) {
  std::vector<ProcSample> out;
  out.reserve(pids.size());
  for (pid_t pid : pids) out.push_back(sample_process(pid));
  return out;
}

// Waits until every process is asleep (S) and none has run for quiet_ns (its context-switch
// counts unchanged). Returns the last sample, or an empty vector after timeout_ns.
inline std::vector<ProcSample> wait_until_quiet(const std::vector<pid_t>& pids,
                                                std::int64_t quiet_ns, std::int64_t timeout_ns) {
  const std::int64_t give_up = now_ns() + timeout_ns;
  std::vector<ProcSample> last = sample_processes(pids);
  std::int64_t quiet_since = now_ns();
  while (now_ns() < give_up) {
    sleep_ns(5'000'000);
    std::vector<ProcSample> next = sample_processes(pids);
    bool asleep = true, same = true;
    for (std::size_t i = 0; i < pids.size(); ++i) {
      asleep = asleep && next[i].ok && next[i].state == 'S';
      same = same && next[i].voluntary == last[i].voluntary &&
             next[i].involuntary == last[i].involuntary;
    }
    if (!asleep || !same) quiet_since = now_ns();
    last = std::move(next);
    if (now_ns() - quiet_since >= quiet_ns) return last;
  }
  return {};
}

}  // namespace gpulock_bench
