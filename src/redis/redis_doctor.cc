// RedisBackend::doctor(): what an administrator checks first when the Redis backend misbehaves.
#include <algorithm>
#include <chrono>
#include <optional>

#include <fmt/format.h>

#include "gpulock/error.hpp"
#include "redis/fencing_token.h"
#include "redis/redis_backend.h"
#include "redis/redis_scripts.h"
#include "util/random_id.h"
#include "util/strings.h"

namespace gpulock {
namespace {

using Level = DoctorCheck::Level;
using Clock = std::chrono::steady_clock;

std::string info_field(const std::string& info, const std::string& name) {
  const auto at = info.find(name + ":");
  if (at == std::string::npos) return "";
  const auto begin = at + name.size() + 1;
  return info.substr(begin, info.find_first_of("\r\n", begin) - begin);
}

// Which kind of value each of the pool's keys must hold ("" = unknown key).
std::string expected_type(const std::string& key, const std::string& prefix) {
  const std::string rest = key.substr(prefix.size());
  const auto starts = [&](const char* p) { return rest.starts_with(p); };
  if (rest == "version" || rest == "token" || rest == "token_copy" || rest == "queue_seq" ||
      rest == "frees")
    return "string";
  if (rest == "hosts" || rest == "queue" || starts("held:") || starts("shares:")) return "zset";
  if (rest == "journal") return "stream";  // the usage journal (redis/redis_journal.h)
  if (starts("host:") || starts("gpu:") || starts("lease:") || starts("ticket:") ||
      starts("share_units:"))
    return "hash";
  if (starts("gpus:")) return "set";
  if (starts("wake:")) return "list";
  if (starts("lock:") || starts("served:") || starts("ended:") || starts("doctor:"))
    return "string";
  return "";
}

}  // namespace

std::vector<DoctorCheck> RedisBackend::doctor() {
  std::vector<DoctorCheck> checks;
  const auto add = [&](Level level, std::string name, std::string detail) {
    checks.push_back(DoctorCheck{level, std::move(name), std::move(detail)});
  };
  add(Level::kOk, "backend",
      fmt::format("redis at {}, pool '{}' (keys {}*), this host registers as '{}', lease TTL {} ms",
                  settings_.endpoint.display(), settings_.pool, settings_.prefix(), settings_.host,
                  settings_.lease_ttl.count()));
  std::unique_ptr<RedisConnection> connection;
  const auto connect_start = Clock::now();
  try {
    connection = RedisConnection::connect(settings_.endpoint, std::chrono::milliseconds(3000));
  } catch (const Error& error) {
    add(Level::kFailed, "connection", error.what());
    return checks;
  }
  add(Level::kOk, "connection",
      fmt::format("connected and logged in{} in {:.1f} ms",
                  settings_.endpoint.user.empty() ? "" : " as " + settings_.endpoint.user,
                  std::chrono::duration<double, std::milli>(Clock::now() - connect_start).count()));
  try {
    const RedisValue info = connection->command({"INFO", "server"});
    const std::string version = info_field(info.text, "redis_version");
    const int major = version.empty() ? 0 : std::atoi(version.c_str());
    if (info.is_error() || version.empty()) {
      add(Level::kWarning, "server version",
          "INFO is not allowed or not answered; gpulock needs Redis 6 or later");
    } else {
      add(major >= 6 ? Level::kOk : Level::kFailed, "server version",
          major >= 6 ? "Redis " + version : "Redis " + version + " is too old: gpulock needs 6+");
    }

    std::vector<double> round_trips;
    for (int i = 0; i < 20; ++i) {
      const auto sent = Clock::now();
      connection->command({"PING"});
      round_trips.push_back(std::chrono::duration<double, std::milli>(Clock::now() - sent).count());
    }
    std::sort(round_trips.begin(), round_trips.end());
    add(round_trips[10] < 50 ? Level::kOk : Level::kWarning, "round trip",
        fmt::format("median {:.3f} ms over 20 PINGs", round_trips[10]));

    // The scripts, and the permissions they need (EVALSHA, the pool's keys, PUBLISH).
    const std::vector<Device> local = register_devices(*connection, /*force=*/true);
    const Snapshot snap = snapshot(*connection, {}, "", local);
    add(Level::kOk, "scripts",
        fmt::format("registered {} GPU{} of this host; the pool has {} host{} and {} GPU{}",
                    local.size(), local.size() == 1 ? "" : "s", snap.hosts.size(),
                    snap.hosts.size() == 1 ? "" : "s", snap.gpus.size(),
                    snap.gpus.size() == 1 ? "" : "s"));
    // Waiters are woken by messages on the pool's channel: send one round, as they would.
    const std::string channel = settings_.prefix() + "events";
    try {
      auto subscriber =
          RedisConnection::connect(settings_.endpoint, std::chrono::milliseconds(3000));
      subscriber->subscribe(channel);
      const RedisValue published = connection->command({"PUBLISH", channel, "doctor"});
      if (published.is_error()) {
        add(Level::kFailed, "notifications",
            "PUBLISH refused: " + published.text +
                " (waiters would wake only on their 10 s re-check; allow the channel " + channel +
                ")");
      } else {
        const auto sent = Clock::now();
        std::optional<std::string> message;
        while (!message && Clock::now() - sent < std::chrono::seconds(3))
          message = subscriber->next_message(std::chrono::milliseconds(500));
        add(message ? Level::kOk : Level::kFailed, "notifications",
            message ? fmt::format(
                          "PUBLISH and SUBSCRIBE on {}: a message went round in {:.1f} ms", channel,
                          std::chrono::duration<double, std::milli>(Clock::now() - sent).count())
                    : "a message published on " + channel + " did not arrive within 3 s");
      }
    } catch (const Error& error) {
      add(Level::kFailed, "notifications",
          fmt::format("cannot subscribe to {}: {} (waiters would wake only on their 10 s "
                      "re-check; allow the channel)",
                      channel, error.what()));
    }

    // Persistence decides how fencing tokens survive a restart.
    const RedisValue save = connection->command({"CONFIG", "GET", "save"});
    const RedisValue aof = connection->command({"CONFIG", "GET", "appendonly"});
    if (save.is_error() || aof.is_error() || save.elements.size() < 2 || aof.elements.size() < 2) {
      add(Level::kOk, "persistence",
          "CONFIG GET not allowed; fencing tokens stay increasing across restarts either way "
          "(they are at least the server's time in microseconds)");
    } else {
      const bool persistent = !save.elements[1].text.empty() || aof.elements[1].text == "yes";
      add(Level::kOk, "persistence",
          persistent ? "snapshots or AOF on: leases and tokens survive a restart"
                     : "no persistence: after a restart holders re-create their leases at their "
                       "next renewal, and new fencing tokens continue from the server's time in "
                       "microseconds, above every earlier one (unless the server's clock was "
                       "set back)");
    }

    // The fencing-token counter and its copy: read back as untrusted input. The acquire script
    // ignores a copy that is garbage and counts on from the other one (or the server's time).
    std::vector<std::string> unusable;
    std::optional<std::uint64_t> last;
    for (const char* name : {"token", "token_copy"}) {
      const RedisValue value = connection->command({"GET", settings_.prefix() + name});
      if (value.is_nil()) continue;
      const auto count =
          value.type == RedisValue::Type::kString ? parse_fencing_token(value.text) : std::nullopt;
      if (!count) {
        unusable.push_back(fmt::format(
            "{}{} holds {}", settings_.prefix(), name,
            value.is_error()
                ? std::string("a value of the wrong type")
                : fmt::format("'{}', not a count", sanitize_for_display(value.text, 40))));
      } else if (!last || *count > *last) {
        last = count;
      }
    }
    if (!unusable.empty()) {
      add(Level::kFailed, "fencing tokens",
          fmt::format("{}: acquires ignore it and count on from {}. Set it (SET) to a number "
                      "above every token given out, e.g. the current time in microseconds",
                      fmt::join(unusable, "; "),
                      last ? fmt::format("the other copy, {}", *last)
                           : std::string("the server's time in microseconds, which gives a token "
                                         "again if an earlier one was larger")));
    } else if (last && *last == kLastFencingToken) {
      add(Level::kFailed, "fencing tokens",
          fmt::format("{}token is {}, the largest 64-bit token: every acquire fails until an "
                      "administrator starts the pool's tokens anew (and its jobs' storage accepts "
                      "smaller tokens)",
                      settings_.prefix(), *last));
    } else if (!last) {
      add(Level::kOk, "fencing tokens", "none given out yet in this pool");
    } else {
      add(Level::kOk, "fencing tokens", fmt::format("the last one given out is {}", *last));
    }

    // Keys under the prefix that hold the wrong kind of value.
    std::size_t keys = 0;
    std::vector<std::string> wrong;
    std::string cursor = "0";
    do {
      const RedisValue page =
          connection->command({"SCAN", cursor, "MATCH", settings_.prefix() + "*", "COUNT", "1000"});
      if (page.is_error() || page.elements.size() != 2) break;
      cursor = page.elements[0].text;
      for (const auto& key : page.elements[1].elements) {
        ++keys;
        const std::string expected = expected_type(key.text, settings_.prefix());
        const std::string actual = connection->command({"TYPE", key.text}).text;
        bool bad = expected != actual;
        if (!bad && key.text.starts_with(settings_.prefix() + "lock:")) {
          const std::string holder = connection->command({"GET", key.text}).text;
          bad = !is_lease_id(holder) && holder != redis_scripts::kSharedMark;
        }
        if (bad && wrong.size() < 10)
          wrong.push_back(fmt::format("{} ({})", sanitize_for_display(key.text, 120), actual));
      }
    } while (cursor != "0");
    add(wrong.empty() ? Level::kOk : Level::kWarning, "keys",
        wrong.empty() ? fmt::format("{} keys under {}, all well-formed", keys, settings_.prefix())
                      : fmt::format("unexpected content in: {}. GPUs whose lock key holds "
                                    "garbage are never given out; delete such keys by hand",
                                    fmt::join(wrong, ", ")));
    for (const auto& warning : snap.warnings) add(Level::kWarning, "pool", warning);
  } catch (const Error& error) {
    add(Level::kFailed, "server", error.what());
  }
  return checks;
}

}  // namespace gpulock
