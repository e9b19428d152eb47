-- add_deps.lua: add required dependencies to a pending task's current version.
--
--- @include settle
--- @keys tasks results queue finished meta idle
--- @keys edges deps blocked blockedby propagating states ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys wake joins
--
-- pending -> pending (more awaited), or pending -> blocked when a new dependency
-- already failed, was cancelled or is blocked. Only a pending task takes new
-- dependencies. A dependency that closes a cycle of awaited dependencies is
-- refused with the cycle's path; nothing is written on any error.
-- Placing in parts: a task scheduled with hold=1 (lib/admit.lua) takes its further
-- dependencies as parts of this call, each naming the held version; the last part also
-- lifts the hold (lib/graph.lua), pending -> ready when nothing else is awaited.
--
-- Writes tasks, deps, edges, and when it blocks finished, meta, blocked, blockedby,
-- propagating (then more, as propagate.lua).
-- Also writes states (the per-state index, for the records it writes).
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua): one when the last
-- part makes the task due now, one per dependent that settling makes claimable; '<state>
-- <id>' on ended for each task it ends that a client waits for, whose waits entry it
-- removes (lib/ended.lua): the task blocked by a new dependency.
-- 'cancel <version> <id>' on wake for each running child of a first-n join it makes ready
-- (lib/settle.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] task id
-- ARGV[3] allow_unknown: '1' or '0'; for a part of a placement followed by
--   ' <version> more' or, for the last part (which lifts the hold), ' <version> last'
-- ARGV[4..] the new dependency ids
--
-- Reply: { propagating jobs left, the task's state after the call }.
-- Ids are valid UTF-8 of 1..512 bytes. Caps (lib/limits.lua; BADARG naming the cap,
-- nothing written): at most MAX_EDGES_PER_CALL (1000) new dependencies per call; the
-- task's dependencies over every part at most MAX_DEPS_PER_TASK (4000); the cycle check
-- reads at most MAX_CYCLE_VISITS (1000) dependents (BADARG deps cycle check visited more
-- than 1000 pending tasks ...: add dependencies before other pending tasks depend on the
-- task, or split the graph).
-- Errors: NOTFOUND <id>; CONFLICT state <state> <id> (not pending);
--   CONFLICT placed <id> (a part for a version that is not the current one or not held);
--   CORRUPT task record of <id> <why> (the task's or a new dependency's record);
--   UNKNOWN <id> <dep>; CYCLE <id> <id> ... (ids in hex, as in schedule.lua); BADARG deps ...
-- Cost: O(deps log N) plus the task's pending descendants for the cycle check.

-- (entries, length of the first, true) of a stored dependency list, read by the heads
-- of its entries (lib/graph.lua); (_, _, false) when it holds junk.
local function list_heads(raw)
  local count, pos, first_len = 0, 1, 0
  while pos <= #raw do
    local kind = string.sub(raw, pos, pos)
    local len = hex3_at(raw, pos + 1)
    if (kind ~= 'r' and kind ~= 'o' and not NO_EDGE[kind]) or not len or len == 0 or pos + 3 + len > #raw then
      return count, first_len, false
    end
    if count == 0 then first_len = 4 + len end
    count = count + 1
    pos = pos + 4 + len
  end
  return count, first_len, true
end

-- Whether d is already a dependency of the current version of id: every dependency but
-- the hold has exactly one edge d -> id (lib/graph.lua), of one of four forms.
local function has_edge_to(d, id)
  local p = id_prefix(d)
  local s = redis.call('ZMSCORE', k.edges, p .. 'wr' .. id, p .. 'sr' .. id, p .. 'wo' .. id, p .. 'so' .. id)
  return s[1] or s[2] or s[3] or s[4]
end

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local id = check_id(ARGV[2], 'task_id')
  local au, placing, part = string.match(ARGV[3] or '', '^([01])$')
  if not au then au, placing, part = string.match(ARGV[3] or '', '^([01]) (%d+) (%l+)$') end
  if not au then error({ err = 'BADARG allow_unknown must be 0 or 1' }) end
  if placing and ((part ~= 'more' and part ~= 'last') or #placing > 16) then
    error({ err = 'BADARG placement must be <version> more|last' })
  end
  local allow_unknown = au == '1'
  if #ARGV - 3 > LIMITS.MAX_EDGES_PER_CALL then
    error({ err = 'BADARG deps at most ' .. LIMITS.MAX_EDGES_PER_CALL .. ' dependencies per call (MAX_EDGES_PER_CALL)' })
  end
  -- Every argument is checked before any record is read.
  for i = 4, #ARGV do check_id(ARGV[i], 'deps') end
  local t = load_given(id)
  if not t then error({ err = 'NOTFOUND ' .. id }) end
  if t.state ~= 'pending' then error({ err = 'CONFLICT state ' .. t.state .. ' ' .. id }) end
  -- The stored list is walked by its entries' heads only, and the new entries are
  -- appended to it: a part costs what it adds, not the whole list again (a list that
  -- holds junk is decoded and rebuilt instead, dropping the junk, as before).
  local raw = redis.call('HGET', k.deps, id) or ''
  local count, first_len, whole = list_heads(raw)
  local deps = nil
  if not whole then
    deps = decode_deps(raw)
    count = #deps
  end
  local held
  if deps then held = deps[1] ~= nil and deps[1].kind == 'h' else held = string.sub(raw, 1, 1) == 'h' end
  -- A waitpoint's wait leads its list (lib/graph.lua): new dependencies go after it.
  local lead = string.sub(raw, 1, 1)
  if deps then lead = deps[1] and deps[1].kind end
  -- The task's dependencies in total, over every part (the hold and the wait are none).
  if count - ((held or lead == 'w') and 1 or 0) + #ARGV - 3 > LIMITS.MAX_DEPS_PER_TASK then
    error({ err = 'BADARG deps of ' .. id .. ' at most ' .. LIMITS.MAX_DEPS_PER_TASK
      .. ' dependencies per task (MAX_DEPS_PER_TASK)' })
  end
  if placing and (not held or t.version ~= tonumber(placing)) then
    error({ err = 'CONFLICT placed ' .. id })
  end
  local seen = {}
  for _, d in ipairs(deps or {}) do seen[d.id] = true end
  local added, states = {}, {}
  for i = 4, #ARGV do
    local d = ARGV[i]
    if d == id then error({ err = 'BADARG deps ' .. id .. ' depends on itself' }) end
    if seen[d] or (not deps and has_edge_to(d, id)) then
      error({ err = 'BADARG deps ' .. d .. ' is already a dependency' })
    end
    seen[d] = true
    local dt = load_given(d)
    if not dt and not allow_unknown then
      error({ err = 'UNKNOWN ' .. hex_id(id) .. ' ' .. hex_id(d) })
    end
    states[d] = dt and dt.state
    added[#added + 1] = { kind = 'r', id = d }
  end
  local children = {}
  for _, d in ipairs(added) do children[d.id] = { id } end
  -- The task keeps its existing awaited edges, so only the new ones join the walk.
  check_cycles({ { id = id } }, {}, children)

  local now = now_ms(c)
  local cause = nil
  for _, d in ipairs(added) do
    local st = states[d.id]
    local flag = 'w'
    if st == 'succeeded' then
      flag = 's'
    elseif TERMINAL[st] then
      flag = 's'
      if not cause then cause = { root = root_through(d.id, st), parent = d.id } end
    else
      t.remaining = t.remaining + 1
    end
    redis.call('ZADD', k.edges, 0, edge_member(d.id, flag, 'r', id))
  end
  local lift = part == 'last'
  if lift then t.remaining = t.remaining - 1 end
  if deps then
    for _, d in ipairs(added) do deps[#deps + 1] = d end
    if lift then table.remove(deps, 1) end
    redis.call('HSET', k.deps, id, encode_deps(deps))
  else
    -- The hold leads the list: the last part drops it.
    local kept = lift and string.sub(raw, first_len + 1) or raw
    redis.call('HSET', k.deps, id, kept .. encode_deps(added))
  end
  t.updated = now
  if cause then
    block_task(c, id, t, cause.root, cause.parent, now)
  elseif lift then
    save_pending(c, id, t)
  else
    save_task(id, t)
  end
  local left = settle_after_terminal(c, {}, now, budget)
  end_call(c)
  return { left, t.state }
end)
