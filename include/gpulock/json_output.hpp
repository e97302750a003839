// The JSON documents of `gpulock status --json`, `gpulock queue --json` and `gpulock gpus --json`.
//
// Their shape is a stable, documented contract (docs/json.md); each carries "schema_version".
// Fields are only ever added within a schema version, never renamed or removed.
#pragma once

#include <string>
#include <vector>

#include "gpulock/device.hpp"
#include "gpulock/queue.hpp"
#include "gpulock/status.hpp"

namespace gpulock {

inline constexpr int kJsonSchemaVersion = 1;

std::string status_to_json(const PoolStatus& status);

// `gpulock queue --json`.
std::string queue_to_json(const QueueStatus& queue);

// `gpulock gpus --json`. With `leases` (the pool's status of these GPUs), each GPU also says
// its lease state and what shared leases hold of its memory.
std::string devices_to_json(const std::vector<Device>& devices, const std::string& device_source,
                            bool simulated, const PoolStatus* leases = nullptr);

}  // namespace gpulock
