-- lib/counts.lua: the per-state counters and the fleet-wide running limit.
--
--- @include run
--- @include idle
--- @include fair
--
-- Per-state counters live in the meta hash as count:<state>. A script tallies its
-- moves in c.counts (count_move) and writes each changed counter once, at its end
-- (write_counts).

local function count_move(c, from_state, to_state)
  local delta = call_table(c, 'counts')
  if from_state then delta[from_state] = (delta[from_state] or 0) - 1 end
  if to_state then delta[to_state] = (delta[to_state] or 0) + 1 end
end

-- Add delta to a counter, never leaving it below 0: a counter that was off (junk
-- repaired to 0, a hand edit) reads 0 rather than a negative count.
local function count_add(field, delta)
  if delta == 0 then return end
  if redis.call('HINCRBY', k.meta, field, itoa(delta)) < 0 then
    redis.call('HSET', k.meta, field, '0')
  end
end

-- Write the counters the call's moves changed.
local function write_counts(c)
  for state, delta in pairs(c.counts or {}) do count_add('count:' .. state, delta) end
end

local function running_count(c)
  local moved = c.counts and c.counts.running or 0
  return (tonumber(meta_fields(c, 'count:running')[1]) or 0) + moved
end

-- When the fleet-wide capacity was full and slots free, wake one idle worker per free
-- slot (no more than there are queue entries).
local function capacity_freed(c, running_before)
  local limit = tonumber(meta_fields(c, 'max_running')[1])
  if limit and running_before >= limit then
    local queued = redis.call('ZCARD', k.queue)
    if fair_on(c) then queued = queued + redis.call('ZCARD', k.fairq) end
    local free = math.min(limit - running_count(c), queued)
    wake_idle(free, now_ms(c))
  end
end
