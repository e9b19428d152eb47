-- lib/run.lua: how a script body runs and how its errors reach the caller.
--
-- Every script ends with `return run(function() ... end)`. An error raised as
-- {err = 'CODE detail'} becomes the error reply `-CODE detail`; any other failure
-- (a bug, a Lua error) becomes `-ERR <message>`. After a body that succeeded, the
-- functions registered with after_success run in the order they were registered
-- (lib/counts.lua writes its counters, lib/queue.lua wakes workers).

local success_hooks = {}

-- State a part keeps for one call (tallies, caches read once) is reset by a function
-- registered with on_each_call, which run calls first. A script sent with EVALSHA starts
-- from a fresh chunk anyway; as a Redis Function (FCALL) the library's parts are defined
-- once and shared by every call, so without the reset one call's state would leak into
-- the next.
local call_hooks = {}

local function on_each_call(fn)
  call_hooks[#call_hooks + 1] = fn
end

local function begin_call()
  for _, hook in ipairs(call_hooks) do hook() end
end

local function after_success(fn)
  success_hooks[#success_hooks + 1] = fn
end

-- The server clock is read once per call: a call is one atomic moment.
local call_now
on_each_call(function() call_now = nil end)

local function now_ms()
  if not call_now then
    local t = redis.call('TIME')
    call_now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return call_now
end

-- An integer as the text redis.call sends. Redis turns a Lua number argument into text
-- with snprintf('%.17g'), which costs about three times this format; the text is the
-- same for every integer a script sends (all within 2^53). Not for fractional scores.
local function itoa(n)
  return string.format('%d', n)
end

-- now_ms() as text, formatted once per call.
local call_now_text
on_each_call(function() call_now_text = nil end)

local function now_text()
  if not call_now_text then call_now_text = itoa(now_ms()) end
  return call_now_text
end

-- Meta fields read once when a call begins (lib/repair.lua reads them along with the
-- counters it checks): field -> value, false when absent; nil before that read.
local meta_start
on_each_call(function() meta_start = nil end)

-- HMGET of meta fields as the call found them: from meta_start when it holds them all,
-- else read now. Only for fields the script has not written yet (settings, counters
-- before the call's own changes, which lib/counts.lua writes at the end).
local function meta_fields(...)
  local fields = { ... }
  if meta_start then
    local values = {}
    for i, field in ipairs(fields) do
      values[i] = meta_start[field]
      if values[i] == nil then return redis.call('HMGET', k.meta, ...) end
    end
    return values
  end
  return redis.call('HMGET', k.meta, ...)
end

local function to_int(value, field)
  local n = tonumber(value)
  if not n or n ~= math.floor(n) then
    error({ err = 'BADARG ' .. field .. ' must be an integer' })
  end
  return n
end

-- Functions registered with before_body run before the body, outside its error
-- handling (lib/repair.lua mends junk the body would otherwise stop on).
local before_hooks = {}

local function before_body(fn)
  before_hooks[#before_hooks + 1] = fn
end

local function run(body)
  begin_call()
  for _, hook in ipairs(before_hooks) do hook() end
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
