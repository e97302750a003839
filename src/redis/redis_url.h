// RedisEndpoint: where the Redis backend's server is and how to log in, parsed from a URL.
//
//   redis://[[user]:password@]host[:port][/db]     (port 6379, db 0 by default)
//
// The password can also come from GPULOCK_REDIS_PASSWORD or the config's redis_password_file, so
// that it stays out of `ps` and shell histories. Every message shows the URL with the password
// masked.
#pragma once

#include <string>
#include <string_view>

namespace gpulock {

struct RedisEndpoint {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string user;      // "" = the default user (AUTH password)
  std::string password;  // "" = no AUTH
  // Where the URL came from, for hints ("--backend", "GPULOCK_BACKEND", "the config's backend").
  std::string named_by = "GPULOCK_BACKEND";
  // The URL as people may see it: "redis://alice:***@gpu-hub:6379/0".
  std::string display() const;
};

// Throws Error(kInvalidArgument) naming what is wrong (without echoing a password).
RedisEndpoint parse_redis_url(std::string_view url);

// True if the text names the Redis backend ("redis://…") rather than the file backend.
bool is_redis_url(std::string_view text);

}  // namespace gpulock
