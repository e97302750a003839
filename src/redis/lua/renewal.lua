-- What a renew script (exclusive or shared) does once the lease's GPUs are kept: renew_lease()
-- sets the lease hash to `fields` (name, value pairs), renews the user's `held` set, and raises
-- the token keys to the lease's token. It replies 'restored' (bumping the version) when anything
-- had to be written back, else 'ok'. Needs prelude.lua and tokens.lua.
local function renew_lease(id, ttl, user, token, fields, restored)
  local lease = P .. 'lease:' .. id
  if redis.call('TYPE', lease).ok ~= 'hash' then
    redis.call('DEL', lease)
    restored = true
  end
  redis.call('HSET', lease, unpack(fields))
  redis.call('PEXPIRE', lease, ttl)
  own_key(P .. 'held:' .. user, 'zset')
  redis.call('ZADD', P .. 'held:' .. user, now_ms + ttl, id)
  local held = token_of(token)
  if held then
    for _, k in ipairs(TOKEN_KEYS) do
      local last = read_token(k)
      if not last or token_less(last, held) then redis.call('SET', k, held) end
    end
  end
  if restored then
    bump('renew')
    return {'restored'}
  end
  return {'ok'}
end
