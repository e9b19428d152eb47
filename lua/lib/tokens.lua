-- lib/tokens.lua: a report that does not apply, told apart as duplicate or stale.
--
--- @include history
--
-- A report applied before is told apart from a stale one by the task's history
-- (lib/history.lua): every applied report ends its attempt there, as succeeded
-- (complete), failed (fail) or cancelled (confirm_cancel); an attempt ended by no
-- report is lost (its lease expired) or handed_back. The history keeps the last ten
-- attempts, so a repeated report is recognised as long as its attempt is among them.
-- Earlier versions kept the applied tokens in a done hash of their own: two more
-- commands per report, and an entry per ended task; scripts no longer write it.

local REPORTED = { succeeded = true, failed = true, cancelled = true }

local function token_applied(id, version, attempt)
  local raw = redis.call('HGET', k.history, id)
  if not raw then return false end
  local head = string.format('%d|%d|', version, attempt)
  for _, start in ipairs((history_starts(raw))) do
    if string.sub(raw, start, start + #head - 1) == head then
      local outcome = string.match(raw, '^%d+|%d+|%-?%d+|%-?%d+|([%l_]+)|', start)
      if REPORTED[outcome] then return true end
    end
  end
  return false
end

-- The outcome of a report whose token is not the task's current running attempt
-- (lib/reports.lua): 'duplicate' when it was applied before, else 'stale'.
local function unapplied_outcome(id, version, attempt)
  if token_applied(id, version, attempt) then return 'duplicate' end
  return 'stale'
end
