// The Lua sources of the Redis backend's scripts (redis_scripts.h says what each does).
#include "redis/redis_scripts.h"

namespace gpulock::redis_scripts {
namespace {

// Shared by every script: the key prefix, the server's time, safe reads, and the version bump.
#define GPULOCK_LUA_PRELUDE                                                                       \
  "local P = string.sub(KEYS[1], 1, -8)\n"                                                        \
  "local T = redis.call('TIME')\n"                                                                \
  "local now_ms = tonumber(T[1]) * 1000 + math.floor(tonumber(T[2]) / 1000)\n"                    \
  "-- The server's clock in microseconds, as text: a wake and a snapshot are ordered by it.\n"    \
  "local now_us = T[1] .. string.format('%06d', tonumber(T[2]))\n"                                \
  "local function get(k)\n"                                                                       \
  "  local v = redis.pcall('GET', k)\n"                                                           \
  "  if type(v) == 'table' then return '!garbage' end\n"                                          \
  "  return v or ''\n"                                                                            \
  "end\n"                                                                                         \
  "local function hmget(k, ...)\n"                                                                \
  "  local v = redis.pcall('HMGET', k, ...)\n"                                                    \
  "  if v.err then return {} end\n"                                                               \
  "  return v\n"                                                                                  \
  "end\n"                                                                                         \
  "-- The pool's version as text; '0' before the first bump.\n"                                   \
  "local function current_version()\n"                                                            \
  "  local v = get(P .. 'version')\n"                                                             \
  "  if v == '' then return '0' end\n"                                                            \
  "  return v\n"                                                                                  \
  "end\n"                                                                                         \
  "local function bump(event)\n"                                                                  \
  "  if type(redis.pcall('INCR', P .. 'version')) == 'table' then\n"                              \
  "    redis.call('SET', P .. 'version', '1')\n"                                                  \
  "  end\n"                                                                                       \
  "  redis.call('PUBLISH', P .. 'events', event)\n"                                               \
  "end\n"                                                                                         \
  "local function someone_waits()\n"                                                              \
  "  local n = redis.pcall('ZCARD', P .. 'queue')\n"                                              \
  "  return type(n) ~= 'number' or n > 0\n"                                                       \
  "end\n"                                                                                         \
  "local function wake(id)\n"                                                                     \
  "  if redis.call('EXISTS', P .. 'ticket:' .. id) == 0 then return false end\n"                  \
  "  local k = P .. 'wake:' .. id\n"                                                              \
  "  if redis.call('TYPE', k).ok ~= 'list' then redis.call('DEL', k) end\n"                       \
  "  -- What the waker knew: the pool's version and the server's time when it pushed the wake.\n" \
  "  redis.call('LPUSH', k, current_version() .. ' ' .. now_us)\n"                                \
  "  redis.call('LTRIM', k, 0, 0)\n"                                                              \
  "  redis.call('PEXPIRE', k, 60000)\n"                                                           \
  "  return true\n"                                                                               \
  "end\n"                                                                                         \
  "local function wake_queue_head(host, count)\n"                                                 \
  "  local members = redis.pcall('ZRANGE', P .. 'queue', 0, -1)\n"                                \
  "  if members.err then return end\n"                                                            \
  "  for _, id in ipairs(members) do\n"                                                           \
  "    if count <= 0 then return end\n"                                                           \
  "    local h = hmget(P .. 'ticket:' .. id, 'hosts')[1] or ''\n"                                 \
  "    if host == '' or h == '' or string.find('\\n' .. h, '\\n' .. host .. '\\n', 1, true) "     \
  "then\n"                                                                                        \
  "      -- A ticket renewed within the last 3 s (half its TTL) has a live waiter: it counts.\n"  \
  "      if wake(id) and redis.call('PTTL', P .. 'ticket:' .. id) > 3000 then\n"                  \
  "        count = count - 1\n"                                                                   \
  "      end\n"                                                                                   \
  "    end\n"                                                                                     \
  "  end\n"                                                                                       \
  "end\n"                                                                                         \
  "local function server_run()\n"                                                                 \
  "  local info = redis.call('INFO', 'server')\n"                                                 \
  "  return string.match(info, 'run_id:(%x+)') or '',\n"                                          \
  "         tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) or 0\n"                       \
  "end\n"                                                                                         \
  "-- Whether v is a lease id as gpulock makes them (16 lowercase hex digits).\n"                 \
  "local function is_lease_id(v)\n"                                                               \
  "  return type(v) == 'string' and #v == 16 and string.find(v, '^[0-9a-f]+$') ~= nil\n"          \
  "end\n"                                                                                         \
  "local function own_key(k, kind)\n"                                                             \
  "  local t = redis.call('TYPE', k).ok\n"                                                        \
  "  if t ~= kind and t ~= 'none' then redis.call('DEL', k) end\n"                                \
  "end\n"

// Fencing tokens in exact decimal text, never Lua numbers (doubles, exact only below 2^53). The
// `token` key and its copy `token_copy` are read as untrusted input: a value that is not 1 to 20
// digits without a leading zero, at most 2^64 - 1, or a key of the wrong type, counts as absent.
#define GPULOCK_LUA_TOKENS                                                          \
  "local TOKEN_MAX = '18446744073709551615'\n"                                      \
  "local TOKEN_KEYS = {P .. 'token', P .. 'token_copy'}\n"                          \
  "local function token_less(a, b)\n"                                               \
  "  if #a ~= #b then return #a < #b end\n"                                         \
  "  for i = 1, #a do\n"                                                            \
  "    local x, y = string.byte(a, i), string.byte(b, i)\n"                         \
  "    if x ~= y then return x < y end\n"                                           \
  "  end\n"                                                                         \
  "  return false\n"                                                                \
  "end\n"                                                                           \
  "local function token_of(v)\n"                                                    \
  "  if type(v) ~= 'string' or #v == 0 or #v > 20 then return nil end\n"            \
  "  if not string.find(v, '^%d+$') then return nil end\n"                          \
  "  if #v > 1 and string.byte(v, 1) == 48 then return nil end\n"                   \
  "  if token_less(TOKEN_MAX, v) then return nil end\n"                             \
  "  return v\n"                                                                    \
  "end\n"                                                                           \
  "local function token_next(v)\n"                                                  \
  "  if v == TOKEN_MAX then return nil end\n"                                       \
  "  local i = #v\n"                                                                \
  "  while i > 0 and string.byte(v, i) == 57 do i = i - 1 end\n"                    \
  "  if i == 0 then return '1' .. string.rep('0', #v) end\n"                        \
  "  return string.sub(v, 1, i - 1) .. string.char(string.byte(v, i) + 1) ..\n"     \
  "         string.rep('0', #v - i)\n"                                              \
  "end\n"                                                                           \
  "local function read_token(k)\n"                                                  \
  "  return token_of(redis.pcall('GET', k))\n"                                      \
  "end\n"                                                                           \
  "-- The next token: above the last one issued (either copy that is valid) and\n"  \
  "-- at least the server's time in microseconds; nil and the last one past\n"      \
  "-- 2^64 - 1, with the name of the key that holds it. Writes nothing.\n"          \
  "local function next_token()\n"                                                   \
  "  local text = token_of(T[1] .. string.format('%06d', tonumber(T[2]))) or '1'\n" \
  "  for _, k in ipairs(TOKEN_KEYS) do\n"                                           \
  "    local last = read_token(k)\n"                                                \
  "    if last then\n"                                                              \
  "      local after = token_next(last)\n"                                          \
  "      if not after then return nil, last, string.sub(k, #P + 1) end\n"           \
  "      if token_less(text, after) then text = after end\n"                        \
  "    end\n"                                                                       \
  "  end\n"                                                                         \
  "  return text\n"                                                                 \
  "end\n"

// What an acquire of lease `id` answered, if it ran before: {'ok', token, uuid[, units]...}, else
// nil. A lease id is random, one per attempt, so only that very request can have made the lease
// (its answer was lost and the connection sent it again); a lease whose GPUs are not among the
// request's candidates (ARGV[first], ARGV[first + step], ... up to ARGV[last]) is another
// request's. Reads one key when there is no such lease. Needs GPULOCK_LUA_PRELUDE.
#define GPULOCK_LUA_EARLIER_ACQUIRE                                              \
  "local function earlier_acquire(id, with_units, first, last, step)\n"          \
  "  local f = hmget(P .. 'lease:' .. id, 'token', 'gpus', 'units')\n"           \
  "  if not f[1] or not f[2] or (with_units and not f[3]) then return nil end\n" \
  "  local asked = {}\n"                                                         \
  "  for a = first, last, step do asked[ARGV[a]] = true end\n"                   \
  "  local out, units, i = {'ok', f[1]}, {}, 0\n"                                \
  "  if with_units then\n"                                                       \
  "    for u in string.gmatch(f[3], '[^,]+') do table.insert(units, u) end\n"    \
  "  end\n"                                                                      \
  "  for uuid in string.gmatch(f[2], '[^,]+') do\n"                              \
  "    if not asked[uuid] then return nil end\n"                                 \
  "    i = i + 1\n"                                                              \
  "    table.insert(out, uuid)\n"                                                \
  "    if with_units then table.insert(out, units[i] or '0') end\n"              \
  "  end\n"                                                                      \
  "  return out\n"                                                               \
  "end\n"

// Whether a live ticket waits in the pool's queue: queue_has_live_ticket() removes, on the way,
// the tickets whose key has expired (dead waiters'). Needs GPULOCK_LUA_PRELUDE.
#define GPULOCK_LUA_QUEUE                                                        \
  "local function queue_has_live_ticket()\n"                                     \
  "  local members = redis.pcall('ZRANGE', P .. 'queue', 0, -1)\n"               \
  "  if members.err then members = {} end\n"                                     \
  "  for _, m in ipairs(members) do\n"                                           \
  "    if redis.call('EXISTS', P .. 'ticket:' .. m) == 1 then return true end\n" \
  "    redis.call('ZREM', P .. 'queue', m)\n"                                    \
  "  end\n"                                                                      \
  "  return false\n"                                                             \
  "end\n"

// What a renew script (exclusive or shared) does once the lease's GPUs are kept: renew_lease()
// sets the lease hash to `fields` (name, value pairs), renews the user's `held` set, and raises
// the token keys to the lease's token. It replies 'restored' (bumping the version) when anything
// had to be written back, else 'ok'. Needs GPULOCK_LUA_PRELUDE and GPULOCK_LUA_TOKENS.
#define GPULOCK_LUA_RENEWAL                                                           \
  "local function renew_lease(id, ttl, user, token, fields, restored)\n"              \
  "  local lease = P .. 'lease:' .. id\n"                                             \
  "  if redis.call('TYPE', lease).ok ~= 'hash' then\n"                                \
  "    redis.call('DEL', lease)\n"                                                    \
  "    restored = true\n"                                                             \
  "  end\n"                                                                           \
  "  redis.call('HSET', lease, unpack(fields))\n"                                     \
  "  redis.call('PEXPIRE', lease, ttl)\n"                                             \
  "  own_key(P .. 'held:' .. user, 'zset')\n"                                         \
  "  redis.call('ZADD', P .. 'held:' .. user, now_ms + ttl, id)\n"                    \
  "  local held = token_of(token)\n"                                                  \
  "  if held then\n"                                                                  \
  "    for _, k in ipairs(TOKEN_KEYS) do\n"                                           \
  "      local last = read_token(k)\n"                                                \
  "      if not last or token_less(last, held) then redis.call('SET', k, held) end\n" \
  "    end\n"                                                                         \
  "  end\n"                                                                           \
  "  if restored then\n"                                                              \
  "    bump('renew')\n"                                                               \
  "    return {'restored'}\n"                                                         \
  "  end\n"                                                                           \
  "  return {'ok'}\n"                                                                 \
  "end\n"

// Shared leases' reservations on a GPU (docs/design-redis.md, "Shared leases"): `lock:UUID` holds
// SHARED_MARK instead of a lease id, with the TTL of the reservation that ends last;
// `shares:UUID` scores each shared lease's id by when its reservation expires, and
// `share_units:UUID` gives its memory units. A reservation whose expiry passed counts for
// nothing (as an expired lock), and goes at the next write that looks at the GPU. While no key
// marks the GPU shared, whatever the two keys hold has expired.
#define GPULOCK_LUA_SHARES                                                                       \
  "local SHARED_MARK = '=shared'\n"                                                              \
  "local function share_keys(uuid)\n"                                                            \
  "  return P .. 'shares:' .. uuid, P .. 'share_units:' .. uuid\n"                               \
  "end\n"                                                                                        \
  "-- The live reservations {id, units, expiry ms}, and whether the two keys are damaged:\n"     \
  "-- of the wrong type, disagreeing (a member of one missing from the other), or with units\n"  \
  "-- that are no count. Then nobody can tell what the GPU's shared leases hold: callers give\n" \
  "-- the GPU to nobody and remove nothing. With `purge`, expired reservations are removed.\n"   \
  "local function live_shares(uuid, purge)\n"                                                    \
  "  local S, U = share_keys(uuid)\n"                                                            \
  "  local ts, tu = redis.call('TYPE', S).ok, redis.call('TYPE', U).ok\n"                        \
  "  if (ts ~= 'zset' and ts ~= 'none') or (tu ~= 'hash' and tu ~= 'none') or\n"                 \
  "     redis.call('ZCARD', S) ~= redis.call('HLEN', U) then\n"                                  \
  "    return {}, true\n"                                                                        \
  "  end\n"                                                                                      \
  "  if purge then\n"                                                                            \
  "    for _, id in ipairs(redis.call('ZRANGEBYSCORE', S, '-inf', now_ms)) do\n"                 \
  "      redis.call('ZREM', S, id)\n"                                                            \
  "      redis.call('HDEL', U, id)\n"                                                            \
  "    end\n"                                                                                    \
  "  end\n"                                                                                      \
  "  local out = {}\n"                                                                           \
  "  local m = redis.call('ZRANGEBYSCORE', S, '(' .. now_ms, '+inf', 'WITHSCORES')\n"            \
  "  for i = 1, #m, 2 do\n"                                                                      \
  "    local units = redis.call('HGET', U, m[i])\n"                                              \
  "    if not units or not string.find(units, '^%d+$') then return {}, true end\n"               \
  "    table.insert(out, {m[i], tonumber(units), tonumber(m[i + 1])})\n"                         \
  "  end\n"                                                                                      \
  "  return out, false\n"                                                                        \
  "end\n"                                                                                        \
  "-- After a reservation ended: the mark lasts as long as the last one left, or goes.\n"        \
  "local function settle_mark(uuid)\n"                                                           \
  "  local S, U = share_keys(uuid)\n"                                                            \
  "  local live, damaged = live_shares(uuid, true)\n"                                            \
  "  -- Damaged: the mark lasts its TTL (the end of the last reservation renewed).\n"            \
  "  if damaged then return end\n"                                                               \
  "  local M = P .. 'lock:' .. uuid\n"                                                           \
  "  if #live == 0 then\n"                                                                       \
  "    redis.call('DEL', S, U)\n"                                                                \
  "    if get(M) == SHARED_MARK then redis.call('DEL', M) end\n"                                 \
  "    return\n"                                                                                 \
  "  end\n"                                                                                      \
  "  local last = 0\n"                                                                           \
  "  for _, r in ipairs(live) do last = math.max(last, r[3]) end\n"                              \
  "  if get(M) == SHARED_MARK then redis.call('PEXPIREAT', M, last) end\n"                       \
  "  redis.call('PEXPIREAT', S, last)\n"                                                         \
  "  redis.call('PEXPIREAT', U, last)\n"                                                         \
  "end\n"                                                                                        \
  "-- The reservations' keys go with the mark (no GPU keeps them once nobody writes to it).\n"   \
  "local function expire_with_mark(uuid)\n"                                                      \
  "  local S, U = share_keys(uuid)\n"                                                            \
  "  local left = redis.call('PTTL', P .. 'lock:' .. uuid)\n"                                    \
  "  if left > 0 then\n"                                                                         \
  "    redis.call('PEXPIRE', S, left)\n"                                                         \
  "    redis.call('PEXPIRE', U, left)\n"                                                         \
  "  end\n"                                                                                      \
  "end\n"

}  // namespace

const RedisScript kRegister{"register", GPULOCK_LUA_PRELUDE R"lua(
-- First, before any write (a script error undoes nothing): a user whom the server refuses the
-- pool's channel fails here, not after writing its registration.
redis.call('PUBLISH', P .. 'events', 'registering')
local host = ARGV[1]
-- The pool's list of hosts holding something else (damaged by hand): rebuilt from the hosts'
-- own keys, so that the other hosts stay in the pool. The reply says so.
local rebuilt = false
local type_of_hosts = redis.call('TYPE', P .. 'hosts').ok
if type_of_hosts ~= 'zset' and type_of_hosts ~= 'none' then
  redis.call('DEL', P .. 'hosts')
  local cursor = '0'
  repeat
    local page = redis.call('SCAN', cursor, 'MATCH', P .. 'host:*', 'COUNT', 1000)
    cursor = page[1]
    for _, k in ipairs(page[2]) do
      local at = tonumber(hmget(k, 'registered_at')[1] or '')
      if at then redis.call('ZADD', P .. 'hosts', at, string.sub(k, #P + 6)) end
    end
  until cursor == '0'
  rebuilt = type_of_hosts
end
redis.call('ZADD', P .. 'hosts', now_ms, host)
own_key(P .. 'host:' .. host, 'hash')
redis.call('HSET', P .. 'host:' .. host, 'info', ARGV[2], 'registered_at', now_ms)
local set = P .. 'gpus:' .. host
own_key(set, 'set')
local changed = false
local listed = {}
for i = 3, #ARGV, 3 do
  local uuid = ARGV[i]
  listed[uuid] = true
  local key = P .. 'gpu:' .. uuid
  own_key(key, 'hash')
  local old = hmget(key, 'host', 'info')
  if old[1] ~= host or old[2] ~= ARGV[i + 1] then changed = true end
  -- A GPU that another host listed last: that host's packed registrations no longer hold.
  if old[1] and old[1] ~= host then redis.pcall('HDEL', P .. 'host:' .. old[1], 'gpus') end
  redis.call('HSET', key, 'host', host, 'info', ARGV[i + 1], 'readings', ARGV[i + 2],
             'read_at', now_ms)
  if redis.call('SADD', set, uuid) == 1 then changed = true end
end
for _, uuid in ipairs(redis.call('SMEMBERS', set)) do
  if not listed[uuid] then
    redis.call('SREM', set, uuid)
    if hmget(P .. 'gpu:' .. uuid, 'host')[1] == host then redis.call('DEL', P .. 'gpu:' .. uuid) end
    changed = true
  end
end
-- The same registrations packed in one field of host:<H>, read by a snapshot in one HMGET for
-- the host instead of one per GPU: the read time, then per GPU (by UUID, the last listing of a
-- UUID listed twice) its UUID, info and readings, each as "<length>:<bytes>".
local packed, order = {}, {}
for i = 3, #ARGV, 3 do
  if not packed[ARGV[i]] then table.insert(order, ARGV[i]) end
  packed[ARGV[i]] = i
end
table.sort(order)
local parts = {#tostring(now_ms) .. ':' .. now_ms}
for _, uuid in ipairs(order) do
  local i = packed[uuid]
  for k = i, i + 2 do parts[#parts + 1] = #ARGV[k] .. ':' .. ARGV[k] end
end
-- gpus_at is registered_at's value: a registration by an older gpulock (no package) since
-- changes registered_at only, and the snapshot then knows this package is stale.
redis.call('HSET', P .. 'host:' .. host, 'gpus', table.concat(parts), 'gpus_at', now_ms)
if changed or rebuilt then
  bump('register')
  wake_queue_head('', 1)
end
if rebuilt then return {changed and 1 or 0, rebuilt} end
return changed and 1 or 0
)lua"};

const RedisScript kSnapshot{"snapshot", GPULOCK_LUA_PRELUDE GPULOCK_LUA_SHARES R"lua(
-- The scope: the hosts named (one per line), widened to the hosts every queued ticket may use;
-- the whole pool when ARGV[1] is empty or a ticket may use any host.
local whole = ARGV[1] == ''
local scope = {}
if not whole then
  for h in string.gmatch(ARGV[1], '[^\n]+') do scope[h] = true end
end
local users = {}
if ARGV[2] and ARGV[2] ~= '' then users[ARGV[2]] = true end
-- ARGV[3], if given: the caller's lease TTL (ms), the grace a lock key without an expiry gets.
local grace = tonumber(ARGV[3] or '')
if grace and (grace < 500 or grace > 86400000) then grace = nil end
local tickets_out = {}
local members = redis.pcall('ZRANGE', P .. 'queue', 0, -1, 'WITHSCORES')
if members.err then members = {} end
local removed = false
local run, uptime = nil, 0
local served_of = {}
for i = 1, #members, 2 do
  local id = members[i]
  local t, stale, restored =
    hmget(P .. 'ticket:' .. id, 'body', 'user', 'hosts', 'run', 'expires_at'), false, false
  if #t > 0 and not t[1] and not t[2] and not t[3] and not t[4] and not t[5] then
    -- No ticket: it expired (a dead waiter). One of another type is kept, and read as garbage.
    redis.call('ZREM', P .. 'queue', id)
    t = nil
    removed = true
  else
    if t[4] and t[4] ~= '' then
      if not run then run, uptime = server_run() end
      -- Not renewed since the server started (restored from an RDB or AOF): once live waiters
      -- have had 2 s to come back and renew theirs, its waiter is gone.
      if t[4] ~= run then
        if uptime >= 2 then stale = true else restored = true end
      end
    end
  end
  if stale then
    redis.call('ZREM', P .. 'queue', id)
    redis.call('DEL', P .. 'ticket:' .. id, P .. 'wake:' .. id)
    removed = true
  elseif t then
    local served = ''
    if t[2] then
      if not served_of[t[2]] then served_of[t[2]] = get(P .. 'served:' .. t[2]) end
      served = served_of[t[2]]
      users[t[2]] = true
    end
    if not t[3] or t[3] == '' then
      whole = true
    else
      for h in string.gmatch(t[3], '[^\n]+') do scope[h] = true end
    end
    -- The TTL by expires_at, as enter and heartbeat set it with the key's expiry; a ticket
    -- without one still ahead (written or renewed by an older gpulock) is asked.
    local ttl = tonumber(t[5] or '')
    if ttl and ttl > now_ms and ttl < now_ms + 86400000 then
      ttl = ttl - now_ms
    else
      ttl = redis.call('PTTL', P .. 'ticket:' .. id)
      -- A ticket without an expiry (no script writes one) would wait ahead of everyone, and
      -- stop every shared acquire, forever: it gets a ticket's TTL, which a living waiter's
      -- heartbeat keeps renewing.
      if ttl == -1 then
        redis.call('PEXPIRE', P .. 'ticket:' .. id, 6000)
        ttl = 6000
      end
    end
    -- A restored ticket not renewed yet ends, for waiters timing their wake, when it can be
    -- dropped (it is, then, unless its waiter renews it meanwhile).
    if restored and ttl >= 0 then ttl = math.min(ttl, (2 - uptime) * 1000) end
    for _, v in ipairs({id, members[i + 1], t[1] or '', t[2] or '', served, ttl}) do
      table.insert(tickets_out, v)
    end
  end
end
if removed then
  bump('leave')
  wake_queue_head('', 1)
end

local hosts_out, gpus_out, leases_out, elsewhere_out = {}, {}, {}, {}
-- The lock values of a host's GPUs, as get() reads each: one MGET per 256 GPUs, not a GET
-- each. MGET reads a key of another type as missing; EXISTS, which counts keys of every type,
-- tells when one is there, and get() then reads the missing ones one by one.
local function lock_values(uuids)
  local out = {}
  for first = 1, #uuids, 256 do
    local keys = {}
    for i = first, math.min(#uuids, first + 255) do keys[#keys + 1] = P .. 'lock:' .. uuids[i] end
    local values = redis.call('MGET', unpack(keys))
    local found = 0
    for i = 1, #keys do
      if values[i] then found = found + 1 end
    end
    local other_types = found < #keys and redis.call('EXISTS', unpack(keys)) > found
    for i = 1, #keys do
      local v = values[i]
      if not v then v = other_types and get(keys[i]) or '' end
      out[first + i - 1] = v
    end
  end
  return out
end
local listed = {}
if whole then
  local hosts = redis.pcall('ZRANGE', P .. 'hosts', 0, -1, 'WITHSCORES')
  if hosts.err then hosts = {} end
  for i = 1, #hosts, 2 do
    table.insert(listed, {hosts[i], hosts[i + 1]})
  end
else
  local names = {}
  for h in pairs(scope) do table.insert(names, h) end
  table.sort(names)
  for _, h in ipairs(names) do
    local score = redis.pcall('ZSCORE', P .. 'hosts', h)
    if type(score) == 'string' then table.insert(listed, {h, score}) end
  end
end
local in_scope = {}
local seen = {}
for _, entry in ipairs(listed) do
  local host = entry[1]
  in_scope[host] = true
  table.insert(hosts_out, host)
  table.insert(hosts_out, entry[2])
  local h = hmget(P .. 'host:' .. host, 'info', 'gpus', 'registered_at', 'gpus_at')
  table.insert(hosts_out, h[1] or '')
  -- With the host's packed registrations, its GPUs' own hashes are not read: the client takes
  -- their info from the package (a host whose GPU another host took has none, and one that an
  -- older gpulock registered since has a stale one: see register).
  local packed = h[2]
  if packed and h[3] ~= h[4] then packed = nil end
  table.insert(hosts_out, packed or '')
  local uuids = redis.pcall('SMEMBERS', P .. 'gpus:' .. host)
  if uuids.err then uuids = {} end
  table.sort(uuids)
  local locks = lock_values(uuids)
  for i, uuid in ipairs(uuids) do
    local g
    if packed then
      g = {host}
    else
      g = hmget(P .. 'gpu:' .. uuid, 'host', 'info', 'readings', 'read_at')
    end
    if g[1] == host then
      local lock = locks[i]
      local ttl = -2  -- no key: only a held GPU's lock has a TTL worth asking for
      if lock ~= '' then ttl = redis.call('PTTL', P .. 'lock:' .. uuid) end
      local holders, shares = nil, ''
      local live, damaged = {}, false
      if lock == SHARED_MARK then live, damaged = live_shares(uuid, false) end
      -- A lock key without an expiry, which no script writes (PERSIST, or planted by hand),
      -- would block its GPU forever: it gets the expiry its holder's renewals keep (the lease's,
      -- or its last reservation's), or, when nothing holds it, `grace` (the caller's lease TTL,
      -- time enough for a holder to renew). A damaged one stays as it is (see doctor).
      if ttl == -1 and grace then
        local M = P .. 'lock:' .. uuid
        if lock == SHARED_MARK and not damaged then
          local last = 0
          for _, r in ipairs(live) do last = math.max(last, r[3]) end
          if last > 0 then
            redis.call('PEXPIREAT', M, last)
          else
            redis.call('PEXPIRE', M, grace)
          end
        elseif is_lease_id(lock) then
          local left = redis.call('PTTL', P .. 'lease:' .. lock)
          if left > 0 then
            redis.call('PEXPIRE', M, left)
          elseif left == -2 then
            redis.call('PEXPIRE', M, grace)
          end
        end
        ttl = redis.call('PTTL', M)
      end
      if damaged then
        -- Nobody can tell what its shared leases hold: given to nobody until the mark ends.
        lock = '!shares'
      elseif lock == SHARED_MARK then
        local lines = {}
        holders = {}
        for _, r in ipairs(live) do
          holders[#holders + 1] = r[1]
          lines[#lines + 1] = r[1] .. ' ' .. string.format('%d %d', r[2], r[3] - now_ms)
        end
        shares = table.concat(lines, '\n')
      elseif lock ~= '' and lock ~= '!garbage' then
        holders = {lock}
      end
      local n = #gpus_out
      gpus_out[n + 1], gpus_out[n + 2], gpus_out[n + 3], gpus_out[n + 4] =
        uuid, host, g[2] or '', g[3] or ''
      gpus_out[n + 5], gpus_out[n + 6], gpus_out[n + 7], gpus_out[n + 8] =
        g[4] or '', lock, ttl, shares
      for _, holder in ipairs(holders or {}) do
        if not seen[holder] then
          seen[holder] = true
          local lease = hmget(P .. 'lease:' .. holder, 'record', 'token', 'user')
          local m = #leases_out
          leases_out[m + 1], leases_out[m + 2], leases_out[m + 3], leases_out[m + 4] =
            holder, lease[1] or '', lease[2] or '', redis.call('PTTL', P .. 'lease:' .. holder)
          leases_out[m + 5] = lease[3] or ''
        end
      end
    end
  end
end
-- Fair share and limits count a user's GPUs on every host: those outside the scope come from
-- the user's `held:` set (lease ids by expiry), not from reading every host.
local memory_totals = {}
-- A GPU's memory as its registration gives it (false when unknown), read once per GPU.
local function memory_total_of(uuid)
  if memory_totals[uuid] == nil then
    local info = hmget(P .. 'gpu:' .. uuid, 'info')[1] or ''
    memory_totals[uuid] = string.match(info, '"memory_total":(%d+)') or false
  end
  return memory_totals[uuid]
end
if not whole then
  local names = {}
  for u in pairs(users) do table.insert(names, u) end
  table.sort(names)
  for _, user in ipairs(names) do
    local key = P .. 'held:' .. user
    if redis.call('TYPE', key).ok == 'zset' then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
      local count, parts = 0, {}
      for _, id in ipairs(redis.call('ZRANGE', key, 0, -1)) do
        local l = hmget(P .. 'lease:' .. id, 'host', 'gpus')
        local host = l[1]
        if host and not in_scope[host] and l[2] then
          -- Each GPU counts as a snapshot whose scope holds the host would count it: listed
          -- there, and held by this lease (a whole GPU) or carrying its live reservation (its
          -- units, with the GPU's memory, so that it weighs its part of the GPU).
          local listed_once = {}
          for uuid in string.gmatch(l[2], '[^,]+') do
            local first = not listed_once[uuid]
            listed_once[uuid] = true
            if first and redis.pcall('SISMEMBER', P .. 'gpus:' .. host, uuid) == 1 then
              local lock = get(P .. 'lock:' .. uuid)
              if lock == id then
                count = count + 1
              elseif lock == SHARED_MARK then
                local S, U = share_keys(uuid)
                local expiry = tonumber(redis.pcall('ZSCORE', S, id))
                local units = tonumber(redis.pcall('HGET', U, id))
                local total = memory_total_of(uuid)
                if expiry and expiry > now_ms and total then
                  parts[#parts + 1] = string.format('%d', units or 0) .. ' ' .. total
                end
              end
            end
          end
        end
      end
      if count > 0 or #parts > 0 then
        table.insert(elsewhere_out, user)
        table.insert(elsewhere_out, count)
        table.insert(elsewhere_out, table.concat(parts, '\n'))
      end
    end
  end
end
-- The requesting user's last service, which its tickets carry for users already queued.
local served = ''
if ARGV[2] and ARGV[2] ~= '' then
  served = served_of[ARGV[2]] or get(P .. 'served:' .. ARGV[2])
end
return {current_version(), now_ms, hosts_out, gpus_out, leases_out, tickets_out, elsewhere_out,
        whole and 1 or 0, now_us, get(P .. 'frees'), served}
)lua"};

const RedisScript kAcquire{
    "acquire",
    GPULOCK_LUA_PRELUDE GPULOCK_LUA_TOKENS GPULOCK_LUA_EARLIER_ACQUIRE GPULOCK_LUA_QUEUE R"lua(
-- First, before any write (a script error undoes nothing): a user whom the server refuses the
-- pool's channel fails here, at once, not only once someone waits.
redis.call('PUBLISH', P .. 'events', 'acquiring')
local id, ttl, expected = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local needed, mode = tonumber(ARGV[4]), ARGV[5]
-- The waiters the caller's plan also serves, woken however this ends: after this script's own
-- change (then they plan from a pool with this lease in it, rather than one it makes stale at
-- once), and also when it is refused (the caller plans again, but they need not wait for it).
local function finish(reply)
  for ticket in string.gmatch(ARGV[11], '[^\n]+') do wake(ticket) end
  return reply
end
-- This very request again: answer as its first run did, rather than refuse it and leave that
-- run's lease to lock the GPUs until its TTL ends.
local earlier = earlier_acquire(id, false, 12, #ARGV, 1)
if earlier then return finish(earlier) end
if expected ~= '' then
  if current_version() ~= expected then return finish({'stale'}) end
elseif queue_has_live_ticket() then
  return finish({'queue'})
end
local chosen = {}
for i = 12, #ARGV do
  local uuid = ARGV[i]
  if redis.call('EXISTS', P .. 'lock:' .. uuid) == 0 and
     redis.call('EXISTS', P .. 'gpu:' .. uuid) == 1 then
    table.insert(chosen, uuid)
    if #chosen == needed then break end
  elseif mode == 'all' then
    return finish({'busy'})
  end
end
if #chosen < needed then return finish({'busy'}) end
if redis.call('EXISTS', P .. 'lease:' .. id) == 1 then return finish({'busy'}) end
-- Past 2^64 - 1 there is no next token: fail before writing anything.
local token_text, last_token, last_key = next_token()
if not token_text then return finish({'exhausted', last_token, last_key}) end
for _, k in ipairs(TOKEN_KEYS) do redis.call('SET', k, token_text) end
for _, uuid in ipairs(chosen) do redis.call('SET', P .. 'lock:' .. uuid, id, 'PX', ttl) end
own_key(P .. 'lease:' .. id, 'hash')
redis.call('HSET', P .. 'lease:' .. id, 'record', ARGV[6], 'token', token_text,
           'gpus', table.concat(chosen, ','), 'user', ARGV[7], 'host', ARGV[8], 'ttl', ARGV[2])
redis.call('PEXPIRE', P .. 'lease:' .. id, ttl)
local had_ticket = false
if ARGV[9] ~= '' then
  had_ticket = redis.pcall('ZREM', P .. 'queue', ARGV[9]) == 1
  redis.call('DEL', P .. 'ticket:' .. ARGV[9], P .. 'wake:' .. ARGV[9])
end
own_key(P .. 'served:' .. ARGV[7], 'string')
redis.call('SET', P .. 'served:' .. ARGV[7], now_ms, 'EX', 2592000)
own_key(P .. 'held:' .. ARGV[7], 'zset')
redis.call('ZADD', P .. 'held:' .. ARGV[7], now_ms + ttl, id)
-- Plans read the queue, and, when limits apply, users' GPUs: only then did this change one.
if had_ticket or ARGV[10] == '1' or someone_waits() then bump('acquire') end
local out = {'ok', token_text}
for _, uuid in ipairs(chosen) do table.insert(out, uuid) end
return finish(out)
)lua"};

const RedisScript kRelease{"release", GPULOCK_LUA_PRELUDE GPULOCK_LUA_SHARES R"lua(
redis.call('PUBLISH', P .. 'events', 'releasing')  -- first: see register
local id = ARGV[1]
local uuids = {}
for i = 2, #ARGV do table.insert(uuids, ARGV[i]) end
if #uuids == 0 then
  local listed = hmget(P .. 'lease:' .. id, 'gpus')[1]
  if listed then
    for uuid in string.gmatch(listed, '[^,]+') do table.insert(uuids, uuid) end
  end
end
local released = 0
for _, uuid in ipairs(uuids) do
  local lock = get(P .. 'lock:' .. uuid)
  if lock == id then
    redis.call('DEL', P .. 'lock:' .. uuid)
    released = released + 1
  elseif lock == SHARED_MARK then
    -- A shared lease: its reservation goes, the others stay. Keys that are damaged are left
    -- as they are: the GPU's mark lasts its TTL, and the GPU goes to nobody until then.
    local S, U = share_keys(uuid)
    local _, damaged = live_shares(uuid, false)
    if not damaged then
      if redis.call('ZREM', S, id) == 1 then
        redis.call('HDEL', U, id)
        released = released + 1
      end
      settle_mark(uuid)
    end
  end
end
local fields = hmget(P .. 'lease:' .. id, 'ttl', 'user', 'host')
local ttl = tonumber(fields[1]) or 60000
if fields[2] then redis.pcall('ZREM', P .. 'held:' .. fields[2], id) end
local existed = redis.call('DEL', P .. 'lease:' .. id)
-- Tells the holder's next renewal that the lease ended (so it does not re-create it). A holder
-- that cannot renew for a TTL counts its lease lost by itself, so two TTLs are enough.
redis.call('SET', P .. 'ended:' .. id, '1', 'PX', math.max(1000, math.min(2 * ttl, 172800000)))
-- Counted whatever else happens: a newcomer that planned while the GPU was held learns from its
-- entry that it was freed since (see enter), even though nobody waited and the version stays.
if released > 0 and type(redis.pcall('INCR', P .. 'frees')) == 'table' then
  redis.call('SET', P .. 'frees', '1')
end
if (released > 0 or existed > 0) and someone_waits() then
  bump('release')
  -- Wake the first live waiter that may use this host's GPUs (and any that look dead before
  -- it): it plans, and wakes those the plan serves.
  wake_queue_head(fields[3] or '', 1)
end
return released
)lua"};

const RedisScript kRenew{"renew", GPULOCK_LUA_PRELUDE GPULOCK_LUA_TOKENS GPULOCK_LUA_RENEWAL R"lua(
local id, ttl = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', P .. 'ended:' .. id) == 1 then return {'lost', '', 'released'} end
for i = 7, #ARGV do
  local holder = get(P .. 'lock:' .. ARGV[i])
  if holder ~= '' and holder ~= id then return {'lost', ARGV[i], holder} end
end
local restored = false
local uuids = {}
for i = 7, #ARGV do
  local key = P .. 'lock:' .. ARGV[i]
  table.insert(uuids, ARGV[i])
  if redis.call('PEXPIRE', key, ttl) == 0 then
    redis.call('SET', key, id, 'PX', ttl)
    restored = true
  end
end
return renew_lease(id, ttl, ARGV[5], ARGV[3],
                   {'record', ARGV[4], 'token', ARGV[3], 'gpus', table.concat(uuids, ','),
                    'user', ARGV[5], 'host', ARGV[6], 'ttl', ARGV[2]}, restored)
)lua"};

const RedisScript kAcquireShared{"acquire_shared",
                                 GPULOCK_LUA_PRELUDE GPULOCK_LUA_TOKENS GPULOCK_LUA_EARLIER_ACQUIRE
                                     GPULOCK_LUA_QUEUE GPULOCK_LUA_SHARES R"lua(
redis.call('PUBLISH', P .. 'events', 'acquiring')
local id, ttl = ARGV[1], tonumber(ARGV[2])
-- This very request again (its answer lost): answer as its first run did.
local earlier = earlier_acquire(id, true, 9, #ARGV - 3, 4)
if earlier then return earlier end
local needed, cap, spread = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
-- No shared lease starts while a request waits in the queue: those are for whole GPUs, and a
-- stream of small jobs must not starve them.
if queue_has_live_ticket() then return {'queue'} end
if redis.call('EXISTS', P .. 'lease:' .. id) == 1 then return {'busy'} end
-- The candidates that fit, by host (in the order given).
local hosts, fitting = {}, {}
for i = 9, #ARGV - 3, 4 do
  local uuid, host = ARGV[i], ARGV[i + 1]
  local capacity, wanted = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local lock = get(P .. 'lock:' .. uuid)
  if capacity and wanted and (lock == '' or lock == SHARED_MARK) and
     redis.call('EXISTS', P .. 'gpu:' .. uuid) == 1 then
    local held, jobs, damaged = 0, 0, false
    if lock == SHARED_MARK then
      local live
      live, damaged = live_shares(uuid, true)
      for _, r in ipairs(live) do
        held = held + r[2]
        jobs = jobs + 1
      end
    end
    -- Damaged reservation keys: what the GPU's shared leases hold is unknown, so none fits.
    if not damaged and capacity - held >= wanted and (not cap or jobs < cap) then
      if not fitting[host] then
        fitting[host] = {}
        table.insert(hosts, host)
      end
      table.insert(fitting[host], {uuid = uuid, free = capacity - held, wanted = wanted, at = i})
    end
  end
end
-- All on one host: the first that has enough. Pack (the least free memory that fits first, so
-- whole GPUs stay whole for exclusive leases), or spread (the most first); ties in given order.
local chosen
for _, host in ipairs(hosts) do
  if #fitting[host] >= needed then
    chosen = fitting[host]
    table.sort(chosen, function(a, b)
      if a.free ~= b.free then
        if spread then return a.free > b.free end
        return a.free < b.free
      end
      return a.at < b.at
    end)
    while #chosen > needed do table.remove(chosen) end
    break
  end
end
if not chosen or needed < 1 then return {'busy'} end
local token_text, last_token, last_key = next_token()
if not token_text then return {'exhausted', last_token, last_key} end
for _, k in ipairs(TOKEN_KEYS) do redis.call('SET', k, token_text) end
local uuids, units = {}, {}
for _, c in ipairs(chosen) do
  local M = P .. 'lock:' .. c.uuid
  local S, U = share_keys(c.uuid)
  if get(M) == SHARED_MARK then
    if redis.call('PTTL', M) < ttl then redis.call('PEXPIRE', M, ttl) end
  else
    redis.call('DEL', S, U)  -- expired reservations of before
    redis.call('SET', M, SHARED_MARK, 'PX', ttl)
  end
  redis.call('ZADD', S, now_ms + ttl, id)
  redis.call('HSET', U, id, c.wanted)
  expire_with_mark(c.uuid)
  table.insert(uuids, c.uuid)
  table.insert(units, string.format('%d', c.wanted))
end
own_key(P .. 'lease:' .. id, 'hash')
redis.call('HSET', P .. 'lease:' .. id, 'record', ARGV[3], 'token', token_text,
           'gpus', table.concat(uuids, ','), 'units', table.concat(units, ','), 'user', ARGV[4],
           'host', chosen[1] and ARGV[chosen[1].at + 1] or '', 'ttl', ARGV[2])
redis.call('PEXPIRE', P .. 'lease:' .. id, ttl)
own_key(P .. 'served:' .. ARGV[4], 'string')
redis.call('SET', P .. 'served:' .. ARGV[4], now_ms, 'EX', 2592000)
own_key(P .. 'held:' .. ARGV[4], 'zset')
redis.call('ZADD', P .. 'held:' .. ARGV[4], now_ms + ttl, id)
if ARGV[8] == '1' or someone_waits() then bump('acquire') end
local out = {'ok', token_text}
for i, uuid in ipairs(uuids) do
  table.insert(out, uuid)
  table.insert(out, units[i])
end
return out
)lua"};

const RedisScript kRenewShared{
    "renew_shared",
    GPULOCK_LUA_PRELUDE GPULOCK_LUA_TOKENS GPULOCK_LUA_RENEWAL GPULOCK_LUA_SHARES R"lua(
local id, ttl = ARGV[1], tonumber(ARGV[2])
if redis.call('EXISTS', P .. 'ended:' .. id) == 1 then return {'lost', '', 'released'} end
local marked, damaged, first_damaged = {}, {}, nil
for i = 7, #ARGV - 1, 2 do
  local uuid = ARGV[i]
  local lock = get(P .. 'lock:' .. uuid)
  if lock == SHARED_MARK then
    local _, bad = live_shares(uuid, false)
    if bad then
      -- Damaged keys: this reservation cannot be read, but no lease is given the GPU while
      -- they are (every script sees the same damage), so the lease keeps it and the mark.
      damaged[uuid] = true
      first_damaged = first_damaged or uuid
    else
      local S = share_keys(uuid)
      local expiry = tonumber(redis.call('ZSCORE', S, id))
      -- Expired: its memory counted as free from then on, and may be someone else's now.
      if not expiry or expiry <= now_ms then return {'lost', uuid, 'expired'} end
    end
    marked[uuid] = true
  elseif lock ~= '' then
    return {'lost', uuid, lock}
  end
end
local restored = false
local uuids, units = {}, {}
for i = 7, #ARGV - 1, 2 do
  local uuid = ARGV[i]
  local M = P .. 'lock:' .. uuid
  local S, U = share_keys(uuid)
  if marked[uuid] then
    if redis.call('PTTL', M) < ttl then redis.call('PEXPIRE', M, ttl) end
  else
    -- Nobody holds the GPU (the server restarted empty): the reservation comes back.
    redis.call('DEL', S, U)
    redis.call('SET', M, SHARED_MARK, 'PX', ttl)
    restored = true
  end
  if not damaged[uuid] then
    redis.call('ZADD', S, now_ms + ttl, id)
    redis.call('HSET', U, id, ARGV[i + 1])
    expire_with_mark(uuid)
  end
  table.insert(uuids, uuid)
  table.insert(units, ARGV[i + 1])
end
local reply = renew_lease(id, ttl, ARGV[5], ARGV[3],
                          {'record', ARGV[4], 'token', ARGV[3], 'gpus', table.concat(uuids, ','),
                           'units', table.concat(units, ','), 'user', ARGV[5], 'host', ARGV[6],
                           'ttl', ARGV[2]}, restored)
if first_damaged then return {'damaged', first_damaged} end
return reply
)lua"};

const RedisScript kEnter{"enter", GPULOCK_LUA_PRELUDE R"lua(
redis.call('PUBLISH', P .. 'events', 'entering')  -- first: see register
-- ARGV[6], if given, is the version of the caller's snapshot: the reply says whether the pool
-- was still that one (so that the caller's plan, with itself at the back, stands).
-- ARGV[8], if given, is the snapshot's count of releases (`frees`): a release while nobody waited
-- leaves the version as it is, and the caller's plan still saw its GPU held.
local unchanged = 0
if ARGV[6] and ARGV[6] ~= '' and current_version() == ARGV[6] and
   (not ARGV[8] or get(P .. 'frees') == ARGV[8]) then
  unchanged = 1
end
-- A live ticket of this id is this very entry, sent again after its answer was lost (ticket ids
-- are random): it keeps its place.
local seq
if redis.call('EXISTS', P .. 'ticket:' .. ARGV[1]) == 1 then
  local score = redis.pcall('ZSCORE', P .. 'queue', ARGV[1])
  if type(score) == 'string' then seq = tonumber(score) end
end
if not seq then
  seq = redis.pcall('INCR', P .. 'queue_seq')
  if type(seq) == 'table' then
    redis.call('SET', P .. 'queue_seq', '1')
    seq = 1
  end
end
own_key(P .. 'queue', 'zset')
redis.call('ZADD', P .. 'queue', seq, ARGV[1])
own_key(P .. 'ticket:' .. ARGV[1], 'hash')
-- expires_at: when the ticket expires unless renewed (server ms), so that a snapshot has its TTL
-- without a PTTL per ticket.
redis.call('HSET', P .. 'ticket:' .. ARGV[1], 'body', ARGV[3], 'user', ARGV[4], 'hosts',
           ARGV[5] or '', 'run', (server_run()), 'expires_at', now_ms + tonumber(ARGV[2]))
redis.call('PEXPIRE', P .. 'ticket:' .. ARGV[1], tonumber(ARGV[2]))
-- ARGV[7] = '1': the caller's plan, made at the version of ARGV[6], put it last, served and
-- reserving nothing. While that version still holds, such an entry changes no one's plan: the
-- version stays, so that acquires planned at it are not refused as stale. The queue's length
-- tells the caller whether others entered so since its snapshot (then it plans again).
if unchanged == 0 or ARGV[7] ~= '1' then bump('enter') end
local queued = redis.pcall('ZCARD', P .. 'queue')
if type(queued) ~= 'number' then queued = -1 end
return {seq, unchanged, current_version(), now_us, queued}
)lua"};

const RedisScript kLeave{"leave", GPULOCK_LUA_PRELUDE R"lua(
redis.call('PUBLISH', P .. 'events', 'leaving')  -- first: see register
redis.pcall('ZREM', P .. 'queue', ARGV[1])
redis.call('DEL', P .. 'ticket:' .. ARGV[1], P .. 'wake:' .. ARGV[1])
bump('leave')
wake_queue_head('', 1)
return 0
)lua"};

const RedisScript kHeartbeat{"heartbeat", GPULOCK_LUA_PRELUDE R"lua(
local key = P .. 'ticket:' .. ARGV[1]
if redis.call('PEXPIRE', key, tonumber(ARGV[2])) == 0 then return 0 end
redis.call('HSET', key, 'run', (server_run()), 'expires_at', now_ms + tonumber(ARGV[2]))
return 1
)lua"};

const RedisScript kWake{"wake", GPULOCK_LUA_PRELUDE R"lua(
local woken = 0
for i = 1, #ARGV do
  if wake(ARGV[i]) then woken = woken + 1 end
end
return woken
)lua"};

#undef GPULOCK_LUA_SHARES
#undef GPULOCK_LUA_RENEWAL
#undef GPULOCK_LUA_QUEUE
#undef GPULOCK_LUA_TOKENS
#undef GPULOCK_LUA_PRELUDE

}  // namespace gpulock::redis_scripts
