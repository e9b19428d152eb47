-- reap.lua: handle leases whose deadline (server clock) has passed.
--
-- running -> ready (a new attempt after backoff) while attempts remain and no
-- cancellation was requested, running -> failed with reason 'lease expired'
-- otherwise (then its pending dependents become blocked). The old holder's
-- token is then stale: its late report changes nothing.
--
-- KEYS[1..14] the namespace layout of lib/keys.lua. Writes tasks, queue, leases,
--   results, finished, meta, wake, and for dependents edges, blocked, blockedby,
--   propagating.
--
-- ARGV[1] the most leases to handle in this call (>= 1)
-- ARGV[2] optional task id: expire this task's lease now, whatever its deadline
--
-- Reply: { leases handled, propagating ids left }.
-- Cost: O(m log N) for m handled leases, plus the propagation budget.

return run(function()
  local limit = to_int(ARGV[1], 'limit')
  if limit < 1 then error({ err = 'BADARG limit must be >= 1' }) end
  local now = now_ms()
  local ids
  if ARGV[2] and ARGV[2] ~= '' then
    ids = {}
    if redis.call('ZSCORE', k.leases, ARGV[2]) then ids[1] = ARGV[2] end
  else
    ids = redis.call('ZRANGEBYSCORE', k.leases, '-inf', now, 'LIMIT', 0, limit)
  end
  local handled, ended = 0, {}
  for _, id in ipairs(ids) do
    local t = load_task(id)
    if t and t.state == 'running' then
      if end_attempt_failed(id, t, now, 'lease expired') then ended[#ended + 1] = id end
      handled = handled + 1
    else
      -- A lease without a running record cannot be produced by the scripts; drop it.
      redis.call('ZREM', k.leases, id)
    end
  end
  return { handled, settle_after_terminal(ended, now) }
end)
