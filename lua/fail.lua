-- fail.lua: report a batch of claims whose function raised.
--
--- @include settle
--- @include reports
--- @include tokens
--- @include attempt
--- @keys tasks results queue leases finished meta idle
--- @keys edges deps blocked blockedby propagating states history minutes ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys wake joins
--
-- running -> ready (a new attempt, due after backoff * 2^(attempt-1), capped
-- at ARGV[2]) while attempts remain and no cancellation was requested;
-- running -> failed otherwise, and then the pending dependents reached through
-- required edges become blocked (within the propagation budget). Fenced by the
-- token exactly as complete.lua.
--
-- Writes tasks, queue, leases, results, history, finished, meta, idle, and for
-- dependents edges, blocked, blockedby, propagating.
-- Also writes states (the per-state index, for the records it writes),
--   history (the attempt it ends),
--   minutes (succeeded / failed attempts).
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua): one per retry due
-- now (or one for a retry that became the queue head), one per slot it frees when
-- max_running was reached, one when a fairness key at its cap gets a slot back, one per
-- dependent that settling makes claimable; '<state> <id>' on ended for each task it ends
-- that a client waits for, whose waits entry it removes (lib/ended.lua).
-- 'cancel <version> <id>' on wake for each running child of a first-n join it makes ready
-- (lib/settle.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] the longest wait between attempts in ms (>= 0; distsched sends 3600000)
-- ARGV[3] n (at most MAX_REPORTS_PER_CALL, 128); then 4 values per report: id, version,
--   attempt, error text (at most MAX_ERROR_BYTES, 4096 bytes: a worker cuts longer ones)
--
-- Reply: { propagating jobs left, outcome 1, ..., outcome n }, each outcome
-- 'applied', 'duplicate' or 'stale'.
-- Errors (nothing written): BADARG n ... (over MAX_REPORTS_PER_CALL), BADARG error of <id>
--   ... (an error text over MAX_ERROR_BYTES), BADARG budget, backoff_cap, ARGV ...
-- Cost: O(n log N) plus the dependents settled within the propagation budget.

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local cap_ms = to_int(ARGV[2], 'backoff_cap')
  if cap_ms < 0 then error({ err = 'BADARG backoff_cap must be >= 0' }) end
  local n = reports_arg(ARGV[3])
  if #ARGV ~= 3 + 4 * n then error({ err = 'BADARG ARGV expected 4 values per report' }) end
  for i = 1, n do
    local text = ARGV[3 + 4 * i]
    if #text > LIMITS.MAX_ERROR_BYTES then
      error({ err = string.format('BADARG error of %s is %d bytes, limit %d (MAX_ERROR_BYTES)',
        ARGV[4 * i], #text, LIMITS.MAX_ERROR_BYTES) })
    end
  end
  local now = now_ms(c)
  local ended, applied = {}, 0
  local reply = each_report(4, 4, n, function(id, t, at, version, attempt)
    if not t then return unapplied_outcome(id, version, attempt) end
    applied = applied + 1
    if end_attempt_failed(c, id, t, now, ARGV[at], cap_ms, 'failed') then
      ended[#ended + 1] = id
    end
    return 'applied'
  end)
  count_minute('f', applied, now)
  reply[1] = settle_after_terminal(c, ended, now, budget)
  end_call(c)
  return reply
end)
