-- heartbeat.lua: extend the leases of a batch of claims.
--
--- @include record
--- @keys tasks leases
--
-- No state changes. A token (id, version, attempt) that is still the running
-- attempt gets its lease deadline moved to now + lease; any other token is
-- reported lost so that its holder stops the function.
--
-- Reads tasks; writes leases.
--
-- ARGV[1] lease length in ms (>= 1)
-- ARGV[2] n (at most MAX_REPORTS_PER_CALL, 128); then 3 values per token: id, version,
--   attempt
--
-- Reply: { 0, status 1, ..., status n }, each status 1 current, 2 current and
-- cancellation requested, 0 lost (lease reaped, task replaced or finished).
-- Cost: O(n log N).

return run(function()
  local lease_ms = to_int(ARGV[1], 'lease_ms')
  if lease_ms < 1 then error({ err = 'BADARG lease_ms must be >= 1' }) end
  local n = reports_arg(ARGV[2])
  if #ARGV ~= 2 + 3 * n then error({ err = 'BADARG ARGV expected 3 values per token' }) end

  local deadline = itoa(now_ms() + lease_ms)
  local reply = { 0 }
  for i = 1, n do
    local base = 2 + 3 * (i - 1)
    local id = ARGV[base + 1]
    local t = load_task(id)
    if t and t.state == 'running' and t.version == tonumber(ARGV[base + 2])
        and t.attempt == tonumber(ARGV[base + 3]) then
      redis.call('ZADD', k.leases, 'XX', deadline, id)
      reply[i + 1] = 1 + t.cancel
    else
      reply[i + 1] = 0
    end
  end
  return reply
end)
