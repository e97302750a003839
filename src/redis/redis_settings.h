// RedisSettings: for a pool on the Redis backend, where the server is and under which names.
//
// Each setting comes from the first of: the PoolOptions (the CLI's flags), the environment
// (GPULOCK_POOL, GPULOCK_HOST, GPULOCK_LEASE_TTL, GPULOCK_REDIS_PASSWORD), the config file
// (pool, lease_ttl, redis_password_file), the default. Which backend a pool uses is
// open_backend()'s choice (open_backend.h).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "gpulock/config.hpp"
#include "gpulock/gpu_pool.hpp"
#include "redis/redis_url.h"

namespace gpulock {

struct RedisSettings {
  RedisEndpoint endpoint;
  std::string pool;  // the key prefix's name
  std::string host;  // the name this machine's GPUs are registered under
  std::chrono::milliseconds lease_ttl{30000};

  // "gpulock:{POOL}:": the braces are a hash tag, so all of a pool's keys share a cluster slot.
  std::string prefix() const { return "gpulock:{" + pool + "}:"; }
  std::string version_key() const { return prefix() + "version"; }
};

// The settings for the server at `url` (redis://…). Throws Error(kInvalidArgument) for a
// malformed URL, name or TTL given by a flag or the environment, kConfig for an unreadable
// password file.
RedisSettings redis_settings(const std::string& url, const PoolOptions& options,
                             const Config& config);

// The host name GPUs are registered under: GPULOCK_HOST, else the machine's host name.
std::string registered_host_name();

}  // namespace gpulock
