-- schedule.lua: submit a batch of tasks atomically, each as a new version.
--
--- @include settle
--- @keys tasks payloads results queue finished meta idle
--- @keys edges deps blocked blockedby propagating
--
-- (none) / pending / ready / terminal -> ready, pending or blocked:
--   ready    no unfinished dependency
--   pending  a required dependency not yet succeeded, or an optional one not yet terminal
--   blocked  a required dependency already failed, cancelled or blocked
-- A running task is never replaced. A replaced task's old version forgets its
-- edges before the new ones are registered; its old queue entry stays in the
-- queue and the claim script drops it lazily. The whole batch is validated
-- before anything is written: on any error nothing changes.
-- Cycles: a batch that would close a cycle of awaited dependencies (through
-- its own tasks and existing pending ones) is refused with the cycle's path.
--
-- Writes tasks, payloads, results, queue, finished, meta, idle, edges, deps, blocked,
-- blockedby, propagating.
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1)
-- ARGV[2] n, the number of tasks; then for each task, in order:
--   id;
--   spec, eight fields joined by single spaces:
--     mode ('at': time is absolute epoch ms; 'in': ms from the server's now),
--     time (integer ms), priority (integer in [-2^31, 2^31 - 1]), max_attempts (>= 1),
--     backoff (integer ms >= 0), allow_unknown ('1' or '0'),
--     r (number of required deps), o (number of optional deps);
--   payload (msgpack map);
--   then r required dependency ids, then o optional ones.
--
-- Reply: { propagating jobs left, version 1, ..., version n }.
-- Errors (nothing written):
--   CONFLICT running <id>     a task of the batch is running
--   BUSY <id>                 a task of the batch is still telling its dependents
--                             that it ended; settle with propagate.lua and try again
--   UNKNOWN <id> <dep>        a dependency that exists nowhere (and allow_unknown is 0)
--   CYCLE <id> <id> ...       the path, each id a dependency of the next, first = last
--                             (ids in these two errors are in lowercase hex)
--   BADARG <field> ...        malformed argument
-- Wakes one idle worker per task it makes due now (lib/idle.lua).
-- Cost: O(n log N + edges), plus the pending descendants of the batch's tasks for the
-- cycle check; blocked tasks' dependents are settled within the propagation budget.

local SPEC_PATTERN = '^(%l%l) (-?%d+) (-?%d+) (%d+) (%d+) ([01]) (%d+) (%d+)$'

return run(function()
  local budget = budget_arg(ARGV[1])
  local n = to_int(ARGV[2], 'n')
  local now = now_ms()
  local specs, batch, order = {}, {}, {}
  local jobs_pending = redis.call('ZCARD', k.propagating) > 0
  local pos = 3
  for i = 1, n do
    local id = ARGV[pos]
    if not id or id == '' then error({ err = 'BADARG task_id must not be empty' }) end
    if batch[id] then error({ err = 'BADARG task_id duplicated in batch: ' .. id }) end
    local mode, time, pr, ma, bo, au, r, o = string.match(ARGV[pos + 1] or '', SPEC_PATTERN)
    if not mode then
      error({ err = 'BADARG spec of ' .. id .. ' must be: at|in time priority max_attempts backoff 0|1 r o' })
    end
    local s = {
      id = id, time = tonumber(time), priority = tonumber(pr), max_attempts = tonumber(ma),
      backoff = tonumber(bo), payload = ARGV[pos + 2], allow_unknown = au == '1', deps = {},
    }
    if not s.payload then error({ err = 'BADARG payload missing for ' .. id }) end
    if s.priority < -2147483648 or s.priority > 2147483647 then
      error({ err = 'BADARG priority out of range' })
    end
    if s.max_attempts < 1 then error({ err = 'BADARG max_attempts must be >= 1' }) end
    if s.backoff < 0 then error({ err = 'BADARG backoff must be >= 0' }) end
    s.run_at = s.time
    if mode == 'in' then
      s.run_at = now + s.time
    elseif mode ~= 'at' then
      error({ err = 'BADARG time mode must be at or in' })
    end
    r, o = tonumber(r), tonumber(o)
    pos = pos + 3
    local seen = {}
    for j = 1, r + o do
      local d = ARGV[pos]
      if not d or d == '' then error({ err = 'BADARG deps must hold non-empty ids' }) end
      if d == id then error({ err = 'BADARG deps: ' .. id .. ' depends on itself' }) end
      if seen[d] then error({ err = 'BADARG deps: ' .. d .. ' listed twice' }) end
      seen[d] = true
      s.deps[j] = { kind = (j <= r) and 'r' or 'o', id = d }
      pos = pos + 1
    end
    batch[id] = s
    specs[i] = s
  end
  if pos ~= #ARGV + 1 then error({ err = 'BADARG ARGV length does not match the counts' }) end

  -- The current records of the whole batch, read in slices of one HMGET each.
  for first = 1, n, 1000 do
    local ids = {}
    for i = first, math.min(first + 999, n) do ids[#ids + 1] = specs[i].id end
    local raws = redis.call('HMGET', k.tasks, unpack(ids))
    for j, raw in ipairs(raws) do
      local s = specs[first + j - 1]
      if raw then
        s.old = load_task(s.id, raw)
        if s.old.state == 'running' then error({ err = 'CONFLICT running ' .. s.id }) end
      end
      if jobs_pending then busy_check(s.id) end
    end
  end

  -- The states of the dependencies outside the batch, read in slices of one HMGET each
  -- (nothing this script writes changes them before the end), then unknown dependencies,
  -- and the batch's own edges (parent -> batch children).
  local outside, outside_ids = {}, {}
  for _, s in ipairs(specs) do
    for _, d in ipairs(s.deps) do
      if not batch[d.id] and outside[d.id] == nil then
        outside[d.id] = false
        outside_ids[#outside_ids + 1] = d.id
      end
    end
  end
  for first = 1, #outside_ids, 1000 do
    local ids = { unpack(outside_ids, first, math.min(first + 999, #outside_ids)) }
    for j, raw in ipairs(redis.call('HMGET', k.tasks, unpack(ids))) do
      -- Only the state is needed: its letter leads the record.
      if raw then outside[ids[j]] = STATE_NAME[string.sub(raw, 1, 1)] end
    end
  end
  local children = {}
  for _, s in ipairs(specs) do
    for _, d in ipairs(s.deps) do
      if not batch[d.id] and not outside[d.id] and not s.allow_unknown then
        error({ err = 'UNKNOWN ' .. hex_id(s.id) .. ' ' .. hex_id(d.id) })
      end
      children[d.id] = children[d.id] or {}
      table.insert(children[d.id], s.id)
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
    if not placed[root.id] then
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
  local last = redis.call('HINCRBY', k.meta, 'seq', n)
  local reply, written, blocked_any = { 0 }, {}, false
  for i, s in ipairs(specs) do
    s.version = last - n + i
    reply[i + 1] = s.version
  end
  local function state_of(id)
    if written[id] then return written[id] end
    if outside[id] ~= nil then return outside[id] or nil end
    return record_state(id)
  end
  -- A new task without dependencies is always ready: its writes are gathered and sent
  -- as one command per key for the whole batch.
  local records, payloads, entries = {}, {}, {}
  for _, s in ipairs(order) do
    if not s.old and #s.deps == 0 then
      local t = {
        state = 'ready', version = s.version, attempt = 0, max_attempts = s.max_attempts,
        backoff_ms = s.backoff, run_at = s.run_at, priority = s.priority, cancel = 0,
        updated = now, remaining = 0, optional = 0, worker = '',
      }
      count_move(nil, 'ready')
      local member = queue_member(t, s.id)
      enqueued[member] = s.run_at
      records[#records + 1] = s.id
      records[#records + 1] = encode_task(t)
      entries[#entries + 1] = s.run_at
      entries[#entries + 1] = member
      written[s.id] = 'ready'
    else
      written[s.id] = select(2, write_version(s.id, s.old, s, s.deps, now, state_of, s.version))
      if written[s.id] == 'blocked' then blocked_any = true end
    end
    payloads[#payloads + 1] = s.id
    payloads[#payloads + 1] = s.payload
  end
  call_many('HSET', k.tasks, records)
  call_many('HSET', k.payloads, payloads)
  call_many('ZADD', k.queue, entries)
  -- Only a blocked task, or work already waiting, needs the propagation budget here.
  if jobs_pending or blocked_any then reply[1] = settle_after_terminal({}, now, budget) end
  return reply
end)
