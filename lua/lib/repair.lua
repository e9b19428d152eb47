-- lib/repair.lua: junk in the meta counters, mended before a script does anything else.
--
--- @include run
--
-- The meta fields scripts add to with HINCRBY. Redis refuses HINCRBY on a field that
-- is not a 64-bit integer, and a script stops there with its earlier writes kept: a
-- junk value (written by hand or by a broken client) is repaired by repair_meta, which
-- every script that adds to them calls first, before it checks its arguments; the junk
-- is kept as corrupt:<field> for an operator to see. A negative count is junk as
-- well; lib/counts.lua keeps a count it lowers at 0 or above.
local COUNTED = { 'seq', 'pseq', 'count:pending', 'count:ready', 'count:running',
                  'count:succeeded', 'count:failed', 'count:cancelled', 'count:blocked' }

local function is_int64_text(text)
  -- Redis's own rule: no sign on 0, no leading zero; 18 digits keep clear of overflow.
  return text == '0' or (#text <= 18 and string.match(text, '^%-?[1-9]%d*$') ~= nil)
end

-- Read with the counters, kept in c.meta for meta_fields (lib/run.lua): one HMGET per call.
local START_FIELDS = { 'seq', 'pseq', 'count:pending', 'count:ready', 'count:running',
                       'count:succeeded', 'count:failed', 'count:cancelled', 'count:blocked',
                       'order', 'aging_ms', 'fair', 'max_running', 'clock_ms' }

local function repair_meta(c)
  local values = redis.call('HMGET', k.meta, unpack(START_FIELDS))
  local meta_start = {}
  for i = 1, #START_FIELDS do meta_start[START_FIELDS[i]] = values[i] end
  c.meta = meta_start
  for _, field in ipairs(COUNTED) do
    local value = meta_start[field]
    -- A count below 0 is junk too (no state holds fewer than no tasks).
    if value and (not is_int64_text(value) or (field ~= 'seq' and field ~= 'pseq'
        and string.sub(value, 1, 1) == '-')) then
      -- A count restarts at 0 (it is only shown). Versions and job numbers only grow:
      -- they restart above any a namespace reaches by counting, the server clock in
      -- microseconds (still within the queue member's 14 hex digits).
      local fixed = 0
      if field == 'seq' or field == 'pseq' then
        local t = redis.call('TIME')
        fixed = tonumber(t[1]) * 1000000 + tonumber(t[2])
      end
      redis.log(redis.LOG_WARNING, 'distsched: repaired meta field ' .. field .. ' holding junk')
      meta_start[field] = string.format('%d', fixed)
      redis.call('HSET', k.meta, field, meta_start[field], 'corrupt:' .. field, value)
    end
  end
end
