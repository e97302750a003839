-- needs:
-- Its ARGV and reply by name, for the client: redis/script_calls.h.
redis.call('PUBLISH', P .. 'events', 'entering')  -- first: see register
-- ARGV[6], if given, is the version of the caller's snapshot: the reply says whether the pool
-- was still that one (so that the caller's plan, with itself at the back, stands).
-- ARGV[8], if given, is the snapshot's count of releases (`frees`): a release while nobody waited
-- leaves the version as it is, and the caller's plan still saw its GPU held.
local unchanged = 0
if ARGV[6] and ARGV[6] ~= '' and current_version() == ARGV[6] and
   (not ARGV[8] or get(P .. 'frees') == ARGV[8]) then
  unchanged = 1
end
-- A live ticket of this id is this very entry, sent again after its answer was lost (ticket ids
-- are random): it keeps its place.
local seq
if redis.call('EXISTS', P .. 'ticket:' .. ARGV[1]) == 1 then
  local score = redis.pcall('ZSCORE', P .. 'queue', ARGV[1])
  if type(score) == 'string' then seq = tonumber(score) end
end
if not seq then
  seq = redis.pcall('INCR', P .. 'queue_seq')
  if type(seq) == 'table' then
    redis.call('SET', P .. 'queue_seq', '1')
    seq = 1
  end
end
own_key(P .. 'queue', 'zset')
redis.call('ZADD', P .. 'queue', seq, ARGV[1])
own_key(P .. 'ticket:' .. ARGV[1], 'hash')
-- expires_at: when the ticket expires unless renewed (server ms), so that a snapshot has its TTL
-- without a PTTL per ticket.
redis.call('HSET', P .. 'ticket:' .. ARGV[1], 'body', ARGV[3], 'user', ARGV[4], 'hosts',
           ARGV[5] or '', 'run', (server_run()), 'expires_at', now_ms + tonumber(ARGV[2]))
redis.call('PEXPIRE', P .. 'ticket:' .. ARGV[1], tonumber(ARGV[2]))
-- ARGV[7] = '1': the caller's plan, made at the version of ARGV[6], put it last, served and
-- reserving nothing. While that version still holds, such an entry changes no one's plan: the
-- version stays, so that acquires planned at it are not refused as stale. The queue's length
-- tells the caller whether others entered so since its snapshot (then it plans again).
if unchanged == 0 or ARGV[7] ~= '1' then bump('enter') end
local queued = redis.pcall('ZCARD', P .. 'queue')
if type(queued) ~= 'number' then queued = -1 end
return {seq, unchanged, current_version(), now_us, queued}
