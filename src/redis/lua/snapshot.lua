-- needs: shares
-- The scope: the hosts named (one per line), widened to the hosts every queued ticket may use;
-- the whole pool when ARGV[1] is empty or a ticket may use any host.
local whole = ARGV[1] == ''
local scope = {}
if not whole then
  for h in string.gmatch(ARGV[1], '[^\n]+') do scope[h] = true end
end
local users = {}
if ARGV[2] and ARGV[2] ~= '' then users[ARGV[2]] = true end
-- ARGV[3], if given: the caller's lease TTL (ms), the grace a lock key without an expiry gets.
local grace = tonumber(ARGV[3] or '')
if grace and (grace < 500 or grace > 86400000) then grace = nil end
local tickets_out = {}
local members = redis.pcall('ZRANGE', P .. 'queue', 0, -1, 'WITHSCORES')
if members.err then members = {} end
local removed = false
local run, uptime = nil, 0
local served_of = {}
for i = 1, #members, 2 do
  local id = members[i]
  local t, stale, restored =
    hmget(P .. 'ticket:' .. id, 'body', 'user', 'hosts', 'run', 'expires_at'), false, false
  if #t > 0 and not t[1] and not t[2] and not t[3] and not t[4] and not t[5] then
    -- No ticket: it expired (a dead waiter). One of another type is kept, and read as garbage.
    redis.call('ZREM', P .. 'queue', id)
    t = nil
    removed = true
  else
    if t[4] and t[4] ~= '' then
      if not run then run, uptime = server_run() end
      -- Not renewed since the server started (restored from an RDB or AOF): once live waiters
      -- have had 2 s to come back and renew theirs, its waiter is gone.
      if t[4] ~= run then
        if uptime >= 2 then stale = true else restored = true end
      end
    end
  end
  if stale then
    redis.call('ZREM', P .. 'queue', id)
    redis.call('DEL', P .. 'ticket:' .. id, P .. 'wake:' .. id)
    removed = true
  elseif t then
    local served = ''
    if t[2] then
      if not served_of[t[2]] then served_of[t[2]] = get(P .. 'served:' .. t[2]) end
      served = served_of[t[2]]
      users[t[2]] = true
    end
    if not t[3] or t[3] == '' then
      whole = true
    else
      for h in string.gmatch(t[3], '[^\n]+') do scope[h] = true end
    end
    -- The TTL by expires_at, as enter and heartbeat set it with the key's expiry; a ticket
    -- without one still ahead (written or renewed by an older gpulock) is asked.
    local ttl = tonumber(t[5] or '')
    if ttl and ttl > now_ms and ttl < now_ms + 86400000 then
      ttl = ttl - now_ms
    else
      ttl = redis.call('PTTL', P .. 'ticket:' .. id)
      -- A ticket without an expiry (no script writes one) would wait ahead of everyone, and
      -- stop every shared acquire, forever: it gets a ticket's TTL, which a living waiter's
      -- heartbeat keeps renewing.
      if ttl == -1 then
        redis.call('PEXPIRE', P .. 'ticket:' .. id, 6000)
        ttl = 6000
      end
    end
    -- A restored ticket not renewed yet ends, for waiters timing their wake, when it can be
    -- dropped (it is, then, unless its waiter renews it meanwhile).
    if restored and ttl >= 0 then ttl = math.min(ttl, (2 - uptime) * 1000) end
    for _, v in ipairs({id, members[i + 1], t[1] or '', t[2] or '', served, ttl}) do
      table.insert(tickets_out, v)
    end
  end
end
if removed then
  bump('leave')
  wake_queue_head('', 1)
end

local hosts_out, gpus_out, leases_out, elsewhere_out = {}, {}, {}, {}
-- The lock values of a host's GPUs, as get() reads each: one MGET per 256 GPUs, not a GET
-- each. MGET reads a key of another type as missing; EXISTS, which counts keys of every type,
-- tells when one is there, and get() then reads the missing ones one by one.
local function lock_values(uuids)
  local out = {}
  for first = 1, #uuids, 256 do
    local keys = {}
    for i = first, math.min(#uuids, first + 255) do keys[#keys + 1] = P .. 'lock:' .. uuids[i] end
    local values = redis.call('MGET', unpack(keys))
    local found = 0
    for i = 1, #keys do
      if values[i] then found = found + 1 end
    end
    local other_types = found < #keys and redis.call('EXISTS', unpack(keys)) > found
    for i = 1, #keys do
      local v = values[i]
      if not v then v = other_types and get(keys[i]) or '' end
      out[first + i - 1] = v
    end
  end
  return out
end
local listed = {}
if whole then
  local hosts = redis.pcall('ZRANGE', P .. 'hosts', 0, -1, 'WITHSCORES')
  if hosts.err then hosts = {} end
  for i = 1, #hosts, 2 do
    table.insert(listed, {hosts[i], hosts[i + 1]})
  end
else
  local names = {}
  for h in pairs(scope) do table.insert(names, h) end
  table.sort(names)
  for _, h in ipairs(names) do
    local score = redis.pcall('ZSCORE', P .. 'hosts', h)
    if type(score) == 'string' then table.insert(listed, {h, score}) end
  end
end
local in_scope = {}
local seen = {}
for _, entry in ipairs(listed) do
  local host = entry[1]
  in_scope[host] = true
  table.insert(hosts_out, host)
  table.insert(hosts_out, entry[2])
  local h = hmget(P .. 'host:' .. host, 'info', 'gpus', 'registered_at', 'gpus_at')
  table.insert(hosts_out, h[1] or '')
  -- With the host's packed registrations, its GPUs' own hashes are not read: the client takes
  -- their info from the package (a host whose GPU another host took has none, and one that an
  -- older gpulock registered since has a stale one: see register).
  local packed = h[2]
  if packed and h[3] ~= h[4] then packed = nil end
  table.insert(hosts_out, packed or '')
  local uuids = redis.pcall('SMEMBERS', P .. 'gpus:' .. host)
  if uuids.err then uuids = {} end
  table.sort(uuids)
  local locks = lock_values(uuids)
  for i, uuid in ipairs(uuids) do
    local g
    if packed then
      g = {host}
    else
      g = hmget(P .. 'gpu:' .. uuid, 'host', 'info', 'readings', 'read_at')
    end
    if g[1] == host then
      local lock = locks[i]
      local ttl = -2  -- no key: only a held GPU's lock has a TTL worth asking for
      if lock ~= '' then ttl = redis.call('PTTL', P .. 'lock:' .. uuid) end
      local holders, shares = nil, ''
      local live, damaged = {}, false
      if lock == SHARED_MARK then live, damaged = live_shares(uuid, false) end
      -- A lock key without an expiry, which no script writes (PERSIST, or planted by hand),
      -- would block its GPU forever: it gets the expiry its holder's renewals keep (the lease's,
      -- or its last reservation's), or, when nothing holds it, `grace` (the caller's lease TTL,
      -- time enough for a holder to renew). A damaged one stays as it is (see doctor).
      if ttl == -1 and grace then
        local M = P .. 'lock:' .. uuid
        if lock == SHARED_MARK and not damaged then
          local last = 0
          for _, r in ipairs(live) do last = math.max(last, r[3]) end
          if last > 0 then
            redis.call('PEXPIREAT', M, last)
          else
            redis.call('PEXPIRE', M, grace)
          end
        elseif is_lease_id(lock) then
          local left = redis.call('PTTL', P .. 'lease:' .. lock)
          if left > 0 then
            redis.call('PEXPIRE', M, left)
          elseif left == -2 then
            redis.call('PEXPIRE', M, grace)
          end
        end
        ttl = redis.call('PTTL', M)
      end
      if damaged then
        -- Nobody can tell what its shared leases hold: given to nobody until the mark ends.
        lock = '!shares'
      elseif lock == SHARED_MARK then
        local lines = {}
        holders = {}
        for _, r in ipairs(live) do
          holders[#holders + 1] = r[1]
          lines[#lines + 1] = r[1] .. ' ' .. string.format('%d %d', r[2], r[3] - now_ms)
        end
        shares = table.concat(lines, '\n')
      elseif lock ~= '' and lock ~= '!garbage' then
        holders = {lock}
      end
      local n = #gpus_out
      gpus_out[n + 1], gpus_out[n + 2], gpus_out[n + 3], gpus_out[n + 4] =
        uuid, host, g[2] or '', g[3] or ''
      gpus_out[n + 5], gpus_out[n + 6], gpus_out[n + 7], gpus_out[n + 8] =
        g[4] or '', lock, ttl, shares
      for _, holder in ipairs(holders or {}) do
        if not seen[holder] then
          seen[holder] = true
          local lease = hmget(P .. 'lease:' .. holder, 'record', 'token', 'user')
          local m = #leases_out
          leases_out[m + 1], leases_out[m + 2], leases_out[m + 3], leases_out[m + 4] =
            holder, lease[1] or '', lease[2] or '', redis.call('PTTL', P .. 'lease:' .. holder)
          leases_out[m + 5] = lease[3] or ''
        end
      end
    end
  end
end
-- Fair share and limits count a user's GPUs on every host: those outside the scope come from
-- the user's `held:` set (lease ids by expiry), not from reading every host.
local memory_totals = {}
-- A GPU's memory as its registration gives it (false when unknown), read once per GPU.
local function memory_total_of(uuid)
  if memory_totals[uuid] == nil then
    local info = hmget(P .. 'gpu:' .. uuid, 'info')[1] or ''
    memory_totals[uuid] = string.match(info, '"memory_total":(%d+)') or false
  end
  return memory_totals[uuid]
end
if not whole then
  local names = {}
  for u in pairs(users) do table.insert(names, u) end
  table.sort(names)
  for _, user in ipairs(names) do
    local key = P .. 'held:' .. user
    if redis.call('TYPE', key).ok == 'zset' then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
      local count, parts = 0, {}
      for _, id in ipairs(redis.call('ZRANGE', key, 0, -1)) do
        local l = hmget(P .. 'lease:' .. id, 'host', 'gpus')
        local host = l[1]
        if host and not in_scope[host] and l[2] then
          -- Each GPU counts as a snapshot whose scope holds the host would count it: listed
          -- there, and held by this lease (a whole GPU) or carrying its live reservation (its
          -- units, with the GPU's memory, so that it weighs its part of the GPU).
          local listed_once = {}
          for uuid in string.gmatch(l[2], '[^,]+') do
            local first = not listed_once[uuid]
            listed_once[uuid] = true
            if first and redis.pcall('SISMEMBER', P .. 'gpus:' .. host, uuid) == 1 then
              local lock = get(P .. 'lock:' .. uuid)
              if lock == id then
                count = count + 1
              elseif lock == SHARED_MARK then
                local S, U = share_keys(uuid)
                local expiry = tonumber(redis.pcall('ZSCORE', S, id))
                local units = tonumber(redis.pcall('HGET', U, id))
                local total = memory_total_of(uuid)
                if expiry and expiry > now_ms and total then
                  parts[#parts + 1] = string.format('%d', units or 0) .. ' ' .. total
                end
              end
            end
          end
        end
      end
      if count > 0 or #parts > 0 then
        table.insert(elsewhere_out, user)
        table.insert(elsewhere_out, count)
        table.insert(elsewhere_out, table.concat(parts, '\n'))
      end
    end
  end
end
-- The requesting user's last service, which its tickets carry for users already queued.
local served = ''
if ARGV[2] and ARGV[2] ~= '' then
  served = served_of[ARGV[2]] or get(P .. 'served:' .. ARGV[2])
end
-- The client reads this reply by the names of redis/script_calls.h (snapshot_reply).
return {current_version(), now_ms, hosts_out, gpus_out, leases_out, tickets_out, elsewhere_out,
        whole and 1 or 0, now_us, get(P .. 'frees'), served}
