-- heartbeat.lua: extend the leases of a batch of claims.
--
--- @include reports
--- @keys tasks leases meta
--
-- No state changes. A token (id, version, attempt) that is still the running
-- attempt gets its lease deadline moved to now + lease; any other token is
-- reported lost so that its holder stops the function.
--
-- Reads tasks and meta (the test clock); writes leases.
--
-- Publishes: nothing.
--
-- ARGV[1] lease length in ms (>= 1)
-- ARGV[2] n (at most MAX_REPORTS_PER_CALL, 128); then 3 values per token: id, version,
--   attempt
--
-- Reply: { 0, status 1, ..., status n }, each status 1 current, 2 current and
-- cancellation requested, 0 lost (lease reaped, task replaced or finished).
-- Cost: O(n log N).

return run(function(c)
  local lease_ms = to_int(ARGV[1], 'lease_ms')
  if lease_ms < 1 then error({ err = 'BADARG lease_ms must be >= 1' }) end
  local n = reports_arg(ARGV[2])
  if #ARGV ~= 2 + 3 * n then error({ err = 'BADARG ARGV expected 3 values per token' }) end

  local deadline = itoa(now_ms(c) + lease_ms)
  return each_report(3, 3, n, function(id, t)
    if not t then return 0 end
    redis.call('ZADD', k.leases, 'XX', deadline, id)
    return 1 + t.cancel
  end)
end)
