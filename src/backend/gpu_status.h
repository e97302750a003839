// A GPU's state as `gpulock status` shows it, from its device readings and its LockState.
// Shared by both backends' status().
#pragma once

#include "backend/holder_record.h"
#include "backend/lock_state.h"
#include "gpulock/config.hpp"
#include "gpulock/device.hpp"
#include "gpulock/queue.hpp"
#include "gpulock/status.hpp"

namespace gpulock {

// Holders as `gpulock status` shows them. `on_this_host`: whether the holder process can be
// checked here (else holder_alive is false).
HolderInfo holder_info(const HolderRecord& record, bool on_this_host = true);
// Whether a process is covered by a lease (the holder, a member, or a descendant of either), for
// telling foreign processes apart.
bool covered_by(unsigned pid, const HolderRecord& record);

// `device_here`: the device is this machine's (its processes can be matched to users and
// leases); `holder_here`: the lease's holder runs here (it can be checked and its process tree
// followed).
GpuStatus gpu_status_of(Device device, const LockState& lock, const Config& config,
                        bool device_here, bool holder_here);
// Marks the free GPUs that the queue holds back for a waiting request.
void mark_reservations(PoolStatus& status, const QueueStatus& queue);

}  // namespace gpulock
