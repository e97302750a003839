// Process identity from /proc: start times, parents, owners.
#include "process/process_identity.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string_view>
#include <vector>

#include "util/current_pid.h"
#include "util/strings.h"

namespace gpulock {

std::optional<ProcessStat> read_process_stat(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  // One open and read, no iostreams: every lease and every waiter reads it (a tenth of what
  // `gpulock run` did between its lease and the command's start, with std::ifstream).
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buffer[1024];  // the line is at most a few hundred bytes (comm is at most 64)
  ssize_t got;
  do {
    got = ::read(fd, buffer, sizeof buffer - 1);
  } while (got < 0 && errno == EINTR);
  ::close(fd);
  if (got <= 0) return std::nullopt;
  const std::string_view line(buffer, static_cast<std::size_t>(got));
  // "PID (COMM) STATE PPID ..." where COMM may contain spaces and parentheses: the last ')'
  // ends it.
  const auto open = line.find('(');
  const auto close = line.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open)
    return std::nullopt;
  ProcessStat stat;
  stat.comm = std::string(line.substr(open + 1, close - open - 1));
  // The fields after COMM, separated by single spaces: state is field 3, the parent field 4,
  // the session field 6, the start time field 22.
  std::string_view rest = line.substr(close + 1);
  std::string_view fields[20];
  std::size_t count = 0;
  while (count < 20) {
    const auto begin = rest.find_first_not_of(" \n");
    if (begin == std::string_view::npos) break;
    rest.remove_prefix(begin);
    const auto end = std::min(rest.find_first_of(" \n"), rest.size());
    fields[count++] = rest.substr(0, end);
    rest.remove_prefix(end);
  }
  if (count < 20) return std::nullopt;
  const auto number = [](std::string_view text, unsigned long long& value) {
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    return error == std::errc() && end == text.data() + text.size();
  };
  unsigned long long parent = 0, session = 0, start = 0;
  // fields[0] is field 3 (state), fields[1] field 4 (parent), fields[3] field 6 (session),
  // fields[19] field 22 (start).
  if (!number(fields[1], parent) || !number(fields[3], session) || !number(fields[19], start))
    return std::nullopt;
  if (fields[0] == "Z" || fields[0] == "X") return std::nullopt;  // exited, not yet reaped
  stat.parent = static_cast<pid_t>(parent);
  stat.session = static_cast<pid_t>(session);
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
  const pid_t pid = current_pid();
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

bool writes_to_pipe_of(pid_t pid, int fd) {
  struct stat pipe_stat {};
  if (::fstat(fd, &pipe_stat) != 0 || !S_ISFIFO(pipe_stat.st_mode)) return false;
  const std::string pipe_name = "pipe:[" + std::to_string(pipe_stat.st_ino) + "]";
  const std::string fd_dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* dir = ::opendir(fd_dir.c_str());
  if (dir == nullptr) return false;
  bool writes = false;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    char target[64];
    const ssize_t n = ::readlinkat(::dirfd(dir), entry->d_name, target, sizeof target);
    if (n <= 0 || std::string_view(target, static_cast<std::size_t>(n)) != pipe_name) continue;
    // Both ends read as the same pipe: the descriptor's open flags tell them apart.
    std::ifstream info("/proc/" + std::to_string(pid) + "/fdinfo/" + entry->d_name);
    std::string line;
    while (std::getline(info, line)) {
      if (!line.starts_with("flags:")) continue;
      const unsigned long flags = std::strtoul(line.c_str() + 6, nullptr, 8);
      if ((flags & O_ACCMODE) != O_RDONLY) writes = true;
      break;
    }
    if (writes) break;
  }
  ::closedir(dir);
  return writes;
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
