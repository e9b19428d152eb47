-- lib/reports.lua: the reports of a batch (complete, fail, confirm_cancel, heartbeat,
-- release), each fenced by its token (id, version, attempt).
--
--- @include run
--- @include limits
--- @include record

-- n of a report call: at most MAX_REPORTS_PER_CALL.
local function reports_arg(value)
  local n = to_int(value, 'n')
  if n < 0 or n > LIMITS.MAX_REPORTS_PER_CALL then
    error({ err = 'BADARG n must be in [0, ' .. LIMITS.MAX_REPORTS_PER_CALL
      .. '] reports per call (MAX_REPORTS_PER_CALL)' })
  end
  return n
end

-- The reply to n reports from ARGV[first], `width` values each: the token (id, version,
-- attempt), then the report's own values. For each, fn(id, t, at, version, attempt) gives
-- the report's element of the reply: t is the task's record when the token is its current
-- running attempt, else nil (the report applies to nothing: a record that cannot be read
-- counts as absent), and ARGV[at] is the report's first own value. The reply's first
-- element is 0, for the caller to set.
local function each_report(first, width, n, fn)
  local reply = { 0 }
  for i = 1, n do
    local base = first + width * (i - 1)
    local id = ARGV[base]
    local version, attempt = tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2])
    local t = load_task(id)
    if t and not (t.state == 'running' and t.version == version and t.attempt == attempt) then
      t = nil
    end
    reply[i + 1] = fn(id, t, base + 3, version, attempt)
  end
  return reply
end
