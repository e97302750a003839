-- needs:
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
