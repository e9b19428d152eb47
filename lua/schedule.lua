-- schedule.lua: submit a batch of tasks atomically, each as a new version.
--
--- @include payload
--- @include settle
--- @include admit
--- @keys tasks payloads results queue finished meta idle
--- @keys edges deps blocked blockedby propagating states ranked
--- @keys waits ended
--- @keys debounce deadlines
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun costs
--- @keys parents window windows
--- @keys wake joins
--
-- (none) / pending / ready / terminal -> ready, pending or blocked:
--   ready    no unfinished dependency
--   pending  a required dependency not yet succeeded, or an optional one not yet terminal
--   blocked  a required dependency already failed, cancelled or blocked
-- A running task is never replaced. With dedupe, an existing queued or running version
-- (or one that ended within the window) is kept and nothing is written for that task;
-- with debounce, the new version's run_at is at most max_wait after the burst's first
-- submission. A replaced task's old version forgets its
-- edges before the new ones are registered; its old queue entry stays in the
-- queue and the claim script drops it lazily. The whole batch is validated
-- before anything is written: on any error nothing changes.
-- Cycles: a batch that would close a cycle of awaited dependencies (through
-- its own tasks and existing pending ones) is refused with the cycle's path.
--
-- Writes tasks, payloads, results, queue, finished, meta, idle, edges, deps, blocked,
-- blockedby, propagating.
-- Also writes states (the per-state index, for the records it writes), and in a
-- namespace of the priority order ranked (a task due now goes straight into the ready
-- set; lib/ranked.lua), reading meta (order, aging_ms).
--
-- Also writes costs (a task's cost other than 1), debounce (the burst of a task
-- scheduled with debounce; lib/admit.lua) and deadlines (a version's deadline, when it
-- has one, or a waitpoint's timer; lib/deadline.lua).
-- A spec with key=<hex> turns the namespace fair (meta fair) and, in a fair namespace,
-- each new version's key is written to fairkeys and its entry goes to fairq (or queue for
-- the default key), its key into fairready or fairwait (lib/fair.lua).
-- A spec with cost=<units> other than 1 writes its cost to costs (task id -> units); a
-- new version without one removes an earlier version's. A cost above the rate of the
-- task's key (fair rate:<key>, read for each spec with a cost) is refused.
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua): one per task it
-- makes due now, or one for a new queue head not due yet; '<state> <id>' on ended for
-- each task it ends that a client waits for, whose waits entry it removes
-- (lib/ended.lua): a task blocked at once, a dependent it blocks.
-- 'cancel <version> <id>' on wake for each running child of a first-n join it makes ready
-- (lib/settle.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] n, the number of tasks; then for each task, in order:
--   id;
--   spec, eight fields joined by single spaces:
--     mode ('at': time is absolute epoch ms; 'in': ms from the server's now),
--     time (integer ms), priority (integer in [-2^31, 2^31 - 1]), max_attempts (>= 1),
--     backoff (integer ms >= 0), allow_unknown ('1' or '0'),
--     r (number of required deps), o (number of optional deps);
--     then optionally options, each ' dedupe=<window ms>', ' debounce=<max wait ms>'
--     (not both), ' deadline=<epoch ms>' or ' ttl=<ms>' (not both), ' key=<hex>' (the
--     fairness key), ' hold=1' (held until add_deps.lua's last part lifts it; lib/admit.lua),
--     ' wait=<timeout ms>' (a waitpoint: pending until waitpoint.lua ends it, never
--     claimed, failed when it times out; lib/deadline.lua);
--     fairness key), ' cost=<units>' (1..1000000000: the units of its key's rate it takes
--     when it starts; 1 when absent), ' hold=1' (held until add_deps.lua's last part lifts it; lib/admit.lua);
--   payload (msgpack map);
--   then r required dependency ids, then o optional ones;
-- then, optionally, the caller's largest payload in bytes (>= 1): it can only lower the
-- namespace's payload limit (meta payload_max, set by an admin; 1048576 while none is
-- stored, never above PAYLOAD_CEILING_BYTES, 1048576).
-- Ids are valid UTF-8 of 1..512 bytes; time is within +-(2^53 - 1) ('at') or +-2^52 ('in');
-- max_attempts in [1, 1000000]; backoff in [0, 2^53 - 1] (the wait between attempts is
-- capped by fail.lua and reap.lua's argument);
-- the payload a msgpack map with a non-empty UTF-8 string fn, args an array and
-- kwargs a map with string keys (each may be nil or left out), arrays and maps nested at
-- most MAX_PAYLOAD_DEPTH (64) deep (the payload itself is depth 1), of at most
-- MAX_PAYLOAD_VALUES (32768) msgpack values (the map, every key and value inside it, one
-- more per character outside ASCII in a string).
-- Caps (lib/limits.lua; BADARG naming the cap, nothing written): n at most
-- MAX_TASKS_PER_CALL (500); r + o of a task at most MAX_DEPS_PER_TASK (4000); the
-- dependencies of the whole batch at most MAX_EDGES_PER_CALL (1000); the payloads of the
-- batch at most MAX_PAYLOAD_BYTES_PER_CALL (1048576 bytes) and
-- MAX_PAYLOAD_VALUES_PER_CALL (32768 values) together; the cycle check
-- reads at most MAX_CYCLE_VISITS (1000) dependents (BADARG deps cycle check visited more
-- than 1000 pending tasks ...: schedule a graph dependencies first, or in smaller calls);
-- the propagation budget counts as at most MAX_PROPAGATE_BUDGET (250).
--
-- Reply: { propagating jobs left, version 1, ..., version n }; when a spec of the call has
--   an option (any of the four), one more value: n letters, the i-th 'n' when task i got
--   a new version, 'k' when dedupe kept its existing version (the one replied).
-- Errors (nothing written):
--   CONFLICT running <id>     a task of the batch is running
--   BUSY <id>                 a task of the batch is still telling its dependents
--                             that it ended; settle with propagate.lua and try again
--   UNKNOWN <id> <dep>        a dependency that exists nowhere (and allow_unknown is 0)
--   CYCLE <id> <id> ...       the path, each id a dependency of the next, first = last
--                             (ids in these two errors are in lowercase hex)
--   BADARG <field> ...        malformed argument (task_id, priority, max_attempts, backoff,
--                             run_at, delay, deps, optional_deps, payload of <id>,
--                             dedupe_window of <id>, debounce of <id>, deadline of <id>,
--                             ttl of <id>, timeout of <id> (wait=), n, or a cap named
--                             in its message, ...)
--                             ttl of <id>, cost of <id> (also: more than the rate of its
--                             key, when that key has one), n, or a cap named in its message, ...)
--   CORRUPT task record of <id> <why>   a task of the batch, or a dependency, has a
--                             stored record that does not parse
-- Cost: O(n log N + edges), plus the pending descendants of the batch's tasks for the
-- cycle check; blocked tasks' dependents are settled within the propagation budget.

-- The dependency list of every task given none (never written to).
local NO_DEPS = {}

local SPEC_PATTERN = '^(%l%l) (-?%d+) (-?%d+) (%d+) (%d+) ([01]) (%d+) (%d+)(.*)$'

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local n = to_int(ARGV[2], 'n')
  if n < 0 then error({ err = 'BADARG n must be >= 0' }) end
  if n > LIMITS.MAX_TASKS_PER_CALL then
    error({ err = 'BADARG n at most ' .. LIMITS.MAX_TASKS_PER_CALL .. ' tasks per call (MAX_TASKS_PER_CALL)' })
  end
  local edges = 0
  local now = now_ms(c)
  local specs, batch, order = {}, {}, {}
  local admitting, all_specs = false, nil
  local jobs_pending = redis.call('ZCARD', k.propagating) > 0
  local pos = 3
  for i = 1, n do
    local id = ARGV[pos]
    if not id then error({ err = 'BADARG ARGV length does not match the counts' }) end
    check_id(id, 'task_id')
    if batch[id] then error({ err = 'BADARG task_id duplicated in batch: ' .. id }) end
    local mode, time, pr, ma, bo, au, r, o, rest = string.match(ARGV[pos + 1] or '', SPEC_PATTERN)
    if not mode then
      error({ err = 'BADARG spec of ' .. id .. ' must be: at|in time priority max_attempts backoff 0|1 r o' })
    end
    if mode ~= 'at' and mode ~= 'in' then error({ err = 'BADARG time mode must be at or in' }) end
    local opts = admission_options(rest, id)
    if opts then admitting = true end
    local s = {
      id = id, time = bounded(time, mode == 'in' and 'delay' or 'run_at', mode == 'in' and -MAX_DELAY_MS or -MAX_MS,
                              mode == 'in' and MAX_DELAY_MS or MAX_MS),
      priority = bounded(pr, 'priority', -2147483648, 2147483647),
      max_attempts = bounded(ma, 'max_attempts', 1, MAX_ATTEMPTS),
      backoff = bounded(bo, 'backoff', 0, MAX_MS),
      payload = ARGV[pos + 2], allow_unknown = au == '1', opts = opts,
    }
    if not s.payload then error({ err = 'BADARG payload missing for ' .. id }) end
    s.run_at = s.time
    if mode == 'in' then s.run_at = now + s.time end
    r = bounded(r, 'deps', 0, MAX_MS)
    o = bounded(o, 'optional_deps', 0, MAX_MS)
    if r + o > LIMITS.MAX_DEPS_PER_TASK then
      -- Named as the Python client names it: the list over the cap, else both together.
      error({ err = 'BADARG ' .. (o > LIMITS.MAX_DEPS_PER_TASK and 'optional_deps' or 'deps') .. ' of '
        .. id .. ' at most ' .. LIMITS.MAX_DEPS_PER_TASK .. ' dependencies per task (MAX_DEPS_PER_TASK)' })
    end
    edges = edges + r + o
    if edges > LIMITS.MAX_EDGES_PER_CALL then
      error({ err = 'BADARG deps at most ' .. LIMITS.MAX_EDGES_PER_CALL .. ' dependencies per call (MAX_EDGES_PER_CALL)' })
    end
    -- Most tasks have none: they share one empty list (never written to).
    s.deps = (r + o == 0 and not (opts and (opts.hold or opts.wait))) and NO_DEPS or {}
    -- The hold, or a waitpoint's wait, leads the list (lib/graph.lua): it waits like a
    -- dependency nothing settles.
    local held = (opts and (opts.hold or opts.wait)) and 1 or 0
    if opts and opts.hold then s.deps[1] = { kind = 'h', id = id } end
    if opts and opts.wait then s.deps[1] = { kind = 'w', id = itoa(opts.wait) } end
    pos = pos + 3
    local seen = r + o > 0 and {} or nil
    for j = 1, r + o do
      local d = ARGV[pos]
      local field = (j <= r) and 'deps' or 'optional_deps'
      if not d then error({ err = 'BADARG ARGV length does not match the counts' }) end
      check_id(d, field)
      if d == id then error({ err = 'BADARG ' .. field .. ' ' .. id .. ' depends on itself' }) end
      if seen[d] then error({ err = 'BADARG ' .. field .. ' ' .. d .. ' listed twice' }) end
      seen[d] = true
      s.deps[held + j] = { kind = (j <= r) and 'r' or 'o', id = d }
      pos = pos + 1
    end
    batch[id] = s
    specs[i] = s
  end
  -- A cost is checked against the rate its key has now (a rate lowered later makes such a
  -- task wait for a full bucket and take all of it: lib/fair.lua).
  for _, s in ipairs(specs) do
    if s.opts and s.opts.cost and s.opts.cost > 1 then
      local key = s.opts.key or ''
      local count = tonumber(string.match(redis.call('HGET', k.fair, 'rate:' .. key) or '', '^(%d+) '))
      if count and s.opts.cost > count then
        error({ err = 'BADARG cost of ' .. s.id .. ' is ' .. s.opts.cost .. ' units, more than the rate of its key ('
          .. count .. ' per window): it could never start' })
      end
    end
  end
  -- An optional last value: the caller's own payload limit, which can only lower the
  -- namespace's (lib/payload.lua).
  local asked = nil
  if pos == #ARGV then
    asked = to_int(ARGV[pos], 'max_payload_bytes')
    if asked < 1 then error({ err = 'BADARG max_payload_bytes must be >= 1' }) end
  elseif pos ~= #ARGV + 1 then
    error({ err = 'BADARG ARGV length does not match the counts' })
  end
  local limit = payload_limit(asked)
  -- Sizes first: no payload is read before the call is known to be within its caps.
  local payload_bytes = 0
  for _, s in ipairs(specs) do
    if #s.payload > limit then
      error({ err = 'BADARG payload of ' .. s.id .. ' ' .. payload_problem(s.payload, limit) })
    end
    payload_bytes = payload_bytes + #s.payload
  end
  if payload_bytes > LIMITS.MAX_PAYLOAD_BYTES_PER_CALL then
    error({ err = 'BADARG payload at most ' .. LIMITS.MAX_PAYLOAD_BYTES_PER_CALL
      .. ' bytes of payloads per call (MAX_PAYLOAD_BYTES_PER_CALL)' })
  end
  check_call_payloads(specs, limit)

  -- The current records of the whole batch, read in slices of one HMGET each.
  for first = 1, n, 1000 do
    local ids = {}
    for i = first, math.min(first + 999, n) do ids[#ids + 1] = specs[i].id end
    local raws = redis.call('HMGET', k.tasks, unpack(ids))
    for j, raw in ipairs(raws) do
      local s = specs[first + j - 1]
      if raw then s.old = load_given(s.id, raw) end
      if s.opts and s.opts.dedupe and dedupe_keeps(s.opts.dedupe, s.old, now) then
        s.kept = true
      else
        if s.old and s.old.state == 'running' then error({ err = 'CONFLICT running ' .. s.id }) end
        if jobs_pending then busy_check(s.id) end
        if s.opts and s.opts.debounce then
          s.run_at, s.first = debounce_run_at(s.id, s.opts.debounce, s.old, s.run_at, now)
        end
      end
    end
  end

  -- A kept task takes no further part: it counts as a dependency outside the batch
  -- in the state it has.
  local outside, outside_ids = {}, {}
  if admitting then
    local live = {}
    for _, s in ipairs(specs) do
      if s.kept then
        batch[s.id] = nil
        outside[s.id] = s.old.state
      else
        live[#live + 1] = s
      end
    end
    all_specs, specs = specs, live
  end

  -- The states of the dependencies outside the batch, read in slices of one HMGET each
  -- (nothing this script writes changes them before the end), then unknown dependencies,
  -- and the batch's own edges (parent -> batch children).
  for _, s in ipairs(specs) do
    for _, d in ipairs(s.deps) do
      if not NO_EDGE[d.kind] and not batch[d.id] and outside[d.id] == nil then
        outside[d.id] = false
        outside_ids[#outside_ids + 1] = d.id
      end
    end
  end
  for first = 1, #outside_ids, 1000 do
    local ids = { unpack(outside_ids, first, math.min(first + 999, #outside_ids)) }
    for j, raw in ipairs(redis.call('HMGET', k.tasks, unpack(ids))) do
      if raw then outside[ids[j]] = load_given(ids[j], raw).state end
    end
  end
  local children = {}
  for _, s in ipairs(specs) do
    for _, d in ipairs(s.deps) do
      if not NO_EDGE[d.kind] then
        if not batch[d.id] and not outside[d.id] and not s.allow_unknown then
          error({ err = 'UNKNOWN ' .. hex_id(s.id) .. ' ' .. hex_id(d.id) })
        end
        children[d.id] = children[d.id] or {}
        table.insert(children[d.id], s.id)
      end
    end
  end

  -- A task with no dependency awaits nothing, so no cycle can pass through it.
  local starts = {}
  for _, s in ipairs(specs) do
    if #s.deps > 0 then starts[#starts + 1] = s end
  end
  check_cycles(starts, batch, children)

  -- Topological order of the batch (dependencies first), so that a task sees the
  -- state its batch dependencies get.
  local placed = {}
  for _, root in ipairs(specs) do
    if #root.deps == 0 then
      -- Nothing to place before it.
      if not placed[root.id] then
        placed[root.id] = true
        order[#order + 1] = root
      end
    elseif not placed[root.id] then
      placed[root.id] = true
      local stack = { { s = root, i = 0 } }
      while #stack > 0 do
        local top = stack[#stack]
        top.i = top.i + 1
        local d = top.s.deps[top.i]
        if d == nil then
          order[#order + 1] = top.s
          stack[#stack] = nil
        elseif batch[d.id] and not placed[d.id] then
          placed[d.id] = true
          stack[#stack + 1] = { s = batch[d.id], i = 0 }
        end
      end
    end
  end

  -- Versions follow the submission order (they are the queue's sequence numbers),
  -- whatever order the dependencies make us write the tasks in.
  local fresh = #specs
  local last = fresh > 0 and redis.call('HINCRBY', k.meta, 'seq', itoa(fresh)) or 0
  local reply, written, blocked_any = { 0 }, {}, false
  for i, s in ipairs(specs) do
    s.version = last - fresh + i
    reply[i + 1] = s.version
  end
  if admitting then
    local flags = {}
    for i, s in ipairs(all_specs) do
      reply[i + 1] = s.kept and s.old.version or s.version
      flags[i] = s.kept and 'k' or 'n'
      if s.first then
        redis.call('HSET', k.debounce, s.id, string.format('%d %d', s.version, s.first))
      elseif s.old and not s.kept then
        redis.call('HDEL', k.debounce, s.id)
      end
      local deadline = s.opts and not s.kept and deadline_of(s.opts, now)
      if deadline then redis.call('ZADD', k.deadlines, deadline, deadline_member(s.version, s.id)) end
      -- A waitpoint's first check (lib/deadline.lua): its timeout when it awaits nothing else.
      if s.opts and s.opts.wait and not s.kept then
        redis.call('ZADD', k.deadlines, now + s.opts.wait, waitpoint_member(s.id))
      end
    end
    reply[#all_specs + 2] = table.concat(flags)
  end
  -- Fairness keys (lib/fair.lua): the first keyed task turns the namespace fair; each
  -- new version carries its key (or none), read by enqueue.
  local fair_keys = {}
  for _, s in ipairs(specs) do
    if s.opts and s.opts.key then fair_keys[#fair_keys + 1] = s end
  end
  if #fair_keys > 0 and not fair_on(c) then fair_turn_on(c, now) end
  if fair_on(c) then
    for _, s in ipairs(specs) do
      if s.opts and s.opts.key then
        redis.call('HSET', k.fairkeys, s.id, s.opts.key)
      elseif s.old then
        redis.call('HDEL', k.fairkeys, s.id)
      end
    end
  end
  -- Costs (lib/fair.lua): kept only when other than 1, replaced with each new version.
  for _, s in ipairs(specs) do
    local cost = s.opts and s.opts.cost
    if cost and cost > 1 then
      redis.call('HSET', k.costs, s.id, cost)
    elseif s.old then
      redis.call('HDEL', k.costs, s.id)
    end
  end
  local function state_of(id)
    if written[id] then return written[id] end
    if outside[id] ~= nil then return outside[id] or nil end
    return record_state(id)
  end
  -- A new task without dependencies is always ready: its writes are gathered and sent
  -- as one command per key for the whole batch.
  -- Payloads go into the records when small (lib/record.lua), else the payloads hash;
  -- a replaced version's entry there is removed.
  local records, payloads, entries, ranks, moved = {}, {}, {}, {}, {}
  local aging = order_aging(c)
  for _, s in ipairs(order) do
    s.inline = payload_inline(s.payload) and s.payload
    if not s.old and #s.deps == 0 then
      local t = {
        state = 'ready', version = s.version, attempt = 0, max_attempts = s.max_attempts,
        backoff_ms = s.backoff, run_at = s.run_at, priority = s.priority, cancel = 0,
        updated = now, remaining = 0, optional = 0, worker = '', payload = s.inline or nil,
      }
      count_move(c, nil, 'ready')
      local member = queue_member(t, s.id)
      note_enqueued(c, member, s.run_at)
      records[#records + 1] = s.id
      records[#records + 1] = encode_task(t)
      if fair_on(c) then
        enqueue(c, t, s.id)
      elseif aging and s.run_at <= now then
        ranks[#ranks + 1] = rank_of(s.run_at, s.priority, aging)
        ranks[#ranks + 1] = member
      else
        entries[#entries + 1] = itoa(s.run_at)
        entries[#entries + 1] = member
      end
      written[s.id] = 'ready'
    else
      written[s.id] = select(2, write_version(c, s.id, s.old, s, s.deps, now, state_of, s.version))
      if written[s.id] == 'blocked' then blocked_any = true end
    end
    if not s.inline then
      payloads[#payloads + 1] = s.id
      payloads[#payloads + 1] = s.payload
    elseif s.old and not s.old.payload_at then
      moved[#moved + 1] = s.id
    end
  end
  call_many('HSET', k.tasks, records)
  call_many('HSET', k.payloads, payloads)
  call_many('HDEL', k.payloads, moved)
  call_many('ZADD', k.queue, entries)
  call_many('ZADD', k.ranked, ranks)
  -- Only a blocked task, or work already waiting, needs the propagation budget here.
  if jobs_pending or blocked_any then reply[1] = settle_after_terminal(c, {}, now, budget) end
  end_call(c)
  return reply
end)
