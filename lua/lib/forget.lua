-- lib/forget.lua: removing a terminal task with everything it owns.
--
--- @include graph
--- @include workflow

-- Remove terminal task id (t: its record, or nil for one that cannot be read): the
-- record and its index member, payload, result, applied tokens, history, dependency
-- list, debounce burst, pause entry, fairness key, progress, checkpoint, cost, block cause,
-- every edge to or from it, and its parents entry and workflow member when it was spawned. Its
-- dependents keep their own records; a later dependency on the id is an unknown dependency.
local function remove_task(c, id, t)
  if t then count_move(c, t.state, nil) end
  clear_version(id)
  local prefix = id_prefix(id)
  local outgoing = redis.call('ZRANGEBYLEX', k.edges, '[' .. prefix, '(' .. prefix .. '\255')
  for i = 1, #outgoing, 500 do
    redis.call('ZREM', k.edges, unpack(outgoing, i, math.min(i + 499, #outgoing)))
  end
  forget_task(id, t)
  redis.call('HDEL', k.fairkeys, id)
  redis.call('HDEL', k.costs, id)
  redis.call('HDEL', k.payloads, id)
  redis.call('HDEL', k.results, id)
  redis.call('HDEL', k.done, id)
  redis.call('HDEL', k.history, id)
  redis.call('HDEL', k.debounce, id)
  redis.call('HDEL', k.paused, id)
  redis.call('HDEL', k.progress, id)
  redis.call('HDEL', k.checkpoints, id)
  redis.call('ZREM', k.finished, id)
  -- A spawned task (lib/workflow.lua) leaves its workflow.
  local _, root = parse_parent(redis.call('HGET', k.parents, id))
  if root then redis.call('ZREM', k.spawned, wf_prefix(root) .. id) end
  redis.call('HDEL', k.parents, id)
end
