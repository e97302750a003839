-- needs: tokens renewal
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
