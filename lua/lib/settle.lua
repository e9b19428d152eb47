-- lib/settle.lua: new versions, and telling dependents that a task ended.
--
--- @include graph
--- @include queue
--- @include ended
--- @include workflow
--
-- Propagation. When a task becomes terminal, its waiting edges must be settled:
-- success releases dependents (remaining - 1; ready at 0), any terminal state
-- releases optional edges, and failure, cancellation or block blocks the pending
-- dependents of its required edges (which then propagate in turn). A terminal
-- id with waiting edges enters the propagating set, and each script call settles
-- at most a budget of edges, so no call runs long however many dependents there are.
-- Invariant that keeps the chunks correct under concurrent calls: an id with a
-- 'p' job is terminal and cannot get a new version (schedule and retry refuse it
-- with BUSY until its job ends), and no waiting edge to a terminal task is ever
-- created (a new dependent sees it settled or blocked at once). So the waiting
-- edges of a propagating id are exactly those that existed when it became
-- terminal, each settled once, whatever runs in between.
-- A retry's cascade ('r' job) re-versions only tasks blocked with the retried
-- task as root and a version below the retry's own: versions come from one
-- counter, so a task blocked again after the retry is never retried by it.
-- Joins (lib/workflow.lua) change only how a settled edge counts for a join's record: a
-- counting rule's join awaits k successes, and a child that fails blocks it only once
-- fewer than k can still succeed. Each edge is still settled exactly once, so the join's
-- counts are exact. The 'x' job of a first-n join that became ready cancels the children
-- not ended yet, walking its dependency list once from a cursor kept in joins; a child it
-- cancels gets a 'p' job of its own like any task that ends.
--
-- The budget of a call (edges settled plus tasks visited) is the script's ARGV
-- propagation budget (core.PROPAGATE_BUDGET on the Python side), at most
-- MAX_PROPAGATE_BUDGET.

-- A budget is a request for at most that much work: a larger one than
-- MAX_PROPAGATE_BUDGET (lib/limits.lua) counts as that cap, so no call settles more.
local function budget_arg(value)
  local budget = to_int(value, 'budget')
  if budget < 1 then error({ err = 'BADARG budget must be >= 1' }) end
  return math.min(budget, LIMITS.MAX_PROPAGATE_BUDGET)
end

-- Write a new version of id (old: its current record or nil) with parameters p
-- (run_at, priority, max_attempts, backoff, inline) and dependency list deps. state_of(id)
-- is the state to count a dependency in (its record's, or what a task written in the
-- same call or awaiting the same cascade will be). version: the one reserved for
-- it, or nil to take the next from the namespace sequence. The new version is ready,
-- pending or blocked (then its dependents are queued for propagation). Returns the
-- version and the state.
local function write_version(c, id, old, p, deps, now, state_of, version)
  if old then
    count_move(c, old.state, nil)
    if TERMINAL[old.state] then redis.call('ZREM', k.finished, id) end
    clear_version(id)
  end
  version = version or redis.call('HINCRBY', k.meta, 'seq', '1')
  local remaining, optional, cause, waits = 0, 0, nil, {}
  for j, d in ipairs(deps) do
    local st = not NO_EDGE[d.kind] and state_of(d.id)
    if NO_EDGE[d.kind] then
      remaining = remaining + 1
    elseif d.kind == 'o' then
      if not TERMINAL[st] then optional = optional + 1; waits[j] = true end
    elseif st == 'succeeded' then
      -- already satisfied
    elseif TERMINAL[st] then
      if not cause then cause = { root = root_through(d.id, st), parent = d.id } end
    else
      remaining = remaining + 1
      waits[j] = true
    end
  end
  local t = {
    state = 'pending', version = version, attempt = 0, max_attempts = p.max_attempts,
    backoff_ms = p.backoff, run_at = p.run_at, priority = p.priority, cancel = 0,
    updated = now, remaining = remaining, optional = optional, worker = '',
    indexed = old and old.indexed,
  }
  -- p.inline: the new version's payload when it goes into the record, false when the
  -- caller put it in the payloads hash; nil (a retry) keeps the old version's.
  if p.inline ~= nil then
    t.payload = p.inline or nil
  elseif old then
    t.payload = task_payload(old)
  end
  if cause then
    count_move(c, nil, 'pending')
    block_task(c, id, t, cause.root, cause.parent, now)
  elseif remaining + optional > 0 then
    count_move(c, nil, 'pending')
    save_task(id, t)
  else
    t.state = 'ready'
    count_move(c, nil, 'ready')
    save_task(id, t)
    enqueue(c, t, id)
  end
  -- The edges and the stored list (encode_deps, edge_member) share each id's prefix.
  local edges, listed = {}, {}
  for j, d in ipairs(deps) do
    local prefix = id_prefix(d.id)
    if not NO_EDGE[d.kind] then
      local flag = (waits[j] and not cause) and 'w' or 's'
      edges[#edges + 1] = 0
      edges[#edges + 1] = prefix .. flag .. d.kind .. id
    end
    listed[j] = d.kind .. prefix
  end
  call_many('ZADD', k.edges, edges)
  if #deps > 0 then redis.call('HSET', k.deps, id, table.concat(listed)) end
  if old then redis.call('HDEL', k.results, id) end
  return version, t.state
end

-- Save pending task id (t: its record, changed by the caller): ready, and queued, once it
-- awaits no dependency (remaining and optional both 0).
local function save_pending(c, id, t)
  if t.remaining <= 0 and t.optional <= 0 then
    count_move(c, 'pending', 'ready')
    t.state = 'ready'
    save_task(id, t)
    enqueue(c, t, id)
  else
    save_task(id, t)
  end
end

-- Settle the edges of one 'p' job: at most want edges. Returns (cost, done).
local function settle_edges(c, p, want, now)
  local pt = load_task(p)
  -- A record can only vanish by retention, which leaves propagating ids alone.
  local p_state = pt and pt.state
  local prefix = id_prefix(p) .. 'w'
  local edges = redis.call('ZRANGEBYLEX', k.edges, '[' .. prefix, '(' .. prefix .. '\255',
                           'LIMIT', 0, want)
  for _, m in ipairs(edges) do
    local kind = string.sub(m, #prefix + 1, #prefix + 1)
    local child = string.sub(m, #prefix + 2)
    redis.call('ZREM', k.edges, m)
    redis.call('ZADD', k.edges, '0', edge_member(p, 's', kind, child))
    local ct = load_task(child)
    -- A join (lib/workflow.lua) counts how its children ended, and settles by its rule.
    local rule = kind == 'r' and p_state and join_of(child)
    if rule then
      if p_state == 'succeeded' then rule.succeeded = rule.succeeded + 1 else rule.failed = rule.failed + 1 end
      save_join(child, rule)
    end
    if p_state and ct and ct.state == 'pending' then
      if kind == 'o' then
        ct.optional = ct.optional - 1
      elseif p_state == 'succeeded' then
        ct.remaining = ct.remaining - 1
      elseif rule and rule.kind ~= 'all' and rule.total - rule.failed >= rule.count then
        -- A counting rule: enough children can still succeed; it waits on.
      else
        block_task(c, child, ct, root_through(p, p_state), p, now)
        ct = nil
      end
      if ct then
        ct.updated = now
        save_pending(c, child, ct)
        -- A first-n join that became ready cancels the children not ended yet.
        if ct.state == 'ready' and rule and rule.kind == 'first' then add_job('x' .. child) end
      end
    end
  end
  return #edges, #edges < want
end

-- Would a new version of id with deps (counted by state_of) close a cycle of awaited
-- dependencies? Edges made while a dependency had ended were never checked, and a
-- cascade makes such dependencies awaited again.
local function closes_cycle(id, deps, state_of)
  local children = {}
  for _, d in ipairs(deps) do
    -- The hold and the wait (lib/graph.lua) are no edges: they close no cycle.
    local st = not NO_EDGE[d.kind] and state_of(d.id)
    -- Blocked at once: it will await nothing.
    if d.kind == 'r' and TERMINAL[st] and st ~= 'succeeded' then return false end
    if st ~= false and not TERMINAL[st] then children[d.id] = { id } end
  end
  local ok, err = pcall(check_cycles, { { id = id } }, { [id] = true }, children)
  if ok then return false end
  -- Redis hands an error table back to pcall as its message string.
  local msg = type(err) == 'table' and err.err or tostring(err)
  if string.sub(msg, 1, 6) == 'CYCLE ' then return true end
  error({ err = msg })
end

-- Re-version at most want of the tasks blocked through the retried task before its
-- retry (version below the threshold): those whose recorded root is the retried task,
-- or, when the retried task was itself blocked, those with the same root whose chain
-- of parents passes through it. Tasks of the same cascade count as pending for each other, so
-- the order they are written in does not matter, except that of tasks that would
-- wait on each other in a cycle the last one written stays blocked (closes_cycle)
-- and blocks the others again. Returns (cost, done).
local function cascade_retry(c, retried, want, now)
  local field = 'cascade:' .. retried
  local threshold, rest = string.match(redis.call('HGET', k.meta, field) or '0|000', '^(%d+)|(.*)$')
  threshold = tonumber(threshold)
  local root_len = rest and hex3_at(rest, 1)
  if not threshold or not root_len then
    -- Junk in the progress field: the cascade cannot be resumed; it ends here.
    redis.call('HDEL', k.meta, field)
    return 1, true
  end
  local root = string.sub(rest, 4, 3 + root_len)
  local cursor = string.sub(rest, 4 + root_len)
  local steps = 0
  -- Was id blocked through the retried task, when that task was itself blocked? Its
  -- parents lead back to the root; the answer is kept for every task on the way, so
  -- each is walked once per call. (When the retried task is the root, the recorded root
  -- alone decides: a chain of parents may be broken by a middle task's new version.)
  local through = { [retried] = true }
  local function passes(id)
    local trail = {}
    local cur = id
    while through[cur] == nil do
      trail[#trail + 1] = cur
      through[cur] = false  -- until known: a loop of stale parents then ends as false
      steps = steps + 1
      local r, parent = block_cause(cur)
      if r ~= root or not parent or parent == root then break end
      cur = parent
    end
    local answer = through[cur]
    for _, t in ipairs(trail) do through[t] = answer end
    return answer
  end
  local function in_cascade(id, t)
    return t and t.state == 'blocked' and t.version < threshold and block_cause(id) == root
      and (root == retried or passes(id))
  end
  local function state_of(id)
    local t = load_task(id)
    if in_cascade(id, t) then return 'pending' end
    return t and t.state
  end
  local prefix = id_prefix(root)
  local lo = '[' .. prefix
  if cursor ~= '' then lo = '(' .. cursor end
  local members = redis.call('ZRANGEBYLEX', k.blockedby, lo, '(' .. prefix .. '\255', 'LIMIT', 0, want)
  local cost = #members
  for _, m in ipairs(members) do
    local child = string.sub(m, #prefix + 1)
    local ct = load_task(child)
    local deps = in_cascade(child, ct) and decode_deps(redis.call('HGET', k.deps, child))
    if deps and closes_cycle(child, deps, state_of) then
      -- Reviving c would leave tasks waiting on each other for ever: it stays blocked,
      -- and its job blocks again the tasks of the cascade that wait on it.
      needs_propagation(child)
    elseif deps then
      local params = { run_at = ct.run_at, priority = ct.priority,
                       max_attempts = ct.max_attempts, backoff = ct.backoff_ms }
      write_version(c, child, ct, params, deps, now, state_of)
    end
  end
  local done = #members < want
  if done then
    redis.call('HDEL', k.meta, field)
  else
    redis.call('HSET', k.meta, field,
               string.format('%d|', threshold) .. id_prefix(root) .. members[#members])
  end
  return cost + steps, done
end

-- The 'x' job of a first-n join that became ready: cancel its children that have not
-- ended, at most want of them visited, from its cursor on (lib/workflow.lua). Pending and
-- ready ones end cancelled (their dependents are told by their own jobs); a running one
-- gets a cancel request, as cancel.lua asks. Returns (cost, done).
local function cancel_rest(c, join, want, now)
  local j = join_of(join)
  if not j then return 1, true end
  local deps = decode_deps(redis.call('HGET', k.deps, join))
  local i = j.cursor + 1
  local last = math.min(#deps, j.cursor + want)
  while i <= last do
    local id = deps[i].id
    local t = load_task(id)
    if t and (t.state == 'pending' or t.state == 'ready') then
      end_task(c, id, t, 'cancelled', now)
      if has_waiting_edges(id) then needs_propagation(id) end
    elseif t and t.state == 'running' and t.cancel == 0 then
      t.cancel = 1
      save_task(id, t)
      publish(k.wake, string.format('cancel %d ', t.version) .. id)
    end
    i = i + 1
  end
  local visited = i - 1 - j.cursor
  j.cursor = i - 1
  save_join(join, j)
  return visited, i > #deps
end

-- Run the propagating jobs, oldest first, within budget (edges settled plus tasks
-- visited). Returns the budget used.
local function propagate(c, budget, now)
  local used = 0
  while used < budget do
    local head = redis.call('ZRANGE', k.propagating, '0', '0')
    if #head == 0 then break end
    local job = head[1]
    local want = budget - used
    local cost, done
    if string.sub(job, 1, 1) == 'r' then
      cost, done = cascade_retry(c, string.sub(job, 2), want, now)
    elseif string.sub(job, 1, 1) == 'x' then
      cost, done = cancel_rest(c, string.sub(job, 2), want, now)
    else
      cost, done = settle_edges(c, string.sub(job, 2), want, now)
    end
    -- Visiting a job costs like one edge, so a long line of small jobs cannot
    -- stretch one call either.
    used = used + math.max(cost, 1)
    if done then redis.call('ZREM', k.propagating, job) end
  end
  return used
end

-- Tasks that just became terminal: queue their dependents' propagation and settle a
-- budget of it now. Returns the number of propagating jobs left (0: all settled).
local function settle_after_terminal(c, ids, now, budget)
  -- A task no dependent waits for has nothing to tell: no job (as in block_task).
  for _, id in ipairs(ids) do
    if has_waiting_edges(id) then needs_propagation(id) end
  end
  if redis.call('ZCARD', k.propagating) == 0 then return 0 end
  propagate(c, budget, now)
  return redis.call('ZCARD', k.propagating)
end

-- What a script that changes tasks does last, once its work is done: write the counters
-- its moves changed (lib/counts.lua), wake one idle worker per claimable entry it added
-- (lib/queue.lua), and tell the clients waiting for a task it ended (lib/ended.lua).
local function end_call(c)
  write_counts(c)
  wake_for_enqueued(c)
  tell_waiters(c)
end
