// The Redis backend's server-side Lua scripts: every change to a pool's keys is one of these,
// so that it is atomic (see docs/design-redis.md for the keys and what each script promises).
// Their sources are src/redis/lua/NAME.lua, embedded at build time by cmake/embed_lua.cmake
// with the parts each one names on its first line (prelude.lua always first).
//
// Every script takes KEYS[1] = the pool's version key ("gpulock:{POOL}:version") and derives
// the other keys from its prefix; with the {POOL} hash tag all of a pool's keys share one slot.
// Times come from the server's TIME, never from the client, so clocks of hosts do not matter.
// Keys holding something unexpected are read with redis.pcall and treated as unusable (a GPU
// whose lock key is garbage is never free), never trusted and never a script error.
#pragma once

#include "redis/redis_connection.h"

namespace gpulock::redis_scripts {

// ARGV: host, host info (JSON), then per GPU: UUID, static info (JSON), readings (JSON).
// Replaces the host's GPU list, and writes the same registrations packed in `host:<H>`'s `gpus`
// field (see kSnapshot); bumps the version and publishes "register" when the static
// information changed. Returns 1 if it changed, else 0; or, when the pool's `hosts` key held
// another type (it is rebuilt from the `host:<H>` keys), {0 or 1, that type}.
extern const RedisScript kRegister;

// ARGV: scope (host names, each followed by a newline; "" = every host), user (or ""), and
// optionally the caller's lease TTL in ms: a listed GPU's lock key without an expiry (which no
// script writes) then gets the expiry of what holds it, or that TTL when nothing does. The
// scope widens to the hosts every queued ticket may use, and to every host when a ticket may use
// any. Returns {version, server time ms, hosts, gpus, leases, tickets, elsewhere, whole,
// now_us, frees, served}:
//   hosts:     flat {name, registered_at ms, info, packed}... of the scope's registered hosts,
//              where packed is the host's registrations in one string ("" when it has none):
//              "<length>:<bytes>" fields, the read time ms, then {uuid, info, readings} per GPU
//   gpus:      flat {uuid, host, info, readings, readings_at ms, lock value, lock pttl,
//              shares}... where info, readings and readings_at are "" for a host with packed
//              registrations (they are there), and shares, for a GPU held by shared leases
//              (lock value kSharedMark), has one line "LEASE_ID UNITS PTTL" per live reservation;
//              the lock value is kGarbageLock or kDamagedShares for a GPU no lease may have
//   leases:    flat {id, record, token, pttl, user}... for every lease holding a listed GPU
//              (shared ones included); user is the lease's, as written (the record's is for
//              display)
//   tickets:   flat {id, seq, body, user, user last served ms, ticket pttl}... in arrival order
//   elsewhere: flat {user, GPUs, shared}... held outside the scope by `user` and each queued
//              user, from their `held:USER` sets (lease ids scored by expiry): the GPUs held
//              whole, and a line "UNITS MEMORY_TOTAL" per GPU reserved by a shared lease (so
//              that it weighs its part of the GPU, as inside the scope), each only if its
//              host lists it and it is held by the lease; empty when whole
//   whole:     1 when the scope was every host
//   now_us:    the server's clock in microseconds (decimal text), to order wakes after it
//   frees:     the count of releases (`frees`, "" before the first), which a release moves even
//              when nobody waits and the version stays (see kEnter)
//   served:    when `user` was last served (ms; "" when never or no user), as tickets carry it
// Drops queue entries whose ticket expired (dead waiters), and those not renewed since the
// server started once it has been up 2 s (restored by an RDB or AOF), bumping the version and
// waking the first live waiter. Its cost follows
// the scope and the queue, not the pool.
extern const RedisScript kSnapshot;

// ARGV: lease id, ttl ms, expected version ("" = only if nobody waits), needed, "all"|"any",
// record (JSON), user, host, ticket id (""), limited ("1": the plan counted the user's GPUs
// against a limit), tickets to wake (each followed by a newline; see kWake: woken last, whatever
// the reply, so after this lease's own bump when it succeeds), candidate UUIDs in preference
// order...
// Takes `needed` free candidates (all of them with "all"), or none. Returns
// {"ok", token, UUIDs...}, {"busy"}, {"queue"} (someone waits: plan first), {"stale"}
// (the version moved since the caller's snapshot: plan again) or {"exhausted", last token,
// key} (the last token issued is 2^64 - 1: no next one; nothing was written). The token is decimal
// text, one above the larger valid one of `token` and `token_copy` (garbage in either is
// ignored) and at least the server's time in microseconds; both keys get it. The lease joins
// `held:USER`. The version moves only when a plan could depend on it: a ticket was served,
// someone waits, or `limited`.
extern const RedisScript kAcquire;

// ARGV: lease id, then its UUIDs (none: those the lease's record lists). Deletes each lock that
// names this lease (compare-and-delete), or, on a GPU held by shared leases, this lease's
// reservation only (the GPU's mark then lasts as long as the last reservation left), and the
// lease, and leaves an "ended" mark for two of the
// lease's TTLs so that the holder's next renewal reports the lease lost instead of re-creating
// it. Returns how
// many locks it deleted. The version moves only when someone waits; then the first live ticket
// that may use the lease's host is woken (see kWake), to plan and wake whom the plan serves.
extern const RedisScript kRelease;

// ARGV: lease id, ttl ms, token, record, user, host, UUIDs... Extends every lock that names this
// lease; re-creates missing ones (the server restarted empty) when no other lease holds them.
// Returns {"ok"}, {"restored"} or {"lost", UUID, holder} ({"lost", "", "released"} after a
// release by someone else). Raises `token` and `token_copy` (any that is garbage, too) to at
// least this lease's token.
extern const RedisScript kRenew;

// The lock value of a GPU held by shared leases (never a lease id).
inline constexpr const char* kSharedMark = "=shared";
// The lock values a snapshot reports for a GPU no lease may be given: its lock key holds
// something that is neither a lease id nor kSharedMark (a key of another type included), or it
// is kSharedMark but its reservations' keys are damaged (then nobody can tell what they hold).
inline constexpr const char* kGarbageLock = "!garbage";
inline constexpr const char* kDamagedShares = "!shares";

// ARGV: lease id, ttl ms, record (JSON), user, needed, jobs cap per GPU ("" = none), spread
// ("1") or pack, limited ("1"), then per candidate: UUID, host, capacity (memory
// units shared leases may hold there: its units less the reserve and memory used outside
// gpulock), units wanted there. Only while no live ticket waits in the queue (else {"queue"}):
// reserves on `needed` candidates of one host (the first host, in the order given, with enough)
// each not held exclusively, whose live reservations leave room for its units and, with a cap,
// number fewer than the cap, packing (least room first) or spreading; or on none ({"busy"}).
// Returns {"ok", token, UUID, units, UUID, units...} or {"exhausted", last token, key}, tokens as
// kAcquire's. A reservation expires with the lease's TTL unless renewed (kRenewShared).
extern const RedisScript kAcquireShared;

// ARGV: lease id, ttl ms, token, record, user, host, then per GPU: UUID, units. Extends the
// lease's reservations (and each GPU's mark to at least the TTL); re-creates them where nobody
// holds the GPU (the server restarted empty). Returns {"ok"}, {"restored"}, or {"lost", UUID,
// holder}: a lease id (held exclusively), "expired" (the reservation's TTL passed) or, with
// UUID "", "released"; or {"damaged", UUID}: renewed, but that GPU's reservation keys are
// damaged (the lease keeps the GPU's mark, and no other lease is given the GPU meanwhile).
extern const RedisScript kRenewShared;

// ARGV: ticket id, ttl ms, body (JSON), user, hosts it may be served from (each followed by a
// newline; "" = any), and optionally the version of the caller's snapshot, "1" when the
// caller's plan at that version put it last, served and reserving nothing, and the snapshot's
// frees (the snapshot counts as unchanged only if no release happened since). Joins the queue at
// the back, and bumps the version unless it was still the snapshot's and the caller is last
// (its entry then changes no one's plan); returns {seq, 1 if the version was still the
// snapshot's before this entry, else 0, the version after it, the server's clock in
// microseconds, the queue's length after it}.
extern const RedisScript kEnter;

// ARGV: ticket id. Leaves the queue, and wakes the first live waiter (its wake:ID list).
extern const RedisScript kLeave;

// ARGV: ticket id, ttl ms. A waiter's heartbeat: extends its ticket and notes the server's run
// id in it (`run`), as enter does, so that a snapshot can tell a ticket restored from an RDB or
// AOF whose waiter never came back (it drops those once the server has been up 2 s). Returns 1,
// or 0 when the ticket is gone.
extern const RedisScript kHeartbeat;

// ARGV: ticket ids. Wakes each waiter whose ticket exists: pushes to its `wake:ID` list (kept at
// one element, the newest), on which the waiter blocks (BLPOP), "VERSION NOW_US": the pool's
// version and the server's clock when it was pushed. Every script that wakes bumps the version
// first, so a waiter whose last snapshot had the same version and a later clock had seen all
// the wake tells of, and may ignore it. Returns how many were woken.
extern const RedisScript kWake;

}  // namespace gpulock::redis_scripts
