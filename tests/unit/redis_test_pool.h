// Helpers for tests that drive the Redis backend's scripts directly: a pool's key names, the
// registration of simulated GPUs of a host, and acquire calls with the script's ARGV layout
// (redis_scripts.h).
#pragma once

#include <string>
#include <vector>

#include "gpulock/device.hpp"
#include "redis/device_record.h"
#include "redis/redis_connection.h"
#include "redis/redis_scripts.h"

namespace gpulock::test_support {

struct RedisPoolKeys {
  std::string pool;
  std::string prefix() const { return "gpulock:{" + pool + "}:"; }
  std::string version() const { return prefix() + "version"; }
  std::string lock(const std::string& uuid) const { return prefix() + "lock:" + uuid; }
  std::string lease(const std::string& id) const { return prefix() + "lease:" + id; }
  std::string gpu(const std::string& uuid) const { return prefix() + "gpu:" + uuid; }
  std::string ticket(const std::string& id) const { return prefix() + "ticket:" + id; }
  std::string ended(const std::string& id) const { return prefix() + "ended:" + id; }
  std::string token() const { return prefix() + "token"; }
  std::string token_copy() const { return prefix() + "token_copy"; }
  std::string queue() const { return prefix() + "queue"; }
  std::string hosts() const { return prefix() + "hosts"; }
  std::string events() const { return prefix() + "events"; }
};

// UUID of simulated GPU `index` of `host` (distinct per host).
inline std::string TestUuid(const std::string& host, unsigned index) {
  std::string tag;
  for (const char c : host) tag += std::to_string(static_cast<unsigned char>(c) % 10);
  tag = (tag + "00000000").substr(0, 8);
  return "GPU-" + tag + "-0000-4000-8000-00000000000" + std::to_string(index);
}

inline Device TestDevice(const std::string& host, unsigned index) {
  Device d;
  d.index = index;
  d.uuid = TestUuid(host, index);
  d.name = "Simulated GPU";
  d.memory_total_bytes = 80ULL << 30;
  d.memory_used_bytes = 0;
  d.memory_free_bytes = 80ULL << 30;
  d.utilization_percent = 0;
  d.compute_mode = ComputeMode::kDefault;
  return d;
}

// Runs the register script for `count` GPUs of `host`; returns its reply (1 = changed).
inline RedisValue RegisterHost(RedisConnection& connection, const RedisPoolKeys& keys,
                               const std::string& host, unsigned count) {
  std::vector<std::string> args{host, "{\"test\":true}"};
  for (unsigned i = 0; i < count; ++i) {
    const Device d = TestDevice(host, i);
    args.push_back(d.uuid);
    args.push_back(device_static_json(d));
    args.push_back(device_readings_json(d));
  }
  return connection.run(redis_scripts::kRegister, {keys.version()}, args);
}

struct AcquireArgs {
  std::string lease_id;
  long long ttl_ms = 60000;
  std::string expected_version;  // "" = only if nobody waits
  unsigned needed = 1;
  std::string mode = "all";  // "all" | "any"
  std::string record = "{}";
  std::string user = "tester";
  std::string host = "h1";
  std::string ticket;
  bool limited = false;              // the plan counted the user's GPUs against a limit
  std::vector<std::string> to_wake;  // tickets it wakes last, whatever it replies
  std::vector<std::string> candidates;
};

inline RedisValue RunAcquire(RedisConnection& connection, const RedisPoolKeys& keys,
                             const AcquireArgs& a) {
  std::vector<std::string> args{a.lease_id,
                                std::to_string(a.ttl_ms),
                                a.expected_version,
                                std::to_string(a.needed),
                                a.mode,
                                a.record,
                                a.user,
                                a.host,
                                a.ticket,
                                a.limited ? "1" : "0",
                                ""};
  for (const auto& ticket : a.to_wake) args.back() += ticket + "\n";
  args.insert(args.end(), a.candidates.begin(), a.candidates.end());
  return connection.run(redis_scripts::kAcquire, {keys.version()}, args);
}

// The text elements of an array reply ({"ok", token, UUIDs...}).
inline std::vector<std::string> Texts(const RedisValue& reply) {
  std::vector<std::string> out;
  for (const auto& e : reply.elements)
    out.push_back(e.type == RedisValue::Type::kInteger ? std::to_string(e.integer) : e.text);
  return out;
}

}  // namespace gpulock::test_support
