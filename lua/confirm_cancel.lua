-- confirm_cancel.lua: the holder's function stopped because cancellation was requested.
--
--- @include settle
--- @include reports
--- @include tokens
--- @include attempt
--- @keys tasks results queue leases finished meta idle
--- @keys edges deps blocked blockedby propagating states history ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys wake joins
--
-- running (cancel_requested) -> cancelled, fenced by the token as complete.lua.
-- Pending dependents reached through required edges become blocked.
--
-- Writes tasks, leases, history, finished, meta, idle, and for dependents edges,
-- blocked, blockedby, propagating, queue.
-- Also writes states (the per-state index, for the records it writes),
--   history (the attempt it ends).
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua): one per slot it
-- frees when max_running was reached, one when a fairness key at its cap gets a slot
-- back, one per dependent that settling makes claimable; '<state> <id>' on ended for each
-- task it ends that a client waits for, whose waits entry it removes (lib/ended.lua).
-- 'cancel <version> <id>' on wake for each running child of a first-n join it makes ready
-- (lib/settle.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] id, ARGV[3] version, ARGV[4] attempt
--
-- Reply: { propagating jobs left, 'applied', 'duplicate' or 'stale' }.
-- Errors: CONFLICT not_requested <id>  the token is current but no cancel was requested.

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local now = now_ms(c)
  local running_before = running_count(c)
  local ended = nil
  local reply = each_report(2, 3, 1, function(id, t, _, version, attempt)
    if not t then return unapplied_outcome(id, version, attempt) end
    if t.cancel ~= 1 then error({ err = 'CONFLICT not_requested ' .. id }) end
    leave_running(id, t, now, 'cancelled', nil)
    end_task(c, id, t, 'cancelled', now)
    ended = id
    return 'applied'
  end)
  if not ended then
    reply[1] = redis.call('ZCARD', k.propagating)
    return reply
  end
  capacity_freed(c, running_before)
  reply[1] = settle_after_terminal(c, { ended }, now, budget)
  end_call(c)
  return reply
end)
