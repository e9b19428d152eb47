-- lib/workflow.lua: tasks spawned by a running task (spawn.lua): parents, workflows.
--
--- @include record
--
-- A task that completes with a spawn (spawn.lua) adds children and, optionally, a join
-- task that depends on every child. Each spawned task (child or join) has an entry in
-- the parents hash (field: its id):
--   hex3(#parent) .. parent .. hex3(#root) .. root .. hex3(#join) .. join .. flag .. hex8(order)
--   parent  the task whose completion spawned it
--   root    the workflow's root: the parent's own root when the parent was spawned too,
--           else the parent
--   join    the join of its spawn ('' for a spawn without one, and for the join itself)
--   flag    'c' a child, 'w' a child held by a window (lib/window.lua), 'j' the join
--   order   its position among the children of its spawn (0 for the join)
-- and a member of the spawned sorted set (every score 0): hex3(#root) .. root .. id, so
-- the tasks of one workflow are one ZRANGEBYLEX away (cancel_workflow).

local function wf_prefix(id)
  return string.format('%03x', #id) .. id
end

-- The parents entry of a spawned task, from its fields.
local function parent_entry(parent, root, join, flag, order)
  return wf_prefix(parent) .. wf_prefix(root) .. wf_prefix(join) .. flag .. string.format('%08x', order)
end

-- The fields of a parents entry (parent, root, join, flag, order), or nil when raw is
-- absent or does not parse (junk counts as no entry).
local function parse_parent(raw)
  if not raw then return nil end
  local fields, pos = {}, 1
  for i = 1, 3 do
    local digits = string.sub(raw, pos, pos + 2)
    if not string.match(digits, '^%x%x%x$') then return nil end
    local len = tonumber(digits, 16)
    fields[i] = string.sub(raw, pos + 3, pos + 2 + len)
    pos = pos + 3 + len
  end
  local flag, order = string.match(string.sub(raw, pos), '^([cwj])(%x%x%x%x%x%x%x%x)$')
  if not flag or fields[1] == '' or fields[2] == '' then return nil end
  return fields[1], fields[2], fields[3], flag, tonumber(order, 16)
end

-- The workflow root of id: its recorded root when it was spawned, else itself.
local function workflow_root(id)
  local _, root = parse_parent(redis.call('HGET', k.parents, id))
  return root or id
end

-- Join rules. A join (the task of a spawn that depends on every child) has a field in
-- the joins hash: '<kind> <k> <total> <succeeded> <failed> <cursor>', kind one of
--   all       ready when every child succeeded; a child that fails blocks it (as any
--             required dependency does); k = total
--   any       ready when one child succeeded (k = 1); blocked when every child failed
--   at_least  ready when k children succeeded; blocked once fewer than k still can
--   first     as at_least, and when it becomes ready the children not ended yet are
--             cancelled (a 'x' propagation job, lib/settle.lua; cursor: the next position
--             of its dependency list to visit)
-- total the number of children, succeeded and failed how many of them ended so (failed:
-- any ending but success), counted as their edges to the join are settled. A counting
-- rule's join record awaits k (remaining), not every child: lib/settle.lua settles its
-- edges by the rule.
local JOIN_KINDS = { all = true, any = true, at_least = true, first = true }

local function join_entry(kind, k_, total, succeeded, failed, cursor)
  return string.format('%s %d %d %d %d %d', kind, k_, total, succeeded, failed, cursor)
end

-- The rule of spawn.lua's ARGV: 'all', 'any', 'at_least <k>' or 'first <k>', k in [1, n].
local function join_rule_arg(text, n)
  local kind, count = string.match(text, '^(%l[%l_]*) ?(%d*)$')
  if not kind or not JOIN_KINDS[kind] then
    error({ err = 'BADARG join must be all, any, at_least <k> or first <k>' })
  end
  if kind == 'all' or kind == 'any' then
    if count ~= '' then error({ err = 'BADARG join ' .. kind .. ' takes no count' }) end
    return { kind = kind, count = kind == 'all' and n or 1 }
  end
  local k_ = tonumber(count)
  if not k_ or #count > 7 or k_ < 1 or k_ > n then
    error({ err = 'BADARG join ' .. kind .. ' needs a count in [1, n]' })
  end
  return { kind = kind, count = k_ }
end

-- The joins entry of id as a table (kind, k, total, succeeded, failed, cursor), or nil.
local function join_of(id)
  local raw = redis.call('HGET', k.joins, id)
  if not raw then return nil end
  local kind, k_, total, succeeded, failed, cursor =
    string.match(raw, '^(%l[%l_]*) (%d+) (%d+) (%d+) (%d+) (%d+)$')
  if not kind or not JOIN_KINDS[kind] then return nil end
  return { kind = kind, count = tonumber(k_), total = tonumber(total), succeeded = tonumber(succeeded),
           failed = tonumber(failed), cursor = tonumber(cursor) }
end

local function save_join(id, j)
  redis.call('HSET', k.joins, id, join_entry(j.kind, j.count, j.total, j.succeeded, j.failed, j.cursor))
end
