-- expire.lua: end queued tasks whose deadline (server clock) has passed.
--
--- @include settle
--- @include deadline
--- @keys tasks results queue finished meta idle
--- @keys edges deps blocked blockedby propagating states deadlines
--- @keys ranked waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys wake joins
--
-- pending / ready -> cancelled, with the error text 'expired: not started by its
-- deadline' in results; pending dependents become blocked (settled within the
-- propagation budget), with this task as the root of their block cause. Entries of
-- versions that are no longer queued (started, replaced, ended) are only removed.
-- The workers' housekeeping calls it; claim.lua expires what it pops by itself.
-- Waitpoints (lib/deadline.lua, waitpoint.lua): pending -> failed, with the error text
-- 'timed out waiting for completion', when the member of one whose timeout passed is
-- reached; its pending dependents become blocked with it as root. The member of a
-- waitpoint not timed out is scored again for its next look, that of a task that is no
-- waitpoint any more removed.
--
-- Writes tasks, results, finished, meta, deadlines, idle, and for dependents edges,
-- blocked, blockedby, propagating, queue.
-- Also writes states (the per-state index, for the records it writes), and waits (the
-- entry of a waited-for task it ends).
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua), one per dependent
-- that settling makes claimable; '<state> <id>' on ended for each task it ends that a
-- client waits for, whose waits entry it removes (lib/ended.lua): a task it expires, a
-- waitpoint that timed out.
-- 'cancel <version> <id>' on wake for each running child of a first-n join it makes ready
-- (lib/settle.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] the most deadlines entries to handle in this call (>= 1)
--
-- Reply: { propagating jobs left, tasks expired (waitpoints timed out included) }.
-- Cost: O(m log N) for m entries handled, plus the propagation budget.

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local limit = to_int(ARGV[2], 'limit')
  if limit < 1 then error({ err = 'BADARG limit must be >= 1' }) end
  local now = now_ms(c)
  local members = redis.call('ZRANGEBYSCORE', k.deadlines, '-inf', now, 'LIMIT', 0, limit)
  local expired = 0
  for _, member in ipairs(members) do
    if string.sub(member, 1, 1) == 'w' then
      -- A waitpoint's timer (lib/deadline.lua): timed out, or looked at again later.
      if check_waitpoint(c, string.sub(member, 2), now) then expired = expired + 1 end
    else
      local version, id = parse_deadline_member(member)
      local t = version and not id_problem(id) and load_task(id)
      if t and t.version == version and (t.state == 'pending' or t.state == 'ready') then
        expire_task(c, id, t, now)
        expired = expired + 1
      else
        redis.call('ZREM', k.deadlines, member)
      end
    end
  end
  local left = settle_after_terminal(c, {}, now, budget)
  end_call(c)
  return { left, expired }
end)
