-- lib/attempt.lua: the end of a running attempt that failed.
--
--- @include counts
--- @include queue
--- @include history

-- End a running attempt that failed (raised, or its lease expired): a new
-- attempt after backoff while attempts remain and no cancellation was
-- requested, otherwise failed. cap_ms: the longest wait between attempts. outcome: how
-- the attempt ends in the task's history ('failed' or 'lost'), counted as a failure.
-- Returns true when the task became terminal.
local function end_attempt_failed(id, t, now, reason, cap_ms, outcome)
  local running_before = running_count()
  redis.call('ZREM', k.leases, id)
  record_attempt(id, t, now, outcome, error_summary(reason))
  t.worker = ''
  t.updated = now
  local terminal = false
  -- A task whose cancellation was requested gets no new attempt; the request stays on record.
  if t.attempt < t.max_attempts and t.cancel == 0 then
    local delay = t.backoff_ms * 2 ^ (t.attempt - 1)
    if delay > cap_ms then delay = cap_ms end
    t.run_at = now + math.floor(delay)
    t.state = 'ready'
    count_move('running', 'ready')
    save_task(id, t)
    enqueue(t, id)
  else
    t.state = 'failed'
    count_move('running', 'failed')
    save_task(id, t)
    redis.call('ZADD', k.finished, itoa(now), id)
    terminal = true
  end
  redis.call('HSET', k.results, id, 'E' .. reason)
  capacity_freed(running_before)
  return terminal
end
