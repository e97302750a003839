// open_backend(): the one place that chooses a pool's backend from its settings.
#pragma once

#include <memory>

#include "backend/lease_backend.h"
#include "gpulock/device_source.hpp"
#include "gpulock/gpu_pool.hpp"

namespace gpulock {

// The backend named by options.backend, else GPULOCK_BACKEND, else the config's `backend`:
// "file" (or nothing) for lock files on this machine, redis://… for a Redis server. The config
// is options.config, else load_config(). Throws Error(kInvalidArgument) for an unknown backend
// or a malformed Redis setting, kConfig for a bad config file.
std::unique_ptr<LeaseBackend> open_backend(std::unique_ptr<DeviceSource> devices,
                                           PoolOptions options);

}  // namespace gpulock
