// Checks and messages of release() by id, shared by both backends (backend/release_checks.h).
#include "backend/release_checks.h"

#include <fmt/format.h>

#include "process/process_identity.h"
#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {

void check_lease_id(const std::string& lease_id) {
  if (!is_lease_id(lease_id))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("'{}' is not a lease id (16 hex digits, as `gpulock status` shows)",
                            sanitize_for_display(lease_id, 40)));
}

Error not_the_owner(const std::string& lease_id, const HolderRecord& record) {
  const std::string user = sanitize_for_display(record.user, 64);
  return Error(ErrorCode::kPermissionDenied,
               user == "root"
                   ? fmt::format("lease {} belongs to root; only root can release it", lease_id)
                   : fmt::format("lease {} belongs to {}; only {} or root can release it", lease_id,
                                 user, user));
}

const ProcessId* living_holder(const HolderRecord& record) {
  if (is_alive(record.holder)) return &record.holder;
  for (const ProcessId& member : record.members)
    if (is_alive(member)) return &member;
  return nullptr;
}

Error held_by_a_running_process(const std::string& lease_id, const HolderRecord& record) {
  const ProcessId* living = living_holder(record);
  const bool run = record.kind == HolderKind::kRun;
  std::string text;
  if (living && living != &record.holder)
    text = fmt::format(
        "lease {} is held by its command (pid {}), which outlived its `gpulock run` (pid {}): "
        "the lease ends when that process ends; stop it (kill {}) or `gpulock cancel {}`",
        lease_id, living->pid, record.holder.pid, living->pid, lease_id);
  else
    text = fmt::format(
        "lease {} is held by a running {} (pid {}): it ends when that process "
        "ends; stop it instead{}",
        lease_id, run ? "`gpulock run`" : "process", living ? living->pid : record.holder.pid,
        run ? fmt::format(", or `gpulock cancel {}`", lease_id) : "");
  // Well asked, but not something release does: not a usage error.
  return Error(ErrorCode::kUnsatisfiable, text);
}

}  // namespace gpulock
