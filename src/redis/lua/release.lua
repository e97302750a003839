-- needs: shares
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
