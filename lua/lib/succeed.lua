-- lib/succeed.lua: a batch of claims reported as succeeded: complete.lua's transition, as a
-- function that a script which also claims (finish.lua) calls before its claim.
--
--- @include settle
--- @include reports
--- @include tokens
--- @include attempt
--
-- succeed_reports(c, budget, n): the n reports are ARGV[3 .. 2 + 4n], four values each, as
-- complete.lua documents (its caller's ARGV opens the same way); returns
-- { propagating jobs left, outcome * n }. The caller mends meta first (repair_meta) and ends
-- the call (end_call) after.

local function succeed_reports(c, budget, n)
  local now = now_ms(c)
  local running_before = running_count(c)
  local ended = {}
  local reply = each_report(3, 4, n, function(id, t, at, version, attempt)
    if not t then return unapplied_outcome(id, version, attempt) end
    leave_running(id, t, now, 'succeeded', nil)
    end_task(c, id, t, 'succeeded', now)
    if ARGV[at] ~= '' then
      redis.call('HSET', k.results, id, 'R' .. ARGV[at])
    elseif t.attempt > 1 then
      -- An earlier attempt's error must not show on a task that succeeded. A first
      -- attempt has none: every new version starts without a result (write_version).
      redis.call('HDEL', k.results, id)
    end
    ended[#ended + 1] = id
    return 'applied'
  end)
  capacity_freed(c, running_before)
  count_minute('s', #ended, now)
  reply[1] = settle_after_terminal(c, ended, now, budget)
  return reply
end
