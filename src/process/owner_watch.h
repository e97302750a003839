// OwnerWatch: waits, without polling, until the processes a detached lease is held for are gone:
// one process (`gpulock acquire --for-pid PID`), or every process of a session (the default of
// `gpulock acquire`: the caller's session).
//
// A session grows only by fork from one of its members: setsid() leaves it, and nothing else
// joins it. So the session has a process left as long as any member the watch knows of lives,
// and once all of those have exited, every member left is one a scan of /proc finds. The watch
// starts from the caller's own ancestors in the session (a few reads, whatever the machine runs;
// the topmost, the script or the login shell, likely outlasts the rest), holds their pidfds, and
// scans /proc only once all of those have exited, then watches the oldest members the scan
// found. The session has ended when a scan, made twice, finds no member. A scan reads
// /proc/PID/stat of every process of the machine (about 5 µs each); it happens once per
// generation of watched members, not per exit, and not at all while the script that asked runs.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "process/process_identity.h"
#include "util/fd.h"

namespace gpulock {

class OwnerWatch {
 public:
  // Throws Error(kInvalidArgument) when the process is not running.
  static OwnerWatch process(pid_t pid);
  // Every process of session `session` but those named in `ignored` (e.g. the caller itself,
  // which is about to exit); throws Error(kInvalidArgument) when it has no other process.
  static OwnerWatch session(pid_t session, const std::vector<pid_t>& ignored = {});

  // pidfds to poll for POLLIN: each is readable once its process has exited. Empty where pidfds
  // are not available (Linux < 5.3): then call gone() every kFallbackPoll.
  std::vector<int> descriptors() const;
  static constexpr std::chrono::milliseconds kFallbackPoll{1000};

  // After one of descriptors() was readable, or a fallback period passed: drops the members that
  // exited, scans the session again when none is left, and returns true once no process is left.
  bool gone();

  // The session watched, or 0 for a single process.
  pid_t session_id() const { return session_; }

 private:
  struct Member {
    ProcessId id;
    UniqueFd pidfd;  // invalid where pidfd_open is not available
  };
  // The most members watched at once: enough that a scan is rare, few enough descriptors.
  static constexpr std::size_t kWatchedMembers = 16;

  OwnerWatch() = default;
  static constexpr std::size_t kMaxAncestors = 128;
  // Watches the caller's ancestors that are members of the session.
  void watch_ancestors();
  // Finds the session's members now; true if there is at least one.
  bool scan();
  bool watch(const ProcessId& id);

  pid_t session_ = 0;
  std::vector<pid_t> ignored_;
  std::vector<Member> members_;
};

}  // namespace gpulock
