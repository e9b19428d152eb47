-- lib/attempt.lua: the end of a running attempt.
--
--- @include counts
--- @include queue
--- @include history
--- @include ended

-- The running attempt of id (t: its record, its token checked by the caller) ends at now
-- with outcome (history, lib/history.lua; summary: its text or nil): its lease goes and
-- the record has no worker. The caller then ends the task (end_task, lib/ended.lua, which
-- gives the slot of its fairness key back), or makes it ready again (back_to_ready).
local function leave_running(id, t, now, outcome, summary)
  redis.call('ZREM', k.leases, id)
  record_attempt(id, t, now, outcome, summary)
  t.worker = ''
  t.updated = now
end

-- A running task whose attempt ended (leave_running) becomes ready again: the slot of its
-- fairness key comes back (lib/fair.lua), and it is counted and saved; the caller queues it.
local function back_to_ready(c, id, t)
  fair_slot_back(c, id)
  count_move(c, 'running', 'ready')
  t.state = 'ready'
  save_task(id, t)
end

-- End a running attempt that failed (raised, or its lease expired): a new
-- attempt after backoff while attempts remain and no cancellation was
-- requested, otherwise failed (end_task, lib/ended.lua). cap_ms: the longest wait between
-- attempts. outcome: how the attempt ends in the task's history ('failed' or 'lost'),
-- counted as a failure. Returns true when the task became terminal.
local function end_attempt_failed(c, id, t, now, reason, cap_ms, outcome)
  local running_before = running_count(c)
  leave_running(id, t, now, outcome, error_summary(reason))
  local terminal = false
  -- A task whose cancellation was requested gets no new attempt; the request stays on record.
  if t.attempt < t.max_attempts and t.cancel == 0 then
    local delay = t.backoff_ms * 2 ^ (t.attempt - 1)
    if delay > cap_ms then delay = cap_ms end
    t.run_at = now + math.floor(delay)
    back_to_ready(c, id, t)
    enqueue(c, t, id)
  else
    end_task(c, id, t, 'failed', now)
    terminal = true
  end
  redis.call('HSET', k.results, id, 'E' .. reason)
  capacity_freed(c, running_before)
  return terminal
end
