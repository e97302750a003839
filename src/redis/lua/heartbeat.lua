-- needs:
local key = P .. 'ticket:' .. ARGV[1]
if redis.call('PEXPIRE', key, tonumber(ARGV[2])) == 0 then return 0 end
redis.call('HSET', key, 'run', (server_run()), 'expires_at', now_ms + tonumber(ARGV[2]))
return 1
