// Identifying processes beyond their PID: PIDs are reused, so a process is its PID plus its
// start time (field 22 of /proc/PID/stat, in clock ticks since boot) on one boot of one host.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace gpulock {

struct ProcessId {
  pid_t pid = 0;
  std::uint64_t start_ticks = 0;
  bool operator==(const ProcessId&) const = default;
};

// Fields of /proc/PID/stat that gpulock uses; nullopt if the process is gone (or unreadable).
struct ProcessStat {
  pid_t parent = 0;
  pid_t session = 0;  // the session's id: its leader's pid (field 6)
  std::uint64_t start_ticks = 0;
  std::string comm;
};
std::optional<ProcessStat> read_process_stat(pid_t pid);

std::optional<ProcessId> process_id_of(pid_t pid);
ProcessId self_process_id();

// A pidfd for the process (Linux >= 5.3), or -1 with errno set (ENOSYS on older kernels). It
// refers to that process even if its pid is later reused.
int open_pidfd(pid_t pid);

// True while that very process (same PID and start time) exists.
bool is_alive(const ProcessId& process);

// The real user id of a running process, from /proc/PID/status.
std::optional<uid_t> process_uid(pid_t pid);

// True if `descendant` is `ancestor` or one of its descendants (walks the parent chain).
bool is_same_or_descendant(pid_t descendant, const ProcessId& ancestor);

// True if process `pid` holds the write end of the pipe that this process's descriptor `fd` is
// (e.g. fd 1 inside `$(…)`: the shell process that runs the same substitution). False when `fd`
// is not a pipe, or the process's descriptors cannot be read (another user's).
bool writes_to_pipe_of(pid_t pid, int fd);

// This boot's id (/proc/sys/kernel/random/boot_id), or "" where unavailable.
const std::string& boot_id();

// The name of a user id ("alice"), or the number as text when it has no name.
std::string user_name(uid_t uid);

// This machine's host name.
std::string host_name();

}  // namespace gpulock
