-- needs: tokens earlier_acquire queue
-- Its ARGV and reply by name, for the client: redis/script_calls.h.
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
