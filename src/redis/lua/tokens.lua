-- Fencing tokens in exact decimal text, never Lua numbers (doubles, exact only below 2^53). The
-- `token` key and its copy `token_copy` are read as untrusted input: a value that is not 1 to 20
-- digits without a leading zero, at most 2^64 - 1, or a key of the wrong type, counts as absent.
local TOKEN_MAX = '18446744073709551615'
local TOKEN_KEYS = {P .. 'token', P .. 'token_copy'}
local function token_less(a, b)
  if #a ~= #b then return #a < #b end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return false
end
local function token_of(v)
  if type(v) ~= 'string' or #v == 0 or #v > 20 then return nil end
  if not string.find(v, '^%d+$') then return nil end
  if #v > 1 and string.byte(v, 1) == 48 then return nil end
  if token_less(TOKEN_MAX, v) then return nil end
  return v
end
local function token_next(v)
  if v == TOKEN_MAX then return nil end
  local i = #v
  while i > 0 and string.byte(v, i) == 57 do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #v) end
  return string.sub(v, 1, i - 1) .. string.char(string.byte(v, i) + 1) ..
         string.rep('0', #v - i)
end
local function read_token(k)
  return token_of(redis.pcall('GET', k))
end
-- The next token: above the last one issued (either copy that is valid) and
-- at least the server's time in microseconds; nil and the last one past
-- 2^64 - 1, with the name of the key that holds it. Writes nothing.
local function next_token()
  local text = token_of(T[1] .. string.format('%06d', tonumber(T[2]))) or '1'
  for _, k in ipairs(TOKEN_KEYS) do
    local last = read_token(k)
    if last then
      local after = token_next(last)
      if not after then return nil, last, string.sub(k, #P + 1) end
      if token_less(text, after) then text = after end
    end
  end
  return text
end
