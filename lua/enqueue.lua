-- enqueue.lua: schedule a batch of plain new tasks the short way, or say to use schedule.lua.
--
--- @include payload
--- @include idle
--- @keys tasks payloads queue meta idle propagating
--
-- A plain task has no dependencies and no option (dedupe, debounce, deadline, ttl, key,
-- cost, hold, wait). When every task of the batch is plain and new (no record under its
-- id), and the namespace turns no feature on (not fair, the default order, no
-- propagation job waiting, its counters readable), this writes what schedule.lua writes
-- for the same batch: each task ready, with the next version, its record in tasks (its
-- payload inline, or in payloads when larger than 512 bytes), its entry in queue (score
-- its run_at), count:ready and seq in meta, and a wake-up for each task due now. It reads
-- the namespace's settings and counters in one command and touches no key a plain task
-- does not need, so that the common case costs what it must.
-- Otherwise it writes nothing and replies which part was not plain: send the same tasks
-- to schedule.lua, which handles every case (a producer may remember 'settings' for a
-- while and go to schedule.lua first; 'tasks' depends on the batch).
--
-- Reads meta (fair, order, seq, count:ready, payload_max, clock_ms), tasks, propagating;
-- writes tasks, payloads, queue, meta (seq, count:ready), idle.
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua): one per task due
-- now, or one when a task not due yet becomes the queue head.
--
-- ARGV[1] n, the number of tasks (1..MAX_TASKS_PER_CALL, 500); then for each task, in order:
--   id (valid UTF-8 of 1..512 bytes);
--   spec, five fields joined by single spaces: mode ('at': time is absolute epoch ms;
--     'in': ms from the server's now), time (integer ms), priority (integer in
--     [-2^31, 2^31 - 1]), max_attempts (in [1, 1000000]), backoff (integer ms >= 0);
--   payload (a msgpack map, as schedule.lua checks it);
-- then, optionally, the caller's largest payload in bytes (>= 1), as for schedule.lua.
-- The ranges and caps (payload_max, MAX_PAYLOAD_VALUES, MAX_PAYLOAD_BYTES_PER_CALL,
-- MAX_PAYLOAD_VALUES_PER_CALL) are schedule.lua's.
--
-- Reply: { 0, version 1, ..., version n } when written;
--   { 0, 'schedule', 'settings' } when the namespace is fair or in the priority order;
--   { 0, 'schedule', 'tasks' } when a task of the batch exists, a propagation job waits or
--   a counter holds junk (schedule.lua repairs it). Nothing is written in either case.
-- Errors (nothing written):
--   BADARG <field> ...        malformed argument (n, task_id, spec of <id>, run_at, delay,
--                             priority, max_attempts, backoff, payload of <id>,
--                             max_payload_bytes, or a cap named in its message)
-- Cost: O(n log N).

local SPEC = '^(%l%l) (-?%d+) (-?%d+) (%d+) (%d+)$'

-- Add n to a meta counter; its new value, or nil (the counter unchanged) when it held
-- junk (lib/repair.lua's rules: not an integer, below 0, or too large to count on).
local function count_up(field, n)
  local value = redis.pcall('HINCRBY', k.meta, field, itoa(n))
  if type(value) ~= 'number' then return nil end
  if value < n or value > MAX_EXACT then
    redis.call('HINCRBY', k.meta, field, itoa(-n))
    return nil
  end
  return value
end

-- now_ms (lib/run.lua) from the clock_ms field this script read with its settings.
local function clock_now(clock_text)
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + clock_offset(clock_text) + math.floor(tonumber(t[2]) / 1000)
end

return run(function(c)
  local n = to_int(ARGV[1], 'n')
  if n < 1 or n > LIMITS.MAX_TASKS_PER_CALL then
    error({ err = 'BADARG n must be in [1, ' .. LIMITS.MAX_TASKS_PER_CALL .. '] (MAX_TASKS_PER_CALL)' })
  end
  local asked = nil
  if #ARGV == 3 * n + 2 then
    asked = to_int(ARGV[#ARGV], 'max_payload_bytes')
    if asked < 1 then error({ err = 'BADARG max_payload_bytes must be >= 1' }) end
  elseif #ARGV ~= 3 * n + 1 then
    error({ err = 'BADARG ARGV length does not match the counts' })
  end
  local meta = redis.call('HMGET', k.meta, 'fair', 'order', 'payload_max', 'clock_ms')
  local limit = payload_limit(asked, meta[3])
  local specs, ids, seen, bytes = {}, {}, {}, 0
  for i = 1, n do
    local at = 3 * i - 1
    local id = ARGV[at]
    check_id(id, 'task_id')
    if seen[id] then error({ err = 'BADARG task_id duplicated in batch: ' .. id }) end
    seen[id] = true
    local mode, time, pr, ma, bo = string.match(ARGV[at + 1], SPEC)
    if mode ~= 'at' and mode ~= 'in' then
      error({ err = 'BADARG spec of ' .. id .. ' must be: at|in time priority max_attempts backoff' })
    end
    local payload = ARGV[at + 2]
    if #payload > limit then
      error({ err = 'BADARG payload of ' .. id .. ' ' .. payload_problem(payload, limit) })
    end
    bytes = bytes + #payload
    local delay = mode == 'in'
    specs[i] = {
      id = id, payload = payload, delay = delay,
      time = bounded(time, delay and 'delay' or 'run_at', delay and -MAX_DELAY_MS or -MAX_MS,
                     delay and MAX_DELAY_MS or MAX_MS),
      priority = bounded(pr, 'priority', -2147483648, 2147483647),
      max_attempts = bounded(ma, 'max_attempts', 1, MAX_ATTEMPTS),
      backoff = bounded(bo, 'backoff', 0, MAX_MS),
    }
    ids[i] = id
  end
  if bytes > LIMITS.MAX_PAYLOAD_BYTES_PER_CALL then
    error({ err = 'BADARG payload at most ' .. LIMITS.MAX_PAYLOAD_BYTES_PER_CALL
      .. ' bytes of payloads per call (MAX_PAYLOAD_BYTES_PER_CALL)' })
  end
  check_call_payloads(specs, limit)

  if meta[1] == '1' or meta[2] == 'priority' then return { 0, 'schedule', 'settings' } end
  if redis.call('ZCARD', k.propagating) > 0 then return { 0, 'schedule', 'tasks' } end
  for _, raw in ipairs(redis.call('HMGET', k.tasks, unpack(ids))) do
    if raw then return { 0, 'schedule', 'tasks' } end
  end
  -- The counters are the first writes: one that holds junk is undone, and schedule.lua
  -- repairs it.
  if not count_up('count:ready', n) then return { 0, 'schedule', 'tasks' } end
  local last = count_up('seq', n)
  if not last then
    redis.call('HINCRBY', k.meta, 'count:ready', itoa(-n))
    return { 0, 'schedule', 'tasks' }
  end

  local now = clock_now(meta[4])
  local reply, records, payloads, entries, mine, due = { 0 }, {}, {}, {}, {}, 0
  for i, s in ipairs(specs) do
    local run_at = s.delay and now + s.time or s.time
    local version = last - n + i
    local inline = payload_inline(s.payload) and s.payload or nil
    reply[i + 1] = version
    records[2 * i - 1] = s.id
    records[2 * i] = encode_ready(version, s.max_attempts, s.backoff, run_at, s.priority, now, inline)
    if not inline then
      payloads[#payloads + 1] = s.id
      payloads[#payloads + 1] = s.payload
    end
    local member = queue_member(s, s.id, version)
    entries[2 * i - 1] = itoa(run_at)
    entries[2 * i] = member
    mine[member] = true
    if run_at <= now then due = due + 1 end
  end
  redis.call('HSET', k.tasks, unpack(records))
  if #payloads > 0 then redis.call('HSET', k.payloads, unpack(payloads)) end
  redis.call('ZADD', k.queue, unpack(entries))
  -- As lib/queue.lua's wake_for_enqueued: a task due now wakes a worker, and a task not
  -- due yet that is the new head wakes one to wait for it.
  if due == 0 then
    local head = redis.call('ZRANGE', k.queue, '0', '0')
    if head[1] and mine[head[1]] then due = 1 end
  end
  wake_idle(due, now)
  return reply
end)
