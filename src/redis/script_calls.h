// The acquire scripts' arguments and replies by name (lua/acquire.lua, lua/acquire_shared.lua,
// lua/enter.lua): the one place that knows their positions in ARGV and in the reply.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "redis/redis_connection.h"

namespace gpulock {

// lua/acquire.lua: whole GPUs, all of `gpus` or none.
struct AcquireArgs {
  std::string lease_id;
  std::chrono::milliseconds ttl{};
  // The snapshot's version the plan was made at: the script refuses a pool that has moved
  // ("stale"). Empty: refuse only where the queue has a live ticket ("queue").
  std::string expected_version;
  std::string record_json;
  std::string user;
  std::string gpu_host;
  std::string ticket_id;  // our ticket, removed from the queue if it is there
  bool limited = false;   // a max_gpus limit applies: the acquire makes others' plans stale
  std::vector<std::string> to_wake;  // tickets the plan also serves, woken however it ends
  std::vector<std::string> gpus;     // UUIDs

  // The same request sent again after an outage: it gets the first run's answer if that lease
  // is there, and is otherwise refused as stale (no pool has its version). It wakes no one: the
  // plan it came from is old news.
  AcquireArgs resent() const;
  std::vector<std::string> argv() const;
};

// One GPU a shared acquire offers the script, with what the plan found there.
struct SharedOffer {
  std::string uuid;
  std::string host;
  std::uint64_t capacity_units = 0;  // what the GPU may hold of shared leases, in units
  std::uint64_t wanted_units = 0;    // what this request takes of it
};

// lua/acquire_shared.lua: memory or slots on `needed` of the offered GPUs, the first host where
// enough fit, in the order offered.
struct AcquireSharedArgs {
  std::string lease_id;
  std::chrono::milliseconds ttl{};
  std::string record_json;
  std::string user;
  std::size_t needed = 0;
  std::optional<unsigned> cap;  // the most shared leases a GPU may hold
  bool spread = false;          // a host's GPUs with the fewest jobs first
  bool limited = false;         // a max_gpus limit applies
  std::vector<SharedOffer> offers;

  // Sent again after an outage: every GPU offered with no room, so that the script answers as
  // the first run did if that lease is there, and otherwise takes nothing.
  AcquireSharedArgs resent() const;
  std::vector<std::string> argv() const;
};

// What an acquire script answered: "ok" with the token and what it took, "exhausted" (the token
// counter is spent: see fencing_tokens_exhausted, which reads `raw`), or a refusal ("stale",
// "queue", "busy", ...), or "" for a reply of no known shape.
struct AcquireReply {
  std::string outcome;
  std::string token_text;  // "ok": the fencing token as the server wrote it
  // "ok": the GPUs taken, and for a shared acquire the units of each (as text).
  std::vector<std::string> uuids;
  std::vector<std::string> units;
};
AcquireReply parse_acquire_reply(const RedisValue& reply);
AcquireReply parse_acquire_shared_reply(const RedisValue& reply);

// lua/enter.lua: a ticket joins the queue (or keeps its place).
struct EnterArgs {
  std::string ticket_id;
  std::chrono::milliseconds ttl{};
  std::string body;  // the serialized ticket
  std::string user;
  std::string hosts;
  // The caller's snapshot: its version and count of releases, so that the reply can say
  // whether the pool is still as the caller planned it.
  std::string snapshot_version;
  std::string snapshot_frees;
  // The caller's plan put it last, served and reserving nothing: the entry changes no one's
  // plan, and leaves the version as it is.
  bool behind_everyone = false;

  std::vector<std::string> argv() const;
};

struct EnterReply {
  bool complete = false;   // the reply had every field below
  bool unchanged = false;  // the pool was at the snapshot's version until the entry
  std::string version;     // the pool's version after the entry
  std::string server_us;   // the server's clock then
  long long queued = 0;    // tickets in the queue, ours included
};
EnterReply parse_enter_reply(const RedisValue& reply);

// lua/snapshot.lua's reply, by name. Its lists are flat, one record every kWidth elements: at
// 300 hosts a flat list costs the server and the client less than nested tables, and the
// client reads each field in place (RedisBackend::snapshot).
namespace snapshot_reply {
enum Part : std::size_t {
  kVersion,
  kNowMs,
  kHosts,
  kGpus,
  kLeases,
  kTickets,
  kElsewhere,  // users' leases outside the scope
  kWholePool,  // 1 where a ticket may be served by any host
  kServerUs,
  kFrees,       // the count of releases
  kUserServed,  // when the caller's user was last served
};
namespace host {
enum : std::size_t { kName, kRegisteredAtMs, kInfo, kPacked, kWidth };
}
namespace gpu {
enum : std::size_t { kUuid, kHost, kInfo, kReadings, kReadAt, kLock, kLockTtlMs, kShares, kWidth };
}
namespace lease {
enum : std::size_t { kId, kRecord, kToken, kTtlMs, kUser, kWidth };
}
namespace ticket {
enum : std::size_t { kId, kSeq, kBody, kUser, kServed, kTtlMs, kWidth };
}
namespace elsewhere {
// kShared: one "UNITS MEMORY_TOTAL" line per shared reservation.
enum : std::size_t { kUser, kWholeGpus, kShared, kWidth };
}  // namespace elsewhere
}  // namespace snapshot_reply

}  // namespace gpulock
