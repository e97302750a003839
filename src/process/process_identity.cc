// Process identity from /proc: start times, parents, owners.
#include "process/process_identity.h"

#include <pwd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "util/strings.h"

namespace gpulock {

std::optional<ProcessStat> read_process_stat(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  // "PID (COMM) STATE PPID ..." where COMM may contain spaces and parentheses: the last ')'
  // ends it.
  const auto open = line.find('(');
  const auto close = line.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return std::nullopt;
  ProcessStat stat;
  stat.comm = line.substr(open + 1, close - open - 1);
  std::istringstream fields(line.substr(close + 1));
  std::string state;
  long long parent = 0;
  fields >> state >> parent;
  // Fields 5..21 come before the start time (field 22); state is field 3, parent field 4.
  std::string skip;
  for (int field = 5; field <= 21; ++field) fields >> skip;
  unsigned long long start = 0;
  if (!(fields >> start)) return std::nullopt;
  if (state == "Z" || state == "X") return std::nullopt;  // exited, not yet reaped
  stat.parent = static_cast<pid_t>(parent);
  stat.start_ticks = start;
  return stat;
}

std::optional<ProcessId> process_id_of(pid_t pid) {
  const auto stat = read_process_stat(pid);
  if (!stat) return std::nullopt;
  return ProcessId{pid, stat->start_ticks};
}

ProcessId self_process_id() {
  // Read once per process (a fork child has a new pid, so it reads its own).
  static std::mutex mutex;
  static ProcessId cached;
  const pid_t pid = ::getpid();
  std::lock_guard<std::mutex> lock(mutex);
  if (cached.pid != pid) cached = process_id_of(pid).value_or(ProcessId{pid, 0});
  return cached;
}

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

bool is_alive(const ProcessId& process) {
  const auto stat = read_process_stat(process.pid);
  return stat && stat->start_ticks == process.start_ticks;
}

std::optional<uid_t> process_uid(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Uid:", 0) == 0) {
      std::istringstream fields(line.substr(4));
      unsigned long real = 0;
      if (fields >> real) return static_cast<uid_t>(real);
    }
  }
  return std::nullopt;
}

bool is_same_or_descendant(pid_t descendant, const ProcessId& ancestor) {
  pid_t current = descendant;
  for (int depth = 0; depth < 128 && current > 0; ++depth) {
    const auto stat = read_process_stat(current);
    if (!stat) return false;
    if (current == ancestor.pid) return stat->start_ticks == ancestor.start_ticks;
    current = stat->parent;
  }
  return false;
}

const std::string& boot_id() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string line;
    std::getline(in, line);
    return std::string(trim(line));
  }();
  return id;
}

std::string user_name(uid_t uid) {
  // The last answer is kept: processes ask about their own user over and over, and each
  // getpwuid_r parses /etc/passwd (or asks NSS) afresh.
  static std::mutex mutex;
  static std::optional<std::pair<uid_t, std::string>> last;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (last && last->first == uid) return last->second;
  }
  std::string name = std::to_string(uid);
  std::vector<char> buffer(16384);
  passwd entry{};
  passwd* found = nullptr;
  if (::getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &found) == 0 && found != nullptr)
    name = found->pw_name;
  std::lock_guard<std::mutex> lock(mutex);
  last.emplace(uid, name);
  return name;
}

std::string host_name() {
  // Read once per process: every lease record names it.
  static const std::string name = [] {
    char buffer[256] = {};
    if (::gethostname(buffer, sizeof buffer - 1) != 0) return std::string("unknown");
    return std::string(buffer);
  }();
  return name;
}

}  // namespace gpulock
