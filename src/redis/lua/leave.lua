-- needs:
redis.call('PUBLISH', P .. 'events', 'leaving')  -- first: see register
redis.pcall('ZREM', P .. 'queue', ARGV[1])
redis.call('DEL', P .. 'ticket:' .. ARGV[1], P .. 'wake:' .. ARGV[1])
bump('leave')
wake_queue_head('', 1)
return 0
