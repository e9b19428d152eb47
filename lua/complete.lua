-- complete.lua: report a batch of claims as succeeded.
--
--- @include succeed
--- @keys tasks results queue leases finished meta idle
--- @keys edges deps blocked blockedby propagating states history minutes ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys wake joins
--
-- running -> succeeded, fenced by the token (id, version, attempt): only the
-- current running attempt is applied. A token already applied before gets
-- 'duplicate'; any other token gets 'stale'. Neither changes anything, so a
-- late or repeated report never releases dependents twice. A cancellation
-- request made while it ran stays on the record. Dependents waiting on the
-- task are released (ready when nothing else is awaited), within the
-- propagation budget; the rest is settled by propagate.lua.
--
-- Writes tasks, leases, results (the result, or removes an earlier attempt's error),
-- history, finished, meta, idle, and for dependents edges, blocked, blockedby, queue,
-- propagating.
-- Also writes states (the per-state index, for the records it writes),
--   history (the attempt it ends),
--   minutes (succeeded / failed attempts).
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
-- ARGV[2] n (at most MAX_REPORTS_PER_CALL, 128); then 4 values per report: id, version,
--   attempt, result bytes ('' for none)
--
-- Reply: { propagating jobs left, outcome 1, ..., outcome n }, each outcome
-- 'applied', 'duplicate' or 'stale'.
-- Cost: O(n log N) plus the dependents settled within the propagation budget.

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local n = reports_arg(ARGV[2])
  if #ARGV ~= 2 + 4 * n then error({ err = 'BADARG ARGV expected 4 values per report' }) end
  local reply = succeed_reports(c, budget, n)
  end_call(c)
  return reply
end)
