-- release.lua: hand back claims whose function never started (worker shutdown).
--
--- @include settle
--- @include reports
--- @include attempt
--- @keys tasks results queue leases finished meta idle
--- @keys edges deps blocked blockedby propagating states history ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys wake joins
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
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua): one per task handed
-- back due now (a delayed one only when it became the queue head), one per slot it frees
-- when max_running was reached, one when a fairness key at its cap gets a slot back, one
-- per dependent that settling makes claimable; '<state> <id>' on ended for each task it
-- ends that a client waits for, whose waits entry it removes (lib/ended.lua): a task it
-- ends cancelled.
-- 'cancel <version> <id>' on wake for each running child of a first-n join it makes ready
-- (lib/settle.lua).
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

return run(function(c)
  repair_meta(c)
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
  local now = now_ms(c)
  local running_before = running_count(c)
  local ended, released = {}, 0
  local reply = each_report(3, 3, n, function(id, t)
    if not t then return 0 end
    leave_running(id, t, now, 'handed_back', nil)
    t.attempt = t.attempt - 1
    if t.cancel == 1 then
      end_task(c, id, t, 'cancelled', now)
      ended[#ended + 1] = id
    else
      back_to_ready(c, id, t)
      if delay > 0 and t.run_at < now + delay and fair_on(c) then
        enqueue(c, { run_at = now + delay, priority = t.priority, version = t.version }, id)
      elseif delay > 0 and t.run_at < now + delay then
        local member = queue_member(t, id)
        redis.call('ZADD', k.queue, now + delay, member)
        note_enqueued(c, member, now + delay)
      else
        enqueue(c, t, id)
      end
    end
    released = released + 1
    return 1
  end)
  if released > 0 then
    capacity_freed(c, running_before)
  end
  reply[1] = settle_after_terminal(c, ended, now, budget)
  end_call(c)
  return reply
end)
