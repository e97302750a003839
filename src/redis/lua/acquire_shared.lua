-- needs: tokens earlier_acquire queue shares
-- Its ARGV and reply by name, for the client: redis/script_calls.h.
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
