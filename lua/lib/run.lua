-- lib/run.lua: how a script body runs, the state of one call, and how errors reach the caller.
--
-- Every script ends with `return run(function(c) ... end)`. An error raised as
-- {err = 'CODE detail'} becomes the error reply `-CODE detail`; any other failure
-- (a bug, a Lua error) becomes `-ERR <message>`.
--
-- c is the state of one call: a fresh table per call, handed to the body and passed on,
-- as an argument, to every library function that reads or adds to it (the clock read
-- once, settings read once, the tallies and notes the script writes out at its end).
-- A script sent with EVALSHA starts from a fresh chunk anyway; as a Redis Function
-- (FCALL) the library's parts are defined once and shared by every call, so no part
-- keeps anything of a call in a variable of its own. Nothing runs that the script does
-- not call: what a call writes at its end (counters, wake-ups, ended notices) its own
-- file calls, after its body's work.

-- c[name], a table the call fills as it goes (tallies, notes), made at its first use:
-- most calls never need most of them.
local function call_table(c, name)
  local t = c[name]
  if not t then
    t = {}
    c[name] = t
  end
  return t
end


-- An integer as the text redis.call sends. Redis turns a Lua number argument into text
-- with snprintf('%.17g'), which costs about three times this format; the text is the
-- same for every integer a script sends (all within 2^53). Not for fractional scores.
local function itoa(n)
  return string.format('%d', n)
end


-- HMGET of meta fields as the call found them: from c.meta (the fields lib/repair.lua
-- read when the call began) when it holds them all, else read now. Only for fields the
-- script has not written yet (settings, counters before the call's own changes, which
-- lib/counts.lua writes at the end).
local function meta_fields(c, ...)
  local start = c.meta
  if start then
    local fields = { ... }
    local values = {}
    for i, field in ipairs(fields) do
      values[i] = start[field]
      if values[i] == nil then return redis.call('HMGET', k.meta, ...) end
    end
    return values
  end
  return redis.call('HMGET', k.meta, ...)
end

-- A namespace's test clock: how far its clock runs ahead of the server's, in ms (meta
-- clock_ms, which only distsched.testing moves, forward). Absent, junk or above
-- MAX_CLOCK_MS (2^41 ms, about 70 years; a literal: the parts' top-level names are
-- counted, lua/README.md "As Redis Functions"): 0.
local function clock_offset(text)
  local n = tonumber(text)
  if not n or n < 0 or n ~= math.floor(n) or n > 2199023255552 then return 0 end
  return n
end

-- The namespace's clock in microseconds, read once per call: a call is one atomic
-- moment. The server's clock, plus the test clock's offset.
local function now_us(c)
  if not c.now_us then
    local t = redis.call('TIME')
    local offset = clock_offset(meta_fields(c, 'clock_ms')[1])
    c.now_us = (tonumber(t[1]) * 1000 + offset) * 1000 + tonumber(t[2])
  end
  return c.now_us
end

-- now_us(c) in whole milliseconds.
local function now_ms(c)
  if not c.now then c.now = math.floor(now_us(c) / 1000) end
  return c.now
end

-- now_ms(c) as text, formatted once per call.
local function now_text(c)
  if not c.now_text then c.now_text = itoa(now_ms(c)) end
  return c.now_text
end

local function to_int(value, field)
  local n = tonumber(value)
  if not n or n ~= math.floor(n) then
    error({ err = 'BADARG ' .. field .. ' must be an integer' })
  end
  return n
end

local function run(body)
  local ok, res = pcall(body, {})
  if ok then return res end
  -- Redis 7 hands an error table to pcall as its err string; older versions as the table.
  local msg = type(res) == 'table' and res.err or tostring(res)
  -- A code of capitals (ours, or a Redis error such as WRONGTYPE) travels as it is;
  -- anything else is a Lua error message ('user_script:12: ...').
  if not string.match(msg, '^%u[%u_]* ') then msg = 'ERR ' .. msg end
  return redis.error_reply(msg)
end
