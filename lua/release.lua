-- release.lua: hand back claims whose function never started (worker shutdown).
--
--- @include settle
--- @include history
--- @keys tasks results queue leases finished meta idle
--- @keys edges deps blocked blockedby propagating states history ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--
-- running -> ready with the attempt given back (no attempt spent), at its own
-- run_at and priority; running -> cancelled instead when cancellation was
-- requested meanwhile (the function never ran; dependents become blocked).
-- Fenced by the token: a stale token changes nothing.
--
-- Writes tasks, queue, leases, finished, meta, idle, and for dependents edges,
-- blocked, blockedby, propagating.
-- Also writes states (the per-state index, for the records it writes),
--   history (the attempt it ends).
--
-- waits, ended: each task it ends that a client waits for loses its waits entry and
-- is published as '<state> <id>' on ended (lib/ended.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] n (at most MAX_REPORTS_PER_CALL, 128); then 3 values per token: id, version,
--   attempt
-- ARGV[3 + 3n] optional delay_ms (>= 0): the tasks become due again no sooner than this
--   long from now (the queue entry's score; their run_at is kept). A delayed hand-back
--   wakes no idle worker unless it became the queue head.
--
-- Reply: { propagating jobs left, then per token 1 handed back (ready, or cancelled)
-- or 0 stale (left as it is) }.
-- Wakes one idle worker per task handed back due now (lib/idle.lua).

return run(function()
  local budget = budget_arg(ARGV[1])
  local n = reports_arg(ARGV[2])
  -- An optional last value, delay_ms: the handed-back tasks become due again no sooner
  -- than that long from now (their run_at is kept), so that a worker which cannot run
  -- them does not claim them straight back.
  local delay = 0
  if #ARGV == 3 + 3 * n then
    delay = to_int(ARGV[#ARGV], 'delay_ms')
    if delay < 0 then error({ err = 'BADARG delay_ms must be >= 0' }) end
  elseif #ARGV ~= 2 + 3 * n then
    error({ err = 'BADARG ARGV expected 3 values per token' })
  end
  local now = now_ms()
  local running_before = running_count()
  local reply, ended = { 0 }, {}
  local released = 0
  for i = 1, n do
    local base = 2 + 3 * (i - 1)
    local id = ARGV[base + 1]
    local t = load_task(id)
    if t and t.state == 'running' and t.version == tonumber(ARGV[base + 2])
        and t.attempt == tonumber(ARGV[base + 3]) then
      redis.call('ZREM', k.leases, id)
      record_attempt(id, t, now, 'handed_back', nil)
      t.attempt = t.attempt - 1
      t.worker = ''
      t.updated = now
      if t.cancel == 1 then
        count_move('running', 'cancelled')
        t.state = 'cancelled'
        redis.call('ZADD', k.finished, now, id)
        ended[#ended + 1] = id
      else
        count_move('running', 'ready')
        t.state = 'ready'
        if delay > 0 and t.run_at < now + delay and fair_on() then
          enqueue({ run_at = now + delay, priority = t.priority, version = t.version }, id)
        elseif delay > 0 and t.run_at < now + delay then
          local member = queue_member(t, id)
          redis.call('ZADD', k.queue, now + delay, member)
          enqueued[member] = now + delay
        else
          enqueue(t, id)
        end
      end
      save_task(id, t)
      released = released + 1
      reply[i + 1] = 1
    else
      reply[i + 1] = 0
    end
  end
  if released > 0 then
    capacity_freed(running_before)
  end
  reply[1] = settle_after_terminal(ended, now, budget)
  return reply
end)
