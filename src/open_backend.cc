// open_backend(): lock files or Redis, from flags, environment and config.
#include "open_backend.h"

#include <cstdlib>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "local/local_backend.h"
#include "redis/redis_backend.h"
#include "redis/redis_settings.h"
#include "redis/redis_url.h"
#include "util/strings.h"

namespace gpulock {

std::unique_ptr<LeaseBackend> open_backend(std::unique_ptr<DeviceSource> devices,
                                           PoolOptions options) {
  Config config = options.config ? *options.config : load_config();
  std::string backend;
  const char* named_by = "--backend";  // for hints: where to change it
  if (options.backend) {
    backend = *options.backend;
  } else if (const char* named = std::getenv("GPULOCK_BACKEND"); named && *named) {
    backend = named;
    named_by = "GPULOCK_BACKEND";
  } else {
    backend = config.backend;
    named_by = "the config's `backend`";
  }
  if (backend.empty() || backend == "file") {
    options.config = std::move(config);
    return std::make_unique<LocalBackend>(std::move(devices), std::move(options));
  }
  if (starts_with_ignoring_case(backend, "rediss://"))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} names rediss://: Redis over TLS is not supported; reach the "
                            "server over a trusted network or a TLS tunnel (stunnel, spiped) as "
                            "redis://",
                            named_by));
  if (!is_redis_url(backend))
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("unknown backend '{}' ({}): use \"file\" or redis://host:port/db",
                            sanitize_for_display(backend, 64), named_by));
  RedisSettings settings = redis_settings(backend, options, config);
  settings.endpoint.named_by = named_by;
  return std::make_unique<RedisBackend>(std::move(devices), std::move(config), options,
                                        std::move(settings));
}

}  // namespace gpulock
