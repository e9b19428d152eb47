-- retry.lua: a new version of a failed, cancelled or blocked task, dependencies re-checked.
--
--- @include settle
--- @keys tasks results queue finished meta idle
--- @keys edges deps blocked blockedby propagating states ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys wake joins
--
-- failed / cancelled / blocked -> ready, pending or blocked (as schedule.lua
-- decides from its dependencies), with attempt 0 and the same payload, run_at,
-- priority, max_attempts, backoff and dependency list. With cascade, every task
-- this one blocked before the retry (blocked with it as root, or, when it was itself
-- blocked, blocked through it) gets a new version too, in bounded chunks run by propagate.lua (the first one in this call): tasks
-- of the cascade count as pending for each other, so they return to pending
-- (tasks that would then wait on each other in a cycle stay or become blocked).
--
-- Writes tasks, results, queue, finished, meta, idle, edges, deps, blocked, blockedby,
-- propagating.
-- Also writes states (the per-state index, for the records it writes).
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua): one when the new
-- version is due now, one per dependent that settling makes claimable; '<state> <id>' on
-- ended for each task it ends that a client waits for, whose waits entry it removes
-- (lib/ended.lua): a version blocked at once.
-- 'cancel <version> <id>' on wake for each running child of a first-n join it makes ready
-- (lib/settle.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] task id
-- ARGV[3] cascade: '1' or '0'
--
-- Reply: { propagating jobs left, new version of the task }.
-- Errors: NOTFOUND <id>; CONFLICT state <state> <id> (not failed, cancelled or blocked);
--   BUSY <id> (still telling its dependents that it ended; settle with propagate.lua).
-- Cost: O(deps + log N), plus the propagation budget for the cascade.

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local id = check_id(ARGV[2], 'task_id')
  local cascade = ARGV[3] == '1'
  local t = load_given(id)
  if not t then error({ err = 'NOTFOUND ' .. id }) end
  if t.state ~= 'failed' and t.state ~= 'cancelled' and t.state ~= 'blocked' then
    error({ err = 'CONFLICT state ' .. t.state .. ' ' .. id })
  end
  busy_check(id)
  -- The tasks this one blocked share its root cause: itself, or its own root if blocked.
  local root = id
  if t.state == 'blocked' then root = block_cause(id) or id end
  local now = now_ms(c)
  local params = { run_at = t.run_at, priority = t.priority, max_attempts = t.max_attempts,
                   backoff = t.backoff_ms }
  local deps = decode_deps(redis.call('HGET', k.deps, id))
  local version = write_version(c, id, t, params, deps, now, record_state)
  if cascade then
    local prefix = id_prefix(root)
    local any = redis.call('ZRANGEBYLEX', k.blockedby, '[' .. prefix, '(' .. prefix .. '\255', 'LIMIT', 0, 1)
    if #any > 0 then
      redis.call('HSET', k.meta, 'cascade:' .. id, string.format('%d|', version) .. prefix)
      add_job('r' .. id)
    end
  end
  local left = settle_after_terminal(c, {}, now, budget)
  end_call(c)
  return { left, version }
end)
