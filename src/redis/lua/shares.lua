-- Shared leases' reservations on a GPU (docs/design-redis.md, "Shared leases"): `lock:UUID` holds
-- SHARED_MARK instead of a lease id, with the TTL of the reservation that ends last;
-- `shares:UUID` scores each shared lease's id by when its reservation expires, and
-- `share_units:UUID` gives its memory units. A reservation whose expiry passed counts for
-- nothing (as an expired lock), and goes at the next write that looks at the GPU. While no key
-- marks the GPU shared, whatever the two keys hold has expired.
local SHARED_MARK = '=shared'
local function share_keys(uuid)
  return P .. 'shares:' .. uuid, P .. 'share_units:' .. uuid
end
-- The live reservations {id, units, expiry ms}, and whether the two keys are damaged:
-- of the wrong type, disagreeing (a member of one missing from the other), or with units
-- that are no count. Then nobody can tell what the GPU's shared leases hold: callers give
-- the GPU to nobody and remove nothing. With `purge`, expired reservations are removed.
local function live_shares(uuid, purge)
  local S, U = share_keys(uuid)
  local ts, tu = redis.call('TYPE', S).ok, redis.call('TYPE', U).ok
  if (ts ~= 'zset' and ts ~= 'none') or (tu ~= 'hash' and tu ~= 'none') or
     redis.call('ZCARD', S) ~= redis.call('HLEN', U) then
    return {}, true
  end
  if purge then
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', S, '-inf', now_ms)) do
      redis.call('ZREM', S, id)
      redis.call('HDEL', U, id)
    end
  end
  local out = {}
  local m = redis.call('ZRANGEBYSCORE', S, '(' .. now_ms, '+inf', 'WITHSCORES')
  for i = 1, #m, 2 do
    local units = redis.call('HGET', U, m[i])
    if not units or not string.find(units, '^%d+$') then return {}, true end
    table.insert(out, {m[i], tonumber(units), tonumber(m[i + 1])})
  end
  return out, false
end
-- After a reservation ended: the mark lasts as long as the last one left, or goes.
local function settle_mark(uuid)
  local S, U = share_keys(uuid)
  local live, damaged = live_shares(uuid, true)
  -- Damaged: the mark lasts its TTL (the end of the last reservation renewed).
  if damaged then return end
  local M = P .. 'lock:' .. uuid
  if #live == 0 then
    redis.call('DEL', S, U)
    if get(M) == SHARED_MARK then redis.call('DEL', M) end
    return
  end
  local last = 0
  for _, r in ipairs(live) do last = math.max(last, r[3]) end
  if get(M) == SHARED_MARK then redis.call('PEXPIREAT', M, last) end
  redis.call('PEXPIREAT', S, last)
  redis.call('PEXPIREAT', U, last)
end
-- The reservations' keys go with the mark (no GPU keeps them once nobody writes to it).
local function expire_with_mark(uuid)
  local S, U = share_keys(uuid)
  local left = redis.call('PTTL', P .. 'lock:' .. uuid)
  if left > 0 then
    redis.call('PEXPIRE', S, left)
    redis.call('PEXPIRE', U, left)
  end
end
