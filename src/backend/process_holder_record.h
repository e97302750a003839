// process_holder_record(): the holder record of a lease that this process holds in memory
// (HolderKind::kProcess), as an acquire fills it in before it takes the GPUs.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "backend/holder_record.h"
#include "gpulock/request.hpp"

namespace gpulock {

// The record for `request`, held by this process as `uid` (its effective uid, which the caller
// has asked for already) and `user` on `host`, started at `started_at`; the caller adds the
// GPUs (and a shared lease's memory).
HolderRecord process_holder_record(const std::string& lease_id, uid_t uid, const std::string& user,
                                   const std::string& host, const LeaseRequest& request,
                                   std::chrono::system_clock::time_point started_at);

}  // namespace gpulock
