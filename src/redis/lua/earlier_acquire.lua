-- What an acquire of lease `id` answered, if it ran before: {'ok', token, uuid[, units]...}, else
-- nil. A lease id is random, one per attempt, so only that very request can have made the lease
-- (its answer was lost and the connection sent it again); a lease whose GPUs are not among the
-- request's candidates (ARGV[first], ARGV[first + step], ... up to ARGV[last]) is another
-- request's. Reads one key when there is no such lease. Needs prelude.lua.
local function earlier_acquire(id, with_units, first, last, step)
  local f = hmget(P .. 'lease:' .. id, 'token', 'gpus', 'units')
  if not f[1] or not f[2] or (with_units and not f[3]) then return nil end
  local asked = {}
  for a = first, last, step do asked[ARGV[a]] = true end
  local out, units, i = {'ok', f[1]}, {}, 0
  if with_units then
    for u in string.gmatch(f[3], '[^,]+') do table.insert(units, u) end
  end
  for uuid in string.gmatch(f[2], '[^,]+') do
    if not asked[uuid] then return nil end
    i = i + 1
    table.insert(out, uuid)
    if with_units then table.insert(out, units[i] or '0') end
  end
  return out
end
