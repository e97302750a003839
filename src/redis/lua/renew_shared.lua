-- needs: tokens renewal shares
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
