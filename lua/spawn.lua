-- spawn.lua: report a claim as succeeded, adding the children and the join it spawned.
--
--- @include payload
--- @include settle
--- @include admit
--- @include reports
--- @include tokens
--- @include attempt
--- @include window
--- @keys tasks payloads results queue leases finished meta idle
--- @keys edges deps blocked blockedby propagating states history minutes ranked
--- @keys waits ended deadlines
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents spawned joins window windows
--- @keys wake
--
-- running -> succeeded, exactly as complete.lua ends it, and in the same atomic step the
-- task's spawn: its children (each a new task, ready) and, when given, a join task
-- (pending, a required dependency on every child). Fenced by the token (id, version,
-- attempt): only the current running attempt is applied; a token applied before gets
-- 'duplicate', any other 'stale', and neither writes anything, children included. A
-- crashed attempt (killed before its report) spawned nothing: the next attempt runs the
-- function again and spawns then. Each spawned task gets an entry in parents and in
-- spawned (lib/workflow.lua): its parent, its workflow's root, its join.
-- The ids of the children and the join must not exist (CONFLICT exists, nothing
-- written): a spawn never replaces a task, so a function that spawns the same ids on
-- every run cannot add them twice. Every argument is checked before anything is
-- written (BADARG, nothing written), the token only then: a malformed spawn is refused
-- whatever its token. A parent whose cancellation was requested (cancel.lua, or its
-- workflow's cancel) succeeds and spawns nothing.
--
-- Writes tasks, leases, results, history, finished, meta, idle, minutes (as complete.lua
-- for the parent), and for the spawned tasks payloads, queue, ranked, edges, deps,
-- deadlines (a spawned task with a deadline or ttl), parents, spawned, and in a fair
-- namespace fairkeys, fairq, fairready, fairwait (a keyed spawned task; lib/fair.lua).
-- Also writes states (the per-state index, for the records it writes), and for the
-- parent's dependents edges, blocked, blockedby, propagating (lib/settle.lua).
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua): one per slot it
-- frees when max_running was reached, one when a fairness key at its cap gets a slot
-- back, one per child (and dependent) made claimable; '<state> <id>' on ended when a
-- client waits for the parent (lib/ended.lua).
-- 'cancel <version> <id>' on wake for each running child of a first-n join it makes ready
-- (lib/settle.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] id, ARGV[3] version, ARGV[4] attempt: the parent's token
-- ARGV[5] the parent's result bytes ('' for none)
-- ARGV[6] join rule: '' (no join task), or the join's rule (the last task below is the
--         join): 'all', 'any', 'at_least <k>' or 'first <k>', k in [1, n] (lib/workflow.lua)
-- ARGV[7] window: '0' (none), or w in [1, n]: at most w children ready or running at once
--         (lib/window.lua)
-- ARGV[8] n, the number of children (1..MAX_SPAWN_CHILDREN, 1000); then n tasks, then
--   the join when ARGV[6] is not '', each three values as in schedule.lua: id, spec (the
--   eight fields with r and o both 0, then only the options deadline=, ttl= or key=),
--   payload (msgpack map)
-- then the caller's largest payload in bytes (>= 1), as in schedule.lua.
-- Ids, specs and payloads are checked as schedule.lua checks them; the payloads of the
-- call count against MAX_PAYLOAD_BYTES_PER_CALL and MAX_PAYLOAD_VALUES_PER_CALL.
--
-- Reply: { propagating jobs left, outcome }, outcome 'applied', 'duplicate' or 'stale'.
-- Errors (nothing written):
--   BADARG <field> ...     malformed argument (n, join, window, task_id, spec of <id>, priority,
--                          max_attempts, backoff, run_at, delay, payload of <id>,
--                          deadline of <id>, ttl of <id>, key of <id>, a cap named in
--                          its message)
--   CONFLICT exists <id>   a spawned id is a task already (the id in lowercase hex), or
--                          is the parent's own; checked after the token
-- Cost: O(n log N) plus the dependents settled within the propagation budget.

local SPAWN_SPEC = '^(%l%l) (-?%d+) (-?%d+) (%d+) (%d+) ([01]) 0 0(.*)$'

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local parent = check_id(ARGV[2], 'task_id')
  local version, attempt = tonumber(ARGV[3]), tonumber(ARGV[4])
  if not version or not attempt then error({ err = 'BADARG claim version and attempt must be integers' }) end
  local result = ARGV[5]
  if not result then error({ err = 'BADARG ARGV length does not match the counts' }) end
  local n = to_int(ARGV[8], 'n')
  if n < 1 or n > LIMITS.MAX_SPAWN_CHILDREN then
    error({ err = 'BADARG n must be in [1, ' .. LIMITS.MAX_SPAWN_CHILDREN .. '] children per spawn (MAX_SPAWN_CHILDREN)' })
  end
  local rule = ARGV[6] ~= '' and join_rule_arg(ARGV[6], n)
  local has_join = rule and true or false
  local window = to_int(ARGV[7], 'window')
  if window < 0 or window > n then error({ err = 'BADARG window must be 0 (none) or in [1, n]' }) end
  local total = n + (has_join and 1 or 0)
  if #ARGV ~= 8 + 3 * total + 1 then error({ err = 'BADARG ARGV length does not match the counts' }) end
  local now = now_ms(c)
  local specs, seen = {}, { [parent] = true }
  local payload_bytes = 0
  local asked = to_int(ARGV[#ARGV], 'max_payload_bytes')
  if asked < 1 then error({ err = 'BADARG max_payload_bytes must be >= 1' }) end
  local limit = payload_limit(asked)
  for i = 1, total do
    local pos = 9 + 3 * (i - 1)
    local id = check_id(ARGV[pos], 'task_id')
    if seen[id] then
      if id == parent then error({ err = 'CONFLICT exists ' .. hex_id(id) }) end
      error({ err = 'BADARG task_id duplicated in spawn: ' .. id })
    end
    seen[id] = true
    local mode, time, pr, ma, bo, _, rest = string.match(ARGV[pos + 1], SPAWN_SPEC)
    if not mode or (mode ~= 'at' and mode ~= 'in') then
      error({ err = 'BADARG spec of ' .. id .. ' must be: at|in time priority max_attempts backoff 0|1 0 0' })
    end
    local opts = admission_options(rest, id)
    if opts and (opts.dedupe or opts.debounce or opts.hold) then
      error({ err = 'BADARG spec of ' .. id .. ' a spawned task takes only deadline, ttl and key options' })
    end
    local s = {
      id = id,
      time = bounded(time, mode == 'in' and 'delay' or 'run_at', mode == 'in' and -MAX_DELAY_MS or -MAX_MS,
                     mode == 'in' and MAX_DELAY_MS or MAX_MS),
      priority = bounded(pr, 'priority', -2147483648, 2147483647),
      max_attempts = bounded(ma, 'max_attempts', 1, MAX_ATTEMPTS),
      backoff = bounded(bo, 'backoff', 0, MAX_MS),
      payload = ARGV[pos + 2], opts = opts,
    }
    s.run_at = mode == 'in' and now + s.time or s.time
    if #s.payload > limit then
      error({ err = 'BADARG payload of ' .. id .. ' ' .. payload_problem(s.payload, limit) })
    end
    payload_bytes = payload_bytes + #s.payload
    if payload_bytes > LIMITS.MAX_PAYLOAD_BYTES_PER_CALL then
      error({ err = 'BADARG payload at most ' .. LIMITS.MAX_PAYLOAD_BYTES_PER_CALL
        .. ' bytes of payloads per call (MAX_PAYLOAD_BYTES_PER_CALL)' })
    end
    specs[i] = s
  end
  check_call_payloads(specs, limit)

  -- The token: a stale or repeated report writes nothing, its spawn included.
  local t = load_task(parent)
  if not (t and t.state == 'running' and t.version == version and t.attempt == attempt) then
    local reply = { redis.call('ZCARD', k.propagating), unapplied_outcome(parent, version, attempt) }
    end_call(c)
    return reply
  end
  -- Every spawned id is new.
  for first = 1, total, 1000 do
    local ids = {}
    for i = first, math.min(first + 999, total) do ids[#ids + 1] = specs[i].id end
    local raws = redis.call('HMGET', k.tasks, unpack(ids))
    for j = 1, #ids do
      if raws[j] then error({ err = 'CONFLICT exists ' .. hex_id(ids[j]) }) end
    end
  end

  -- The parent ends as complete.lua ends it.
  local running_before = running_count(c)
  leave_running(parent, t, now, 'succeeded', nil)
  end_task(c, parent, t, 'succeeded', now)
  if result ~= '' then
    redis.call('HSET', k.results, parent, 'R' .. result)
  elseif t.attempt > 1 then
    redis.call('HDEL', k.results, parent)
  end
  capacity_freed(c, running_before)
  count_minute('s', 1, now)

  -- A task asked to stop (its cancellation, or its workflow's, was requested) succeeds
  -- as complete.lua would end it, and spawns nothing.
  if t.cancel == 1 then
    local reply = { settle_after_terminal(c, { parent }, now, budget), 'applied' }
    end_call(c)
    return reply
  end

  -- The spawned tasks: versions in the order given, children ready, the join pending on
  -- every child.
  local last = redis.call('HINCRBY', k.meta, 'seq', itoa(total))
  local root = workflow_root(parent)
  local join_id = has_join and specs[total].id or ''
  local fair_any = false
  for _, s in ipairs(specs) do
    if s.opts and s.opts.key then fair_any = true end
  end
  if fair_any and not fair_on(c) then fair_turn_on(c, now) end
  local join_deps = {}
  local states, entries, members, payloads = {}, {}, {}, {}
  local records, queued, ranks, line = {}, {}, {}, {}
  local aging = order_aging(c)
  local function state_of(id) return states[id] end
  for i, s in ipairs(specs) do
    local is_join = has_join and i == total
    s.version = last - total + i
    local inline = payload_inline(s.payload)
    s.inline = inline and s.payload or false
    if not inline then
      payloads[#payloads + 1] = s.id
      payloads[#payloads + 1] = s.payload
    end
    if s.opts and s.opts.key then redis.call('HSET', k.fairkeys, s.id, s.opts.key) end
    local deadline = s.opts and deadline_of(s.opts, now)
    if deadline then redis.call('ZADD', k.deadlines, deadline, deadline_member(s.version, s.id)) end
    local held = window > 0 and not is_join and i > window
    if is_join then
      write_version(c, s.id, nil, s, join_deps, now, state_of, s.version)
      if rule.kind ~= 'all' then
        -- A counting rule: the join awaits k successes, not every child.
        local jt = load_task(s.id)
        jt.remaining = rule.count
        save_task(s.id, jt)
      end
      redis.call('HSET', k.joins, s.id, join_entry(rule.kind, rule.count, n, 0, 0, 0))
    elseif held then
      -- Held by the window (lib/window.lua): pending, one awaited slot, in line.
      local t = {
        state = 'pending', version = s.version, attempt = 0, max_attempts = s.max_attempts,
        backoff_ms = s.backoff, run_at = s.run_at, priority = s.priority, cancel = 0,
        updated = now, remaining = 1, optional = 0, worker = '', payload = s.inline or nil,
      }
      count_move(c, nil, 'pending')
      save_task(s.id, t)
      line[#line + 1] = '0'
      line[#line + 1] = window_member(parent, i - 1, s.id)
      states[s.id] = 'pending'
      join_deps[#join_deps + 1] = { kind = 'r', id = s.id }
    else
      -- A child awaits nothing: ready, its writes gathered into one command per key
      -- for the whole spawn, as schedule.lua writes a batch.
      local t = {
        state = 'ready', version = s.version, attempt = 0, max_attempts = s.max_attempts,
        backoff_ms = s.backoff, run_at = s.run_at, priority = s.priority, cancel = 0,
        updated = now, remaining = 0, optional = 0, worker = '', payload = s.inline or nil,
      }
      count_move(c, nil, 'ready')
      records[#records + 1] = s.id
      records[#records + 1] = encode_task(t)
      if fair_on(c) then
        enqueue(c, t, s.id)
      else
        local member = queue_member(t, s.id)
        note_enqueued(c, member, s.run_at)
        if aging and s.run_at <= now then
          ranks[#ranks + 1] = rank_of(s.run_at, s.priority, aging)
          ranks[#ranks + 1] = member
        else
          queued[#queued + 1] = itoa(s.run_at)
          queued[#queued + 1] = member
        end
      end
      states[s.id] = 'ready'
      join_deps[#join_deps + 1] = { kind = 'r', id = s.id }
    end
    entries[#entries + 1] = s.id
    local flag = (is_join and 'j') or (window > 0 and 'w') or 'c'
    entries[#entries + 1] = parent_entry(parent, root, is_join and '' or join_id, flag, is_join and 0 or i - 1)
    members[#members + 1] = '0'
    members[#members + 1] = wf_prefix(root) .. s.id
  end
  call_many('HSET', k.tasks, records)
  call_many('ZADD', k.queue, queued)
  call_many('ZADD', k.ranked, ranks)
  call_many('ZADD', k.window, line)
  if window > 0 then redis.call('HSET', k.windows, parent, string.format('%d %d', window, window)) end
  call_many('HSET', k.payloads, payloads)
  call_many('HSET', k.parents, entries)
  call_many('ZADD', k.spawned, members)

  local reply = { settle_after_terminal(c, { parent }, now, budget), 'applied' }
  end_call(c)
  return reply
end)
