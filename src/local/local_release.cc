// GpuPool::release() and stop_lease(): ending a detached lease (or, for stop_lease, a lease of
// `gpulock run`) by stopping its holder, owner or root only.
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "backend/release_checks.h"
#include "gpulock/error.hpp"
#include "local/local_backend.h"
#include "local/wait_channel.h"
#include "process/process_identity.h"
#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

constexpr auto kReleaseWait = std::chrono::seconds(10);

// True if one of the process's open descriptors refers to `path` (same device and inode).
// Readable for our own processes, and for root.
bool process_has_file_open(pid_t pid, const std::filesystem::path& path) {
  struct stat target {};
  if (::stat(path.c_str(), &target) != 0) return false;
  std::error_code error;
  const std::filesystem::path fds = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& entry : std::filesystem::directory_iterator(fds, error)) {
    struct stat st {};
    if (::stat(entry.path().c_str(), &st) == 0 && st.st_dev == target.st_dev &&
        st.st_ino == target.st_ino)
      return true;
  }
  return false;
}

// Through the pidfd where there is one, so a recycled pid cannot receive it.
bool send_signal(int pidfd, pid_t pid, int signal) {
#ifdef SYS_pidfd_send_signal
  if (pidfd >= 0) return ::syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0) == 0;
#endif
  (void)pidfd;
  return ::kill(pid, signal) == 0;
}

// The record of lease `id` on a GPU: the exclusive holder's, or one of its shared leases'.
const HolderRecord* record_of(const LockState& p, const std::string& id) {
  if (!p.locked) return nullptr;
  if (p.record && p.record->lease_id == id) return &*p.record;
  for (const auto& record : p.shared_records)
    if (record.lease_id == id) return &record;
  return nullptr;
}

}  // namespace

void LocalBackend::release(const std::string& lease_id, bool also_run) {
  check_lease_id(lease_id);
  std::optional<HolderRecord> found;
  std::vector<std::string> uuids;
  for (const Device& device : source_->devices()) {
    const LockState p = probe(device.uuid, true);
    const HolderRecord* record = record_of(p, lease_id);
    if (!record) continue;
    // Records are untrusted: someone could plant one naming this lease on a GPU they locked.
    // All records of the lease must agree on who holds it.
    if (found && (found->holder != record->holder || found->uid != record->uid ||
                  found->kind != record->kind))
      throw Error(ErrorCode::kInternal,
                  fmt::format("the records of lease {} disagree about its holder (tampered "
                              "with?); not releasing anything",
                              lease_id));
    found = *record;
    uuids.push_back(device.uuid);
  }
  if (!found) throw Error(ErrorCode::kNotFound, "no active lease " + lease_id + " on this machine");

  const uid_t me = ::geteuid();
  if (me != 0 && me != found->uid) throw not_the_owner(lease_id, *found);
  const bool stoppable =
      found->kind == HolderKind::kDetached || (also_run && found->kind == HolderKind::kRun);
  if (!stoppable) throw held_by_a_running_process(lease_id, *found);

  // Signal only the process that really holds these lock files: same identity (pid + start
  // time), owned by the lease's user, with every one of the files open. A pidfd pins the
  // process between the checks and the signal. Where `gpulock run` was killed and its command
  // lives on, holding the files, the command is the one to stop.
  const ProcessId* living = living_holder(*found);
  const ProcessId target = living ? *living : found->holder;
  const pid_t pid = target.pid;
  UniqueFd pidfd(open_pidfd(pid));
  const auto owner = process_uid(pid);
  bool holds_files = is_alive(target) && owner && *owner == found->uid;
  for (const auto& uuid : uuids)
    holds_files = holds_files && process_has_file_open(pid, dir_.lock_file_path(uuid));
  if (!holds_files || !is_alive(target))
    throw Error(ErrorCode::kInternal,
                fmt::format("lease {} is held, but its recorded holder (pid {}) is not the process "
                            "holding it; the lease ends when the processes holding it exit",
                            lease_id, pid));

  // Watch before signalling, so that the release cannot come before the watch.
  WaitChannel releases;
  releases.watch_releases(dir_.fd(), true);
  if (!send_signal(pidfd.get(), pid, SIGTERM)) {
    throw Error(errno == EPERM ? ErrorCode::kPermissionDenied : ErrorCode::kInternal,
                fmt::format("cannot stop the holder of lease {} (pid {}): {}", lease_id, pid,
                            std::strerror(errno)));
  }
  const auto deadline = std::chrono::steady_clock::now() + kReleaseWait;
  while (std::chrono::steady_clock::now() < deadline) {
    bool still_held = false;
    for (const auto& uuid : uuids) {
      const LockState p = probe(uuid, true);
      if (record_of(p, lease_id)) still_held = true;
    }
    if (!still_held) return;
    releases.wait(/*wake_fd=*/-1, std::chrono::milliseconds(200));
  }
  throw Error(
      ErrorCode::kInternal,
      found->kind == HolderKind::kRun
          ? fmt::format("lease {}: its command was sent SIGTERM (through gpulock run, pid "
                        "{}) and has not exited within {} s; SIGKILL it to end it now",
                        lease_id, pid, kReleaseWait.count())
          : fmt::format("lease {}: its holder (pid {}) was asked to stop but still holds it",
                        lease_id, pid));
}

}  // namespace gpulock
