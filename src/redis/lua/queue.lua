-- Whether a live ticket waits in the pool's queue: queue_has_live_ticket() removes, on the way,
-- the tickets whose key has expired (dead waiters'). Needs prelude.lua.
local function queue_has_live_ticket()
  local members = redis.pcall('ZRANGE', P .. 'queue', 0, -1)
  if members.err then members = {} end
  for _, m in ipairs(members) do
    if redis.call('EXISTS', P .. 'ticket:' .. m) == 1 then return true end
    redis.call('ZREM', P .. 'queue', m)
  end
  return false
end
