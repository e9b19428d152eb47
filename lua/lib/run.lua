-- lib/run.lua: how a script body runs and how its errors reach the caller.
--
-- Every script ends with `return run(function() ... end)`. Junk in the meta counters
-- is repaired first (repair_meta). An error raised as
-- {err = 'CODE detail'} becomes the error reply `-CODE detail`; any other failure
-- (a bug, a Lua error) becomes `-ERR <message>`. After a body that succeeded, the
-- functions registered with after_success run in the order they were registered
-- (lib/counts.lua writes its counters, lib/queue.lua wakes workers).

local success_hooks = {}

local function after_success(fn)
  success_hooks[#success_hooks + 1] = fn
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function to_int(value, field)
  local n = tonumber(value)
  if not n or n ~= math.floor(n) then
    error({ err = 'BADARG ' .. field .. ' must be an integer' })
  end
  return n
end

-- The meta fields scripts add to with HINCRBY. Redis refuses HINCRBY on a field that
-- is not a 64-bit integer, and a script stops there with its earlier writes kept: a
-- junk value (written by hand or by a broken client) is repaired before the body runs,
-- the junk kept as corrupt:<field> for an operator to see.
local COUNTED = { 'seq', 'pseq', 'count:pending', 'count:ready', 'count:running',
                  'count:succeeded', 'count:failed', 'count:cancelled', 'count:blocked' }

local function is_int64_text(text)
  -- Redis's own rule: no sign on 0, no leading zero; 18 digits keep clear of overflow.
  return text == '0' or (#text <= 18 and string.match(text, '^%-?[1-9]%d*$') ~= nil)
end

local function repair_meta()
  if not k.meta then return end
  local values = redis.call('HMGET', k.meta, unpack(COUNTED))
  for i, field in ipairs(COUNTED) do
    local value = values[i]
    if value and not is_int64_text(value) then
      local fixed = 0
      if field == 'seq' then
        -- Versions only grow: restart above any a namespace reaches by counting
        -- (the server clock in microseconds, still within the queue member's 14 hex digits).
        local t = redis.call('TIME')
        fixed = tonumber(t[1]) * 1000000 + tonumber(t[2])
      elseif field == 'pseq' and k.propagating then
        local last = redis.call('ZRANGE', k.propagating, -1, -1, 'WITHSCORES')
        fixed = tonumber(last[2]) or 0
      elseif field == 'count:running' and k.leases then
        fixed = redis.call('ZCARD', k.leases)
      end
      redis.log(redis.LOG_WARNING, 'distsched: repaired meta field ' .. field .. ' holding junk')
      redis.call('HSET', k.meta, field, string.format('%d', fixed), 'corrupt:' .. field, value)
    end
  end
end

local function run(body)
  repair_meta()
  local ok, res = pcall(body)
  if ok then
    for _, hook in ipairs(success_hooks) do hook() end
    return res
  end
  -- Redis 7 hands an error table to pcall as its err string; older versions as the table.
  local msg = type(res) == 'table' and res.err or tostring(res)
  -- A code of capitals (ours, or a Redis error such as WRONGTYPE) travels as it is;
  -- anything else is a Lua error message ('user_script:12: ...').
  if not string.match(msg, '^%u[%u_]* ') then msg = 'ERR ' .. msg end
  return redis.error_reply(msg)
end
