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

// What a scan of the pool's keys found: how many there are, and each one that is damaged, with
// what it does to the pool and what to do about it.
struct KeyScan {
  std::size_t keys = 0;
  std::vector<std::string> findings;
};

// Keys that gpulock always writes with an expiry: one without blocks something forever.
bool expires(const std::string& rest) {
  return rest.starts_with("lock:") || rest.starts_with("lease:") || rest.starts_with("ended:") ||
         rest.starts_with("ticket:") || rest.starts_with("wake:") || rest.starts_with("served:");
}

KeyScan scan_keys(RedisConnection& connection, const std::string& prefix) {
  KeyScan scan;
  const auto shown = [&](const std::string& key) { return sanitize_for_display(key, 120); };
  std::string cursor = "0";
  do {
    const RedisValue page =
        connection.command({"SCAN", cursor, "MATCH", prefix + "*", "COUNT", "1000"});
    if (page.is_error() || page.elements.size() != 2) break;
    cursor = page.elements[0].text;
    for (const auto& entry : page.elements[1].elements) {
      ++scan.keys;
      const std::string& key = entry.text;
      const std::string rest = key.substr(prefix.size());
      const std::string expected = expected_type(key, prefix);
      const std::string actual = connection.command({"TYPE", key}).text;
      if (actual == "none") continue;  // gone since the scan listed it
      if (expected != actual) {
        scan.findings.push_back(
            rest == "hosts"
                ? fmt::format("{} holds a {}, not the pool's list of hosts (a sorted set): the "
                              "next registration rebuilds it from the hosts' own keys",
                              shown(key), actual)
            : rest.starts_with("lock:")
                ? fmt::format("{} holds a {}: its GPU is never given out; delete the key once "
                              "nobody uses the GPU",
                              shown(key), actual)
            : rest.starts_with("shares:") || rest.starts_with("share_units:")
                ? fmt::format("{} holds a {}: while the GPU is held by shared leases, no lease "
                              "is given it; the key is replaced once they have ended",
                              shown(key), actual)
                : fmt::format("{} holds a {}, not a {}: the scripts replace or ignore it",
                              shown(key), actual,
                              expected.empty() ? "key gpulock uses" : expected));
        continue;
      }
      if (rest.starts_with("shares:")) {
        // Every script adds and removes a reservation in both keys: their sizes agree.
        const std::string units = prefix + "share_units:" + rest.substr(7);
        const long long members = connection.command({"ZCARD", key}).integer;
        const RedisValue counted = connection.command({"HLEN", units});
        if (!counted.is_error() && counted.integer != members)
          scan.findings.push_back(fmt::format(
              "{} lists {} reservations and {} {}: they disagree, so while the GPU is held by "
              "shared leases no lease is given it; the keys are replaced once they have ended",
              shown(key), members, shown(units), counted.integer));
        continue;
      }
      if (rest.starts_with("share_units:")) {
        // Units that are not a count, on a reservation live or expired.
        const RedisValue units = connection.command({"HVALS", key});
        for (const RedisValue& value : units.elements) {
          if (!value.text.empty() &&
              value.text.find_first_not_of("0123456789") == std::string::npos)
            continue;
          scan.findings.push_back(fmt::format(
              "{} holds units that are not a count ('{}'): while the GPU is held by shared "
              "leases, no lease is given it; the key is replaced once they have ended",
              shown(key), sanitize_for_display(value.text, 40)));
          break;
        }
        continue;
      }
      const bool no_expiry = expires(rest) && connection.command({"PTTL", key}).integer == -1;
      if (rest.starts_with("lock:")) {
        const std::string holder = connection.command({"GET", key}).text;
        const std::string gpu = sanitize_for_display(rest.substr(5), 80);
        if (!is_lease_id(holder) && holder != redis_scripts::kSharedMark) {
          scan.findings.push_back(fmt::format(
              "{} holds '{}', not a lease: GPU {} is never given out; delete the key once nobody "
              "uses the GPU",
              shown(key), sanitize_for_display(holder, 40), gpu));
        } else if (is_lease_id(holder) &&
                   connection.command({"EXISTS", prefix + "lease:" + holder}).integer == 0) {
          scan.findings.push_back(fmt::format(
              "{} names lease {}, which has no record: GPU {} is blocked until the key expires{}",
              shown(key), holder, gpu,
              no_expiry ? " (it had no expiry: it was given one lease TTL now)" : ""));
        } else if (no_expiry) {
          scan.findings.push_back(fmt::format(
              "{} had no expiry, which gpulock never writes: it was given its holder's now",
              shown(key)));
        }
      } else if (no_expiry) {
        scan.findings.push_back(fmt::format(
            "{} has no expiry, which gpulock never writes: {}", shown(key),
            rest.starts_with("ticket:")
                ? "it was given a ticket's now (its waiter, if alive, keeps renewing it)"
                : "delete it if it stays"));
      }
    }
  } while (cursor != "0");
  return scan;
}

DoctorCheck server_version_check(RedisConnection& connection) {
  const RedisValue info = connection.command({"INFO", "server"});
  const std::string version = info_field(info.text, "redis_version");
  const int major = version.empty() ? 0 : std::atoi(version.c_str());
  if (info.is_error() || version.empty())
    return {Level::kWarning, "server version",
            "INFO is not allowed or not answered; gpulock needs Redis 6 or later"};
  return {major >= 6 ? Level::kOk : Level::kFailed, "server version",
          major >= 6 ? "Redis " + version : "Redis " + version + " is too old: gpulock needs 6+"};
}

DoctorCheck round_trip_check(RedisConnection& connection) {
  std::vector<double> round_trips;
  for (int i = 0; i < 20; ++i) {
    const auto sent = Clock::now();
    connection.command({"PING"});
    round_trips.push_back(std::chrono::duration<double, std::milli>(Clock::now() - sent).count());
  }
  std::sort(round_trips.begin(), round_trips.end());
  return {round_trips[10] < 50 ? Level::kOk : Level::kWarning, "round trip",
          fmt::format("median {:.3f} ms over 20 PINGs", round_trips[10])};
}

// Waiters are woken by messages on the pool's channel: send one round, as they would.
DoctorCheck notifications_check(const RedisSettings& settings, RedisConnection& connection) {
  const std::string channel = settings.prefix() + "events";
  try {
    auto subscriber = RedisConnection::connect(settings.endpoint, std::chrono::milliseconds(3000));
    subscriber->subscribe(channel);
    const RedisValue published = connection.command({"PUBLISH", channel, "doctor"});
    if (published.is_error())
      return {Level::kFailed, "notifications",
              "PUBLISH refused: " + published.text +
                  " (waiters would wake only on their 10 s re-check; allow the channel " + channel +
                  ")"};
    const auto sent = Clock::now();
    std::optional<std::string> message;
    while (!message && Clock::now() - sent < std::chrono::seconds(3))
      message = subscriber->next_message(std::chrono::milliseconds(500));
    if (!message)
      return {Level::kFailed, "notifications",
              "a message published on " + channel + " did not arrive within 3 s"};
    return {Level::kOk, "notifications",
            fmt::format("PUBLISH and SUBSCRIBE on {}: a message went round in {:.1f} ms", channel,
                        std::chrono::duration<double, std::milli>(Clock::now() - sent).count())};
  } catch (const Error& error) {
    return {Level::kFailed, "notifications",
            fmt::format("cannot subscribe to {}: {} (waiters would wake only on their 10 s "
                        "re-check; allow the channel)",
                        channel, error.what())};
  }
}

// Persistence decides how fencing tokens survive a restart.
DoctorCheck persistence_check(RedisConnection& connection) {
  const RedisValue save = connection.command({"CONFIG", "GET", "save"});
  const RedisValue aof = connection.command({"CONFIG", "GET", "appendonly"});
  if (save.is_error() || aof.is_error() || save.elements.size() < 2 || aof.elements.size() < 2)
    return {Level::kOk, "persistence",
            "CONFIG GET not allowed; fencing tokens stay increasing across restarts either way "
            "(they are at least the server's time in microseconds)"};
  const bool persistent = !save.elements[1].text.empty() || aof.elements[1].text == "yes";
  return {Level::kOk, "persistence",
          persistent ? "snapshots or AOF on: leases and tokens survive a restart"
                     : "no persistence: after a restart holders re-create their leases at their "
                       "next renewal, and new fencing tokens continue from the server's time in "
                       "microseconds, above every earlier one (unless the server's clock was "
                       "set back)"};
}

// The fencing-token counter and its copy, read back as untrusted input. The acquire script
// ignores a copy that is garbage and counts on from the other one (or the server's time).
DoctorCheck fencing_tokens_check(const RedisSettings& settings, RedisConnection& connection) {
  std::vector<std::string> unusable;
  std::optional<std::uint64_t> last;
  const char* last_name = "token";  // the key that holds `last`
  for (const char* name : {"token", "token_copy"}) {
    const RedisValue value = connection.command({"GET", settings.prefix() + name});
    if (value.is_nil()) continue;
    const auto count =
        value.type == RedisValue::Type::kString ? parse_fencing_token(value.text) : std::nullopt;
    if (!count) {
      unusable.push_back(fmt::format(
          "{}{} holds {}", settings.prefix(), name,
          value.is_error()
              ? std::string("a value of the wrong type")
              : fmt::format("'{}', not a count", sanitize_for_display(value.text, 40))));
    } else if (!last || *count > *last) {
      last = count;
      last_name = name;
    }
  }
  if (!unusable.empty())
    return {Level::kFailed, "fencing tokens",
            fmt::format("{}: acquires ignore it and count on from {}. Set it (SET) to a number "
                        "above every token given out, e.g. the current time in microseconds",
                        fmt::join(unusable, "; "),
                        last ? fmt::format("the other copy, {}", *last)
                             : std::string("the server's time in microseconds, which gives a "
                                           "token again if an earlier one was larger"))};
  if (last && *last == kLastFencingToken)
    return {Level::kFailed, "fencing tokens",
            fmt::format("{}{} is {}, the largest 64-bit token: every acquire fails until an "
                        "administrator starts the pool's tokens anew (and its jobs' storage "
                        "accepts smaller tokens)",
                        settings.prefix(), last_name, *last)};
  if (!last) return {Level::kOk, "fencing tokens", "none given out yet in this pool"};
  return {Level::kOk, "fencing tokens", fmt::format("the last one given out is {}", *last)};
}

// What the key scan found, and what the snapshot says about shared GPUs: one warning per key,
// at most 20, or one line saying that all is well.
std::vector<DoctorCheck> key_checks(const RedisSettings& settings, const KeyScan& scan,
                                    const RedisBackend::Snapshot& snap) {
  std::vector<std::string> findings = scan.findings;
  for (const RedisBackend::Gpu& gpu : snap.gpus) {
    if (gpu.lock == redis_scripts::kDamagedShares)
      findings.push_back(fmt::format(
          "{}shares:{} and {}share_units:{} are damaged (a wrong type, members that disagree, "
          "or units that are no count): no lease is given GPU {} of host {} until its shared "
          "leases end, and they keep it; it recovers by itself then",
          settings.prefix(), gpu.device.uuid, settings.prefix(), gpu.device.uuid, gpu.device.index,
          gpu.host));
    else if (gpu.shared() && gpu.shares.empty())
      findings.push_back(fmt::format(
          "{}lock:{} marks GPU {} of host {} shared, but no reservation lives: it is blocked "
          "until the key expires, in {} ms",
          settings.prefix(), gpu.device.uuid, gpu.device.index, gpu.host, gpu.lock_ttl_ms));
  }
  if (findings.empty())
    return {{Level::kOk, "keys",
             fmt::format("{} keys under {}, all well-formed", scan.keys, settings.prefix())}};
  constexpr std::size_t kShown = 20;
  std::vector<DoctorCheck> checks;
  for (std::size_t i = 0; i < findings.size() && i < kShown; ++i)
    checks.push_back({Level::kWarning, "keys", findings[i]});
  if (findings.size() > kShown)
    checks.push_back({Level::kWarning, "keys",
                      fmt::format("and {} more damaged keys", findings.size() - kShown)});
  return checks;
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
    checks.push_back(server_version_check(*connection));
    checks.push_back(round_trip_check(*connection));
    // Damaged keys, looked at before this doctor's own registration and snapshot repair what
    // they can (a `hosts` key rebuilt, a lock key without an expiry given one).
    const KeyScan scan = scan_keys(*connection, settings_.prefix());

    // The scripts, and the permissions they need (EVALSHA, the pool's keys, PUBLISH).
    // A refusal is reported, and the checks below still run: they say what is missing.
    Snapshot snap;
    try {
      const std::vector<Device> local = register_devices(*connection, /*force=*/true);
      snap = snapshot(*connection, {}, "", local);
      add(Level::kOk, "scripts",
          fmt::format("registered {} GPU{} of this host; the pool has {} host{} and {} GPU{}",
                      local.size(), local.size() == 1 ? "" : "s", snap.hosts.size(),
                      snap.hosts.size() == 1 ? "" : "s", snap.gpus.size(),
                      snap.gpus.size() == 1 ? "" : "s"));
    } catch (const Error& error) {
      if (error.code() != ErrorCode::kEnvironment || connection->broken()) throw;
      add(Level::kFailed, "scripts", error.what());
    }
    checks.push_back(notifications_check(settings_, *connection));
    checks.push_back(persistence_check(*connection));
    checks.push_back(fencing_tokens_check(settings_, *connection));
    for (DoctorCheck& check : key_checks(settings_, scan, snap)) checks.push_back(std::move(check));
    for (const auto& warning : snap.warnings) add(Level::kWarning, "pool", warning);
  } catch (const Error& error) {
    add(Level::kFailed, "server", error.what());
  }
  return checks;
}

}  // namespace gpulock
