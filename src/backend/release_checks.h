// The checks both backends' release() make before ending a lease by id (`gpulock release`), and
// their messages: a well-formed id, the lease's owner (or root), and a lease that is not held by
// a running process or command (those end when the process ends).
#pragma once

#include <string>

#include "backend/holder_record.h"
#include "gpulock/error.hpp"

namespace gpulock {

// Throws kInvalidArgument unless `lease_id` is a lease id (16 hex digits).
void check_lease_id(const std::string& lease_id);
// kPermissionDenied: `lease_id` is `record`'s owner's, not the caller's.
Error not_the_owner(const std::string& lease_id, const HolderRecord& record);
// The process of the lease that lives: its recorded holder, else the first living member (the
// command of a `gpulock run` that was killed); nullptr if none lives.
const ProcessId* living_holder(const HolderRecord& record);
// kUnsatisfiable: `lease_id` is held by a running process or command, not a detached holder;
// the message names the process that lives.
Error held_by_a_running_process(const std::string& lease_id, const HolderRecord& record);

}  // namespace gpulock
