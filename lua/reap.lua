-- reap.lua: handle leases whose deadline (server clock) has passed.
--
--- @include settle
--- @include attempt
--- @keys tasks results queue leases finished meta idle
--- @keys edges deps blocked blockedby propagating states history minutes ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys wake joins
--
-- running -> ready (a new attempt after backoff) while attempts remain and no
-- cancellation was requested, running -> failed with reason 'lease expired'
-- otherwise (then its pending dependents become blocked). The old holder's
-- token is then stale: its late report changes nothing.
--
-- Writes tasks, queue, leases, results, finished, meta, idle, and for dependents
-- edges, blocked, blockedby, propagating.
-- Also writes states (the per-state index, for the records it writes),
--   history (the attempt it ends),
--   minutes (succeeded / failed attempts).
--
-- waits, ended: each task it ends that a client waits for loses its waits entry and
-- is published as '<state> <id>' on ended (lib/ended.lua).
-- Also drops up to ARGV[3] waits entries whose time has passed (their client gave
-- up), when it handles every expired lease (ARGV[4] empty).
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
-- ARGV[3] the most leases to handle in this call (>= 1)
-- ARGV[4] task id to expire now whatever its deadline, or '' for every expired lease
--
-- Reply: { propagating jobs left, leases handled }.
-- Cost: O(m log N) for m handled leases, plus the propagation budget.

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local cap_ms = to_int(ARGV[2], 'backoff_cap')
  if cap_ms < 0 then error({ err = 'BADARG backoff_cap must be >= 0' }) end
  local limit = to_int(ARGV[3], 'limit')
  if limit < 1 then error({ err = 'BADARG limit must be >= 1' }) end
  local now = now_ms(c)
  local ids
  if ARGV[4] and ARGV[4] ~= '' then
    ids = {}
    if redis.call('ZSCORE', k.leases, ARGV[4]) then ids[1] = ARGV[4] end
  else
    ids = redis.call('ZRANGEBYSCORE', k.leases, '-inf', now, 'LIMIT', 0, limit)
  end
  if not (ARGV[4] and ARGV[4] ~= '') then
    local gone = redis.call('ZRANGE', k.waits, '-inf', '(' .. now, 'BYSCORE', 'LIMIT', 0, limit)
    if #gone > 0 then redis.call('ZREM', k.waits, unpack(gone)) end
  end
  local handled, ended = 0, {}
  for _, id in ipairs(ids) do
    local t = load_task(id)
    if t and t.state == 'running' then
      if end_attempt_failed(c, id, t, now, 'lease expired', cap_ms, 'lost') then
        ended[#ended + 1] = id
      end
      handled = handled + 1
    else
      -- A lease without a running record cannot be produced by the scripts; drop it.
      redis.call('ZREM', k.leases, id)
    end
  end
  count_minute('f', handled, now)
  local left = settle_after_terminal(c, ended, now, budget)
  end_call(c)
  return { left, handled }
end)
