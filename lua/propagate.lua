-- propagate.lua: settle more of the dependents of tasks that became terminal.
--
--- @include settle
--- @keys tasks results queue finished meta idle
--- @keys edges deps blocked blockedby propagating states ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys wake joins
--
-- pending -> ready (last awaited dependency settled) or pending -> blocked (a
-- required dependency failed, was cancelled or blocked), for the waiting edges of
-- the ids in the propagating set, oldest first, at most ARGV[1] edges per call.
-- See lib/settle.lua for why chunks stay correct while other calls run between them.
--
-- Reads and writes tasks, queue, finished, meta, idle, edges, blocked, blockedby,
-- propagating; a retry's cascade also writes deps and results.
-- Also writes states (the per-state index, for the records it writes).
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua), one per dependent
-- that settling makes claimable; '<state> <id>' on ended for each task it ends that a
-- client waits for, whose waits entry it removes (lib/ended.lua): a dependent it blocks.
-- 'cancel <version> <id>' on wake for each running child of a first-n join it makes ready
-- (lib/settle.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
--
-- Reply: { propagating jobs left, budget used (edges settled plus tasks visited) }.
-- Cost: O(budget log N).

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local used = propagate(c, budget, now_ms(c))
  end_call(c)
  return { redis.call('ZCARD', k.propagating), used }
end)
