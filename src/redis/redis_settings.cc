// A Redis pool's settings from flags, environment and config.
#include "redis/redis_settings.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "process/process_identity.h"
#include "util/strings.h"

namespace gpulock {
namespace {

std::optional<std::string> environment(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// Pool and host names become parts of keys and messages: printable, no braces (the hash tag),
// no spaces, no colons (the key separator).
std::string checked_name(const std::string& name, const char* what) {
  bool ok = !name.empty() && name.size() <= 128;
  for (const char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      ok = false;
  if (!ok)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("invalid {} '{}': use 1 to 128 letters, digits, '-', '_' or '.'", what,
                            sanitize_for_display(name, 64)));
  return name;
}

std::string read_password_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in)
    throw Error(ErrorCode::kConfig,
                fmt::format("cannot read the Redis password file {} (redis_password_file)",
                            sanitize_for_display(path)));
  std::string password(trim(text.str()));
  if (password.empty() || password.find('\n') != std::string::npos)
    throw Error(ErrorCode::kConfig, fmt::format("the Redis password file {} must hold one line",
                                                sanitize_for_display(path)));
  return password;
}

}  // namespace

std::string registered_host_name() {
  if (auto name = environment("GPULOCK_HOST")) return checked_name(*name, "GPULOCK_HOST");
  std::string name = host_name();
  // A host name is a valid name unless something odd is configured; keep what is usable.
  std::string cleaned;
  for (const char c : name)
    cleaned += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_';
  return cleaned.empty() ? "localhost" : cleaned.substr(0, 128);
}

RedisSettings redis_settings(const std::string& url, const PoolOptions& options,
                             const Config& config) {
  RedisSettings settings;
  settings.endpoint = parse_redis_url(url);
  if (settings.endpoint.password.empty()) {
    if (auto password = environment("GPULOCK_REDIS_PASSWORD")) {
      settings.endpoint.password = *password;
    } else if (!config.redis_password_file.empty()) {
      settings.endpoint.password = read_password_file(config.redis_password_file);
    }
  }
  if (options.pool_name) {
    settings.pool = checked_name(*options.pool_name, "pool name");
  } else if (auto pool = environment("GPULOCK_POOL")) {
    settings.pool = checked_name(*pool, "GPULOCK_POOL");
  } else if (!config.pool.empty()) {
    settings.pool = checked_name(config.pool, "pool name (config)");
  } else {
    settings.pool = checked_name(registered_host_name(), "pool name (the host name)");
  }
  settings.host =
      options.host_name ? checked_name(*options.host_name, "host name") : registered_host_name();
  if (options.lease_ttl) {
    settings.lease_ttl = *options.lease_ttl;
  } else if (auto ttl = environment("GPULOCK_LEASE_TTL")) {
    settings.lease_ttl = parse_lease_ttl(*ttl);
  } else if (config.lease_ttl) {
    settings.lease_ttl = *config.lease_ttl;
  }
  if (settings.lease_ttl < std::chrono::milliseconds(500))
    throw Error(ErrorCode::kInvalidArgument, "a lease TTL must be at least 500ms");
  return settings;
}

}  // namespace gpulock
