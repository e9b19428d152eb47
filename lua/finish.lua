-- finish.lua: report a batch of claims as succeeded, then claim the next tasks, in one call.
--
--- @include succeed
--- @include claiming
--- @keys tasks results queue leases finished meta idle
--- @keys edges deps blocked blockedby propagating states history minutes ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys wake joins
--- @keys payloads claims fires deadlines costs
--
-- complete.lua's transition for the reports, then claim.lua's for the same worker, as
-- one atomic step: a worker whose slots a finished task frees gets its next tasks with
-- the report's reply, one round trip per task at any concurrency. Each half is fenced,
-- checked and bounded exactly as its own script (their headers say how); the reports come
-- first, so the slots they free and the dependents they release can be claimed at once.
-- Every argument of both halves is checked before anything is written.
--
-- Writes and reads what complete.lua and claim.lua do.
--
-- Publishes: what complete.lua publishes, then what claim.lua publishes: 'ready' on the
-- channels of idle workers (lib/idle.lua) for the slots and dependents the reports free and
-- for one more idle worker when the claim filled its batch while more is due;
-- '<state> <id>' on ended for each task either half ends that a client waits for
-- (lib/ended.lua); 'cancel <version> <id>' on wake for each running child of a first-n join
-- a report makes ready (lib/settle.lua).
--
-- ARGV[1] propagation budget (as complete.lua)
-- ARGV[2] n, the number of reports (at most MAX_REPORTS_PER_CALL, 128); then 4 values per
--   report: id, version, attempt, result bytes ('' for none)
-- ARGV[3 + 4n] .. ARGV[9 + 4n]: claim.lua's ARGV[1..7] (worker id, the most tasks to claim,
--   lease ms, the most stale entries to drop, then optionally the wake channel, the idle
--   wait in ms and a request id)
--
-- Reply: { propagating jobs left, outcome * n, then claim.lua's reply after its first value:
--   claimed, reason, delay_us, (id, version, attempt, priority, run_at_ms, payload) * claimed,
--   keys }; each outcome 'applied', 'duplicate' or 'stale'. The same call sent again (the
--   same request id) gets 'duplicate' for its reports and the same tasks.
-- Errors (nothing written): BADARG as complete.lua's and claim.lua's, and ARGV length.
-- Cost: complete.lua's plus claim.lua's.

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local n = reports_arg(ARGV[2])
  local at = 3 + 4 * n
  if #ARGV < at + 3 or #ARGV > at + 6 then
    error({ err = 'BADARG ARGV expected 4 values per report, then 4 to 7 claim values' })
  end
  local wanted = claim_args(ARGV, at)
  local reply = succeed_reports(c, budget, n)
  local claimed = claim_now(c, wanted)
  -- Each half counts the propagation jobs left when it ends, the claim only when it
  -- expired a task: the larger is the count now.
  reply[1] = math.max(reply[1], claimed[1])
  for i = 2, #claimed do reply[#reply + 1] = claimed[i] end
  end_call(c)
  return reply
end)
