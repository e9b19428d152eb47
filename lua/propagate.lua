-- propagate.lua: settle more of the dependents of tasks that became terminal.
--
-- pending -> ready (last awaited dependency settled) or pending -> blocked (a
-- required dependency failed, was cancelled or blocked), for the waiting edges of
-- the ids in the propagating set, oldest first, at most ARGV[1] edges per call.
-- See lib/graph.lua for why chunks stay correct while other calls run between them.
--
-- KEYS[1..14] the namespace layout of lib/keys.lua. Writes tasks, queue, finished,
--   meta, wake, edges, blocked, blockedby, propagating.
--
-- ARGV[1] budget: the most edges to settle in this call (>= 1)
--
-- Reply: { edges settled, propagating ids left }.
-- Cost: O(budget log N).

return run(function()
  local budget = to_int(ARGV[1], 'budget')
  if budget < 1 then error({ err = 'BADARG budget must be >= 1' }) end
  local used = propagate(budget, now_ms())
  return { used, redis.call('ZCARD', k.propagating) }
end)
