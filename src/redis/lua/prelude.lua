-- Shared by every script: the key prefix, the server's time, safe reads, and the version bump.
local P = string.sub(KEYS[1], 1, -8)
local T = redis.call('TIME')
local now_ms = tonumber(T[1]) * 1000 + math.floor(tonumber(T[2]) / 1000)
-- The server's clock in microseconds, as text: a wake and a snapshot are ordered by it.
local now_us = T[1] .. string.format('%06d', tonumber(T[2]))
local function get(k)
  local v = redis.pcall('GET', k)
  if type(v) == 'table' then return '!garbage' end
  return v or ''
end
local function hmget(k, ...)
  local v = redis.pcall('HMGET', k, ...)
  if v.err then return {} end
  return v
end
-- The pool's version as text; '0' before the first bump.
local function current_version()
  local v = get(P .. 'version')
  if v == '' then return '0' end
  return v
end
local function bump(event)
  if type(redis.pcall('INCR', P .. 'version')) == 'table' then
    redis.call('SET', P .. 'version', '1')
  end
  redis.call('PUBLISH', P .. 'events', event)
end
local function someone_waits()
  local n = redis.pcall('ZCARD', P .. 'queue')
  return type(n) ~= 'number' or n > 0
end
local function wake(id)
  if redis.call('EXISTS', P .. 'ticket:' .. id) == 0 then return false end
  local k = P .. 'wake:' .. id
  if redis.call('TYPE', k).ok ~= 'list' then redis.call('DEL', k) end
  -- What the waker knew: the pool's version and the server's time when it pushed the wake.
  redis.call('LPUSH', k, current_version() .. ' ' .. now_us)
  redis.call('LTRIM', k, 0, 0)
  redis.call('PEXPIRE', k, 60000)
  return true
end
local function wake_queue_head(host, count)
  local members = redis.pcall('ZRANGE', P .. 'queue', 0, -1)
  if members.err then return end
  for _, id in ipairs(members) do
    if count <= 0 then return end
    local h = hmget(P .. 'ticket:' .. id, 'hosts')[1] or ''
    if host == '' or h == '' or string.find('\n' .. h, '\n' .. host .. '\n', 1, true) then
      -- A ticket renewed within the last 3 s (half its TTL) has a live waiter: it counts.
      if wake(id) and redis.call('PTTL', P .. 'ticket:' .. id) > 3000 then
        count = count - 1
      end
    end
  end
end
local function server_run()
  local info = redis.call('INFO', 'server')
  return string.match(info, 'run_id:(%x+)') or '',
         tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) or 0
end
-- Whether v is a lease id as gpulock makes them (16 lowercase hex digits).
local function is_lease_id(v)
  return type(v) == 'string' and #v == 16 and string.find(v, '^[0-9a-f]+$') ~= nil
end
local function own_key(k, kind)
  local t = redis.call('TYPE', k).ok
  if t ~= kind and t ~= 'none' then redis.call('DEL', k) end
end
