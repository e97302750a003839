// GpuPool::release(): ending a detached lease by stopping its holder, owner or root only.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "gpu_pool_impl.h"
#include "gpulock/error.hpp"
#include "local/release_watcher.h"
#include "process/process_identity.h"
#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

constexpr auto kReleaseWait = std::chrono::seconds(10);

}  // namespace

void GpuPool::Impl::release(const std::string& lease_id) {
  if (!is_lease_id(lease_id))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("'{}' is not a lease id (16 hex digits, as `gpulock status` shows)",
                            sanitize_for_display(lease_id, 40)));
  std::optional<HolderRecord> found;
  std::vector<std::string> uuids;
  for (const Device& device : source->devices()) {
    const LockProbe p = probe(device.uuid, true);
    if (p.locked && p.record && p.record->lease_id == lease_id) {
      found = p.record;
      uuids.push_back(device.uuid);
    }
  }
  if (!found) throw Error(ErrorCode::kNotFound, "no active lease " + lease_id + " on this machine");

  const uid_t me = ::geteuid();
  if (me != 0 && me != found->uid)
    throw Error(ErrorCode::kPermissionDenied,
                fmt::format("lease {} belongs to {}; only {} or root can release it", lease_id,
                            found->user, found->user));
  if (found->kind != HolderKind::kDetached)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("lease {} is held by a running {} (pid {}): it ends when that "
                            "process ends; stop it instead",
                            lease_id, found->kind == HolderKind::kRun ? "command" : "process",
                            found->holder.pid));

  // The record is untrusted: signal only a live gpulock holder owned by the lease's user.
  const auto stat = read_process_stat(found->holder.pid);
  const auto owner = process_uid(found->holder.pid);
  if (!stat || stat->start_ticks != found->holder.start_ticks || !owner || *owner != found->uid ||
      stat->comm != "gpulock")
    throw Error(ErrorCode::kInternal,
                fmt::format("lease {} is held, but its holder process {} cannot be identified; "
                            "the lease ends when the processes holding it exit",
                            lease_id, found->holder.pid));

  ReleaseWatcher watcher(dir.fd());
  if (::kill(found->holder.pid, SIGTERM) != 0) {
    throw Error(errno == EPERM ? ErrorCode::kPermissionDenied : ErrorCode::kInternal,
                fmt::format("cannot stop the holder of lease {} (pid {}): {}", lease_id,
                            found->holder.pid, std::strerror(errno)));
  }
  const auto deadline = std::chrono::steady_clock::now() + kReleaseWait;
  while (std::chrono::steady_clock::now() < deadline) {
    bool still_held = false;
    for (const auto& uuid : uuids) {
      const LockProbe p = probe(uuid, true);
      if (p.locked && p.record && p.record->lease_id == lease_id) still_held = true;
    }
    if (!still_held) return;
    watcher.wait(std::chrono::milliseconds(200));
  }
  throw Error(ErrorCode::kInternal,
              fmt::format("lease {}: its holder (pid {}) was asked to stop but still holds it",
                          lease_id, found->holder.pid));
}

}  // namespace gpulock
