-- complete.lua: report a batch of claims as succeeded.
--
--- @include settle
--- @include tokens
--- @include history
--- @keys tasks results queue leases finished meta idle
--- @keys edges deps blocked blockedby propagating states history minutes ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
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
-- waits, ended: each task it ends that a client waits for loses its waits entry and
-- is published as '<state> <id>' on ended (lib/ended.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] n (at most MAX_REPORTS_PER_CALL, 128); then 4 values per report: id, version,
--   attempt, result bytes ('' for none)
--
-- Reply: { propagating jobs left, outcome 1, ..., outcome n }, each outcome
-- 'applied', 'duplicate' or 'stale'.
-- Publishes 'capacity' when max_running was reached and a slot freed.
-- Cost: O(n log N) plus the dependents settled within the propagation budget.

return run(function()
  local budget = budget_arg(ARGV[1])
  local n = reports_arg(ARGV[2])
  if #ARGV ~= 2 + 4 * n then error({ err = 'BADARG ARGV expected 4 values per report' }) end
  local now = now_ms()
  local running_before = running_count()
  local reply, ended, applied = { 0 }, {}, 0
  for i = 1, n do
    local base = 2 + 4 * (i - 1)
    local id = ARGV[base + 1]
    local version, attempt = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
    local t = load_task(id)
    local outcome = token_outcome(t, id, version, attempt)
    if outcome == 'applied' then
      applied = applied + 1
      record_attempt(id, t, now, 'succeeded', nil)
      redis.call('ZREM', k.leases, id)
      count_move('running', 'succeeded')
      t.state = 'succeeded'
      t.worker = ''
      t.updated = now
      save_task(id, t)
      if ARGV[base + 4] ~= '' then
        redis.call('HSET', k.results, id, 'R' .. ARGV[base + 4])
      elseif t.attempt > 1 then
        -- An earlier attempt's error must not show on a task that succeeded. A first
        -- attempt has none: every new version starts without a result (write_version).
        redis.call('HDEL', k.results, id)
      end
      redis.call('ZADD', k.finished, now_text(), id)
      ended[#ended + 1] = id
    end
    reply[i + 1] = outcome
  end
  capacity_freed(running_before)
  count_minute('s', applied, now)
  reply[1] = settle_after_terminal(ended, now, budget)
  return reply
end)
