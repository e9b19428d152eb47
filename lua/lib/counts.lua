-- lib/counts.lua: the per-state counters and the fleet-wide running limit.
--
--- @include run
--- @include idle
--- @include fair
--
-- Per-state counters live in the meta hash as count:<state>. A script tallies its
-- moves and writes each changed counter once, when its body has succeeded.

local count_delta = {}
-- A fresh table only after a call that used it: most calls leave it empty.
on_each_call(function() if next(count_delta) then count_delta = {} end end)

local function count_move(from_state, to_state)
  if from_state then count_delta[from_state] = (count_delta[from_state] or 0) - 1 end
  if to_state then count_delta[to_state] = (count_delta[to_state] or 0) + 1 end
end

-- Add delta to a counter, never leaving it below 0: a counter that was off (junk
-- repaired to 0, a hand edit) reads 0 rather than a negative count.
local function count_add(field, delta)
  if delta == 0 then return end
  if redis.call('HINCRBY', k.meta, field, itoa(delta)) < 0 then
    redis.call('HSET', k.meta, field, '0')
  end
end

after_success(function()
  for state, delta in pairs(count_delta) do count_add('count:' .. state, delta) end
end)

local function running_count()
  return (tonumber(meta_fields('count:running')[1]) or 0) + (count_delta.running or 0)
end

-- When the fleet-wide capacity was full and slots free, wake one idle worker per free
-- slot (no more than there are queue entries).
local function capacity_freed(running_before)
  local limit = tonumber(meta_fields('max_running')[1])
  if limit and running_before >= limit then
    local queued = redis.call('ZCARD', k.queue)
    if fair_on() then queued = queued + redis.call('ZCARD', k.fairq) end
    local free = math.min(limit - running_count(), queued)
    wake_idle(free, now_ms())
  end
end
