-- confirm_cancel.lua: the holder's function stopped because cancellation was requested.
--
-- running (cancel_requested) -> cancelled, fenced by the token as complete.lua.
-- Pending dependents reached through required edges become blocked.
--
-- KEYS[1..14] the namespace layout of lib/keys.lua. Writes tasks, leases, done,
--   finished, meta, wake, and for dependents edges, blocked, blockedby, propagating.
--
-- ARGV[1] id, ARGV[2] version, ARGV[3] attempt
--
-- Reply: { 'applied', 'duplicate' or 'stale', propagating ids left }.
-- Errors: CONFLICT not_requested <id>  the token is current but no cancel was requested.

return run(function()
  local id = ARGV[1]
  local version, attempt = tonumber(ARGV[2]), tonumber(ARGV[3])
  local t = load_task(id)
  local outcome = token_outcome(t, id, version, attempt)
  if outcome ~= 'applied' then return { outcome, redis.call('ZCARD', k.propagating) } end
  if t.cancel ~= 1 then error({ err = 'CONFLICT not_requested ' .. id }) end

  local now = now_ms()
  local running_before = running_count()
  redis.call('ZREM', k.leases, id)
  count_move('running', 'cancelled')
  t.state = 'cancelled'
  t.worker = ''
  t.updated = now
  save_task(id, t)
  remember_token(id, version, attempt)
  redis.call('ZADD', k.finished, now, id)
  capacity_freed(running_before)
  return { outcome, settle_after_terminal({ id }, now) }
end)
