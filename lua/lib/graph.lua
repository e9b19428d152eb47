-- lib/graph.lua: dependency edges and lists, blocking, cycles, propagation jobs.
--
--- @include record
--- @include counts
--- @include repair
--- @include ended
--
-- Edge member of the edges sorted set (every score 0, so ZRANGEBYLEX ranges work):
--   hex3(#parent) .. parent .. flag .. kind .. child
--   flag  'w' the child's current version still waits on the parent; 's' settled
--   kind  'r' required, 'o' optional
-- Every edge of the current versions is stored exactly once. UTF-8 ids never
-- contain byte 0xFF, so '(' .. prefix .. '\255' closes a prefix range.
--
-- Dependency list (deps hash): kind .. hex3(#id) .. id, concatenated, in the order given.
-- Kind 'h' (the hold, always first, its id the task's own) marks a version whose
-- dependencies are still being placed in parts: it counts as one required dependency
-- that nothing settles and has no edge; the last part removes it (add_deps.lua). A new
-- version made from the stored list (retry, cascade) keeps it, so no version of a
-- partly placed task can run.
-- Kind 'w' (the wait, always first, its "id" the timeout in decimal ms) marks a
-- waitpoint (lib/deadline.lua, waitpoint.lua): it too counts as one required dependency
-- that nothing settles and has no edge, so no claim ever sees the task; only
-- waitpoint.lua ends it (completed or failed by a call), or expire.lua (timed out). A
-- new version made from the stored list keeps it: a retried waitpoint waits again.
-- Block cause (blocked hash): hex3(#root) .. root .. parent, where parent is the
-- dependency the block came through; following parents back to root is the path.
-- blockedby member: hex3(#root) .. root .. child, for each task root blocked.

-- Kinds of list entries that are no dependency: no edge, nothing settles them.
local NO_EDGE = { h = true, w = true }

local function id_prefix(id)
  return string.format('%03x', #id) .. id
end

-- An id inside an error reply travels as lowercase hex: Redis turns line breaks in an
-- error message into spaces and cuts it at a NUL byte, both of which an id may hold.
local function hex_id(id)
  return (string.gsub(id, '.', function(c) return string.format('%02x', string.byte(c)) end))
end

local function edge_member(parent, flag, kind, child)
  return id_prefix(parent) .. flag .. kind .. child
end

local function encode_deps(list)
  local parts = {}
  for i, d in ipairs(list) do parts[i] = d.kind .. id_prefix(d.id) end
  return table.concat(parts)
end

-- The length of a hex3 prefix at pos, or nil when raw holds no such prefix there.
local function hex3_at(raw, pos)
  local digits = string.sub(raw, pos, pos + 2)
  if not string.match(digits, '^%x%x%x$') then return nil end
  return tonumber(digits, 16)
end

-- A stored list that does not parse (junk) ends at its first unreadable entry: the
-- entries before it are still forgotten or kept as usual, and no call fails on it.
local function decode_deps(raw)
  local list = {}
  if not raw then return list end
  local pos = 1
  while pos <= #raw do
    local kind = string.sub(raw, pos, pos)
    local len = hex3_at(raw, pos + 1)
    if (kind ~= 'r' and kind ~= 'o' and not NO_EDGE[kind]) or not len or len == 0 or pos + 3 + len > #raw then
      redis.log(redis.LOG_WARNING, 'distsched: ignored the unreadable rest of a dependency list')
      break
    end
    list[#list + 1] = { kind = kind, id = string.sub(raw, pos + 4, pos + 3 + len) }
    pos = pos + 4 + len
  end
  return list
end

-- The timeout (ms) of a waitpoint's dependency list (its leading 'w' entry), or nil
-- when the list is no waitpoint's.
local function waitpoint_timeout(list)
  local first = list[1]
  if not first or first.kind ~= 'w' then return nil end
  return tonumber(first.id)
end

-- (root, parent) of a blocked task, or nil (also for a cause that does not parse).
local function block_cause(id)
  local raw = redis.call('HGET', k.blocked, id)
  if not raw then return nil end
  local len = hex3_at(raw, 1)
  if not len or len == 0 or 3 + len >= #raw then return nil end
  return string.sub(raw, 4, 3 + len), string.sub(raw, 4 + len)
end

local function has_waiting_edges(id)
  local prefix = id_prefix(id) .. 'w'
  return #redis.call('ZRANGEBYLEX', k.edges, '[' .. prefix, '(' .. prefix .. '\255', 'LIMIT', '0', '1') > 0
end

-- Jobs in the propagating set: 'p' .. id settles the waiting edges of terminal id;
-- 'r' .. id re-versions the tasks id blocked (a retry's cascade), its progress kept
-- in meta field 'cascade:' .. id as '<version threshold>|<last blockedby member>'.
local function add_job(member)
  if not redis.call('ZSCORE', k.propagating, member) then
    redis.call('ZADD', k.propagating, itoa(redis.call('HINCRBY', k.meta, 'pseq', '1')), member)
  end
end

local function needs_propagation(id)
  add_job('p' .. id)
end

local function busy_check(id)
  if redis.call('ZSCORE', k.propagating, 'p' .. id) or redis.call('ZSCORE', k.propagating, 'r' .. id) then
    error({ err = 'BUSY ' .. id })
  end
end

-- The root to record when a task is blocked through dependency `parent`.
local function root_through(parent, parent_state)
  if parent_state == 'blocked' then
    local root = block_cause(parent)
    if root then return root end
  end
  return parent
end

-- End task id (t: its record) blocked, root and parent its cause (lib/ended.lua's
-- end_task), and give it a propagation job when dependents wait on it.
local function block_task(c, id, t, root, parent, now)
  end_task(c, id, t, 'blocked', now)
  redis.call('HSET', k.blocked, id, id_prefix(root) .. parent)
  redis.call('ZADD', k.blockedby, '0', id_prefix(root) .. id)
  if has_waiting_edges(id) then needs_propagation(id) end
end

local function record_state(id)
  local t = load_task(id)
  return t and t.state
end

-- Forget what an old version of id knew: its edges and its block cause.
local function clear_version(id)
  for _, d in ipairs(decode_deps(redis.call('HGET', k.deps, id))) do
    if not NO_EDGE[d.kind] then redis.call('ZREM', k.edges, edge_member(d.id, 'w', d.kind, id), edge_member(d.id, 's', d.kind, id)) end
  end
  redis.call('HDEL', k.deps, id)
  local root = block_cause(id)
  if root then redis.call('ZREM', k.blockedby, id_prefix(root) .. id) end
  -- Also a cause that does not parse: the new version must not inherit it.
  redis.call('HDEL', k.blocked, id)
end

-- Refuse a cycle of awaited dependencies. Depth-first, white-grey-black with parent
-- pointers, over edges parent -> dependent: the new edges of the tasks being written
-- (children: parent id -> list of dependent ids; batch: id -> truthy for those tasks)
-- replace their old ones, and otherwise only pending tasks wait. Raises
-- CYCLE <path>, the path listing each id before the ids that depend on it, first = last,
-- each id in hex (hex_id), separated by spaces. The walk reads at most MAX_CYCLE_VISITS
-- dependents' records (lib/limits.lua); past that the call is refused (BADARG deps, see
-- CYCLE_TOO_WIDE), so that no call holds Redis for a large pending graph.
local CYCLE_TOO_WIDE = 'BADARG deps cycle check visited more than ' .. LIMITS.MAX_CYCLE_VISITS
  .. ' pending tasks (MAX_CYCLE_VISITS): give a task its dependencies before other pending'
  .. ' tasks depend on it (schedule a graph dependencies first), or add them in calls'
  .. ' whose tasks have fewer pending dependents'

local function check_cycles(starts, batch, children)
  local visits = 0
  local function dependents_of(x)
    local out = {}
    local prefix = id_prefix(x) .. 'w'
    -- One more than the visits left: reading past the bound refuses the call.
    local most = LIMITS.MAX_CYCLE_VISITS - visits + 1
    local found = {}
    for _, m in ipairs(redis.call('ZRANGEBYLEX', k.edges, '[' .. prefix, '(' .. prefix .. '\255',
                                  'LIMIT', '0', itoa(most))) do
      local c = string.sub(m, #prefix + 2)
      if not batch[c] then
        visits = visits + 1
        if visits > LIMITS.MAX_CYCLE_VISITS then error({ err = CYCLE_TOO_WIDE }) end
        found[#found + 1] = c
      end
    end
    -- Only the state is needed: read from the head of each record (lib/record.lua: a
    -- msgpack record opens with the one-letter state as a fixstr, a text one with the
    -- letter and '|'), all of them in one HMGET, rather than parsing every record.
    for first = 1, #found, 1000 do
      local raws = redis.call('HMGET', k.tasks, unpack(found, first, math.min(first + 999, #found)))
      for j = 1, #raws do
        local raw = raws[j]
        if raw and string.byte(raw, 2) == (string.byte(raw, 1) == PACKED and 112 or 124)
            and (string.byte(raw, 1) == PACKED or string.byte(raw, 1) == 112) then
          out[#out + 1] = found[first + j - 1]
        end
      end
    end
    for _, c in ipairs(children[x] or {}) do out[#out + 1] = c end
    return out
  end
  local color, parent = {}, {}
  for _, s in ipairs(starts) do
    if not color[s.id] then
      color[s.id] = 1
      local stack = { { id = s.id, next = dependents_of(s.id), i = 0 } }
      while #stack > 0 do
        local top = stack[#stack]
        top.i = top.i + 1
        local c = top.next[top.i]
        if c == nil then
          color[top.id] = 2
          stack[#stack] = nil
        elseif color[c] == 1 then
          -- The grey ids from c down to top, gathered back up through the parent
          -- pointers, then put in order (one pass each way: linear in the path's length).
          local back = {}
          local cur = top.id
          while cur ~= c do
            back[#back + 1] = cur
            cur = parent[cur]
          end
          local parts = { hex_id(c) }
          for i = #back, 1, -1 do parts[#parts + 1] = hex_id(back[i]) end
          parts[#parts + 1] = parts[1]
          error({ err = 'CYCLE ' .. table.concat(parts, ' ') })
        elseif not color[c] then
          color[c] = 1
          parent[c] = top.id
          stack[#stack + 1] = { id = c, next = dependents_of(c), i = 0 }
        end
      end
    end
  end
end
