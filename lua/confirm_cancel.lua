-- confirm_cancel.lua: the holder's function stopped because cancellation was requested.
--
--- @include settle
--- @include tokens
--- @include history
--- @keys tasks results queue leases finished meta idle
--- @keys edges deps blocked blockedby propagating states history ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--
-- running (cancel_requested) -> cancelled, fenced by the token as complete.lua.
-- Pending dependents reached through required edges become blocked.
--
-- Writes tasks, leases, history, finished, meta, idle, and for dependents edges,
-- blocked, blockedby, propagating, queue.
-- Also writes states (the per-state index, for the records it writes),
--   history (the attempt it ends).
--
-- waits, ended: each task it ends that a client waits for loses its waits entry and
-- is published as '<state> <id>' on ended (lib/ended.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] id, ARGV[3] version, ARGV[4] attempt
--
-- Reply: { propagating jobs left, 'applied', 'duplicate' or 'stale' }.
-- Errors: CONFLICT not_requested <id>  the token is current but no cancel was requested.

return run(function()
  local budget = budget_arg(ARGV[1])
  local id = ARGV[2]
  local version, attempt = tonumber(ARGV[3]), tonumber(ARGV[4])
  local t = load_task(id)
  local outcome = token_outcome(t, id, version, attempt)
  if outcome ~= 'applied' then return { redis.call('ZCARD', k.propagating), outcome } end
  if t.cancel ~= 1 then error({ err = 'CONFLICT not_requested ' .. id }) end

  local now = now_ms()
  local running_before = running_count()
  record_attempt(id, t, now, 'cancelled', nil)
  redis.call('ZREM', k.leases, id)
  count_move('running', 'cancelled')
  t.state = 'cancelled'
  t.worker = ''
  t.updated = now
  save_task(id, t)
  redis.call('ZADD', k.finished, now, id)
  capacity_freed(running_before)
  return { settle_after_terminal({ id }, now, budget), outcome }
end)
