// Checks and messages of release() by id, shared by both backends (backend/release_checks.h).
#include "backend/release_checks.h"

#include <fmt/format.h>

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
  return Error(
      ErrorCode::kPermissionDenied,
      fmt::format("lease {} belongs to {}; only {} or root can release it", lease_id, user, user));
}

Error held_by_a_running_process(const std::string& lease_id, const HolderRecord& record) {
  return Error(ErrorCode::kInvalidArgument,
               fmt::format("lease {} is held by a running {} (pid {}): it ends when that "
                           "process ends; stop it instead",
                           lease_id, record.kind == HolderKind::kRun ? "command" : "process",
                           record.holder.pid));
}

}  // namespace gpulock
