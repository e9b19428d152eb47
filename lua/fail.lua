-- fail.lua: report a batch of claims whose function raised.
--
-- running -> ready (a new attempt, due after backoff * 2^(attempt-1), capped
-- at one hour) while attempts remain and no cancellation was requested;
-- running -> failed otherwise, and then the pending dependents reached through
-- required edges become blocked (within the propagation budget). Fenced by the
-- token exactly as complete.lua.
--
-- KEYS[1..14] the namespace layout of lib/keys.lua. Writes tasks, queue, leases,
--   results, done, finished, meta, wake, and for dependents edges, blocked,
--   blockedby, propagating.
--
-- ARGV[1] n; then 4 values per report: id, version, attempt, error text
--
-- Reply: { propagating ids left, outcome 1, ..., outcome n }, each outcome
-- 'applied', 'duplicate' or 'stale'.
-- Publishes when a retry became the queue head or a capacity slot freed.
-- Cost: O(n log N) plus the dependents settled within the propagation budget.

return run(function()
  local n = to_int(ARGV[1], 'n')
  if #ARGV ~= 1 + 4 * n then error({ err = 'BADARG ARGV expected 4 values per report' }) end
  local now = now_ms()
  local reply, ended = { 0 }, {}
  for i = 1, n do
    local base = 1 + 4 * (i - 1)
    local id = ARGV[base + 1]
    local version, attempt = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
    local t = load_task(id)
    local outcome = token_outcome(t, id, version, attempt)
    if outcome == 'applied' then
      remember_token(id, version, attempt)
      if end_attempt_failed(id, t, now, ARGV[base + 4]) then ended[#ended + 1] = id end
    end
    reply[i + 1] = outcome
  end
  reply[1] = settle_after_terminal(ended, now)
  return reply
end)
