-- cancel.lua: cancel one task.
--
--- @include settle
--- @keys tasks results queue finished meta wake idle
--- @keys edges deps blocked blockedby propagating states ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys joins
--
-- pending / ready -> cancelled, atomically: a claim racing with it either ran
-- first (the task is running) or will find it cancelled and drop its entry.
-- The queue entry is left for the claim script to drop. Pending dependents of a
-- cancelled task become blocked (settled within the propagation budget).
-- running: cancel_requested is recorded and published as 'cancel <version> <id>',
-- so the holder learns it at once (and from its next heartbeat in any case).
-- Terminal: nothing changes.
--
-- Writes tasks, finished, meta, wake (the cancel notice), idle, and for dependents
-- edges, blocked, blockedby, propagating, queue.
-- Also writes states (the per-state index, for the records it writes).
--
-- Publishes: 'cancel <version> <id>' on wake when it asks a running task to stop; 'ready'
-- on the channels of idle workers (lib/idle.lua), one per dependent that settling makes
-- claimable; '<state> <id>' on ended for each task it ends that a client waits for, whose
-- waits entry it removes (lib/ended.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] task id
--
-- Reply: { propagating jobs left, state after the call ('cancelled', 'running' or the
--          terminal state) }.
-- Errors: NOTFOUND <id>.
-- Cost: O(1) plus the dependents settled within the propagation budget.

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local id = check_id(ARGV[2], 'task_id')
  local t = load_given(id)
  if not t then error({ err = 'NOTFOUND ' .. id }) end
  local now = now_ms(c)
  local left
  if t.state == 'pending' or t.state == 'ready' then
    end_task(c, id, t, 'cancelled', now)
    left = settle_after_terminal(c, { id }, now, budget)
  else
    if t.state == 'running' and t.cancel == 0 then
      t.cancel = 1
      save_task(id, t)
      publish(k.wake, string.format('cancel %d ', t.version) .. id)
    end
    left = redis.call('ZCARD', k.propagating)
  end
  end_call(c)
  return { left, t.state }
end)
