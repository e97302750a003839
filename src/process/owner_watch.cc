// The processes a detached lease is held for, watched through pidfds (process/owner_watch.h).
#include "process/owner_watch.h"

#include <dirent.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string_view>

#include <fmt/format.h>

#include "gpulock/error.hpp"

namespace gpulock {
namespace {

// The pid a /proc entry names, or 0 for entries that are not processes ("self", "sys", …).
pid_t pid_of_entry(const char* name) {
  const std::string_view text(name);
  int pid = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), pid);
  return error == std::errc() && end == text.data() + text.size() ? pid : 0;
}

bool readable(int fd) {
  pollfd ready{fd, POLLIN, 0};
  return ::poll(&ready, 1, 0) == 1 && ready.revents != 0;
}

}  // namespace

OwnerWatch OwnerWatch::process(pid_t pid) {
  const auto id = pid > 0 ? process_id_of(pid) : std::nullopt;
  OwnerWatch watch;
  if (!id || !watch.watch(*id))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("--for-pid {}: no such running process", pid));
  return watch;
}

OwnerWatch OwnerWatch::session(pid_t session, const std::vector<pid_t>& ignored) {
  OwnerWatch watch;
  watch.session_ = session;
  watch.ignored_ = ignored;
  if (session > 0) watch.watch_ancestors();
  if (session <= 0 || (watch.members_.empty() && !watch.scan()))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("session {} has no other process to hold the lease for (was this "
                            "command started with setsid?): name the process with --for-pid",
                            session));
  return watch;
}

bool OwnerWatch::watch(const ProcessId& id) {
  UniqueFd pidfd(open_pidfd(id.pid));
  if (!pidfd && errno != ENOSYS) return false;  // gone already
  // The pidfd refers to the process it was opened for: check that it is the one identified.
  if (!is_alive(id)) return false;
  members_.push_back(Member{id, std::move(pidfd)});
  return true;
}

void OwnerWatch::watch_ancestors() {
  std::vector<ProcessId> chain;  // the parent first, then its parent, while in the session
  for (pid_t pid = ::getppid(); pid > 1 && chain.size() < kMaxAncestors;) {
    const auto stat = read_process_stat(pid);
    if (!stat || stat->session != session_) break;
    if (std::find(ignored_.begin(), ignored_.end(), pid) == ignored_.end())
      chain.push_back(ProcessId{pid, stat->start_ticks});
    pid = stat->parent;
  }
  // The topmost first: the script, the login shell.
  for (auto it = chain.rbegin(); it != chain.rend() && members_.size() < kWatchedMembers; ++it)
    watch(*it);
}

bool OwnerWatch::scan() {
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return true;  // cannot look: assume the session lives on (fail safe)
  std::vector<ProcessId> found;
  const pid_t self = ::getpid();
  while (const dirent* entry = ::readdir(proc)) {
    const pid_t pid = pid_of_entry(entry->d_name);
    if (pid <= 0 || pid == self ||
        std::find(ignored_.begin(), ignored_.end(), pid) != ignored_.end())
      continue;
    const auto stat = read_process_stat(pid);
    if (stat && stat->session == session_) found.push_back(ProcessId{pid, stat->start_ticks});
  }
  ::closedir(proc);
  // The oldest first: they are the likeliest to outlive the rest, so the next scan comes late.
  std::sort(found.begin(), found.end(), [](const ProcessId& a, const ProcessId& b) {
    return a.start_ticks != b.start_ticks ? a.start_ticks < b.start_ticks : a.pid < b.pid;
  });
  for (const ProcessId& id : found) {
    if (members_.size() == kWatchedMembers) break;
    watch(id);
  }
  return !members_.empty();
}

std::vector<int> OwnerWatch::descriptors() const {
  std::vector<int> fds;
  for (const Member& m : members_)
    if (m.pidfd) fds.push_back(m.pidfd.get());
  return fds;
}

bool OwnerWatch::gone() {
  std::erase_if(members_, [](const Member& m) {
    return (m.pidfd && readable(m.pidfd.get())) || !is_alive(m.id);
  });
  if (!members_.empty() || session_ == 0) return members_.empty();
  // A process forked during a scan, below the scan's place in /proc, by a parent that exited
  // before the scan reached it, is missed by that scan; not by the next.
  return !scan() && !scan();
}

}  // namespace gpulock
