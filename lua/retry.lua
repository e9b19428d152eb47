-- retry.lua: a new version of a failed, cancelled or blocked task, dependencies re-checked.
--
-- failed / cancelled / blocked -> ready, pending or blocked (as schedule.lua
-- decides from its dependencies), with attempt 0 and the same payload, run_at,
-- priority, max_attempts, backoff and dependency list. With cascade, every task
-- this one blocked (blocked with it as root) gets a new version too; tasks of the
-- retried set count as unfinished for each other, so they return to pending.
--
-- KEYS[1..14] the namespace layout of lib/keys.lua. Writes tasks, results, queue,
--   finished, meta, wake, edges, deps, blocked, blockedby, propagating.
--
-- ARGV[1] task id
-- ARGV[2] cascade: '1' or '0'
--
-- Reply: { propagating ids left, new version of the task, number of tasks retried }.
-- Errors: NOTFOUND <id>; CONFLICT state <state> <id> (not failed, cancelled or blocked);
--   BUSY <id> (still telling its dependents that it ended; settle with propagate.lua).
-- Cost: O((1 + cascaded) * (deps + log N)).

return run(function()
  local id = ARGV[1]
  local cascade = ARGV[2] == '1'
  local t = load_task(id)
  if not t then error({ err = 'NOTFOUND ' .. id }) end
  if t.state ~= 'failed' and t.state ~= 'cancelled' and t.state ~= 'blocked' then
    error({ err = 'CONFLICT state ' .. t.state .. ' ' .. id })
  end
  busy_check(id)
  local set, known = { { id = id, t = t } }, { [id] = 'pending' }
  if cascade then
    local prefix = id_prefix(id)
    for _, m in ipairs(redis.call('ZRANGEBYLEX', k.blockedby, '[' .. prefix, '(' .. prefix .. '\255')) do
      local c = string.sub(m, #prefix + 1)
      local ct = load_task(c)
      if ct and ct.state == 'blocked' and block_cause(c) == id and not known[c] then
        busy_check(c)
        set[#set + 1] = { id = c, t = ct }
        known[c] = 'pending'
      end
    end
  end
  local now = now_ms()
  local version, head = nil, false
  for i, x in ipairs(set) do
    local deps = decode_deps(redis.call('HGET', k.deps, x.id))
    local p = { run_at = x.t.run_at, priority = x.t.priority, max_attempts = x.t.max_attempts,
                backoff = x.t.backoff_ms }
    local v, state, is_head = write_version(x.id, x.t, p, deps, now, known)
    known[x.id] = nil
    if i == 1 then version = v end
    head = head or is_head
  end
  if head then redis.call('PUBLISH', k.wake, 'ready') end
  return { settle_after_terminal({}, now), version, #set }
end)
