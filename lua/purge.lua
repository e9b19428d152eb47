-- purge.lua: remove terminal tasks older than the namespace's retention.
--
--- @include forget
--- @keys tasks payloads results done finished meta
--- @keys edges deps blocked blockedby propagating states history
--- @keys debounce progress checkpoints
--- @keys idle fair fairready fairfull fairkeys fairrun paused costs
--- @keys parents spawned
--
-- succeeded / failed / cancelled / blocked, terminal for longer than the
-- retention -> (gone): the record, payload, result, applied tokens, history, dependency
-- list, block cause and every edge to or from the task are removed, so Redis
-- memory does not grow with history. A task whose dependents are still being
-- settled is kept until that ends. A later dependency on a purged id is an
-- unknown dependency; its old dependents keep their own records.
--
-- Reads meta (retention_ms), propagating; writes tasks, payloads, results, done, debounce, paused,
-- finished, meta (retention_ms, count:<state>), edges, deps, blocked, blockedby.
-- Also removes the task's member of states (the per-state index), its history, its
-- fairness key (fairkeys), its progress and its checkpoint (progress, checkpoints) and
-- its cost (costs). It receives idle, fair, fairready, fairfull and fairrun and touches
-- none of them (a terminal task holds no slot of its fairness key).
--
-- Publishes: nothing.
--
-- ARGV[1] the most tasks to remove in this call (>= 1)
-- ARGV[2] retention in ms to store first (meta field retention_ms), or '' to use the
--         stored one
-- ARGV[3] the retention in ms when none is stored (>= 0; distsched sends 86400000, 24 hours)
--
-- Reply: { 0, tasks removed, terminal tasks still kept }.
-- Cost: O(m (deps + dependents + log N)) for m removed tasks.

return run(function(c)
  repair_meta(c)
  local limit = to_int(ARGV[1], 'limit')
  if limit < 1 then error({ err = 'BADARG limit must be >= 1' }) end
  local default = to_int(ARGV[3], 'default_retention')
  if default < 0 then error({ err = 'BADARG default_retention must be >= 0' }) end
  if ARGV[2] and ARGV[2] ~= '' then
    local retention = to_int(ARGV[2], 'retention')
    if retention < 0 then error({ err = 'BADARG retention must be >= 0' }) end
    redis.call('HSET', k.meta, 'retention_ms', retention)
  end
  local retention = tonumber(redis.call('HGET', k.meta, 'retention_ms')) or default
  local now = now_ms(c)
  local ids = redis.call('ZRANGEBYSCORE', k.finished, '-inf', now - retention, 'LIMIT', 0, limit)
  local removed = 0
  for _, id in ipairs(ids) do
    local t = load_task(id)
    if t and not TERMINAL[t.state] then
      -- Not terminal any more (a new version): it should not be listed.
      redis.call('ZREM', k.finished, id)
    elseif not redis.call('ZSCORE', k.propagating, 'p' .. id) then
      remove_task(c, id, t)
      removed = removed + 1
    end
  end
  write_counts(c)
  return { 0, removed, redis.call('ZCARD', k.finished) }
end)
