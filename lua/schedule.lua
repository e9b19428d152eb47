-- schedule.lua: submit a batch of tasks, each as a new version.
--
-- (none) / terminal / pending / ready -> ready. A running task is never
-- replaced: the whole batch is refused and nothing is written. The old queue
-- entry of a replaced ready task stays in the queue; the claim script drops
-- it lazily when it reaches the head.
--
-- KEYS[1] tasks     hash: id -> task record
-- KEYS[2] payloads  hash: id -> msgpack payload
-- KEYS[3] results   hash: id -> last outcome detail (cleared)
-- KEYS[4] queue     sorted set: the time-indexed ready queue
-- KEYS[5] finished  sorted set: terminal ids (a replaced terminal id leaves it)
-- KEYS[6] meta      hash: seq counter and per-state counts
-- KEYS[7] wake      pub/sub channel
--
-- ARGV[1] n, the number of tasks; then 7 values per task i (base = 1 + 7*(i-1)):
--   +1 task id
--   +2 time mode: 'at' (time is absolute epoch ms) or 'in' (ms from the server's now)
--   +3 time, integer ms
--   +4 priority, integer in [-2^31, 2^31 - 1]
--   +5 max_attempts, integer >= 1
--   +6 backoff, integer ms >= 0
--   +7 payload bytes (msgpack map)
--
-- Reply: array of the n new versions, in argument order.
-- Errors (nothing written):
--   CONFLICT running <id>   a task of the batch is running
--   BADARG <field> ...      malformed argument
-- Publishes 'ready' on KEYS[7] when a new entry became the queue head.
-- Cost: O(n log N).

local k = { tasks = KEYS[1], payloads = KEYS[2], results = KEYS[3], queue = KEYS[4],
            finished = KEYS[5], meta = KEYS[6], wake = KEYS[7] }
local n, err = to_int(ARGV[1], 'n')
if not n then return err end
if #ARGV ~= 1 + 7 * n then return redis.error_reply('BADARG ARGV expected 7 values per task') end

local now = now_ms()
local specs = {}
local seen = {}
for i = 1, n do
  local base = 1 + 7 * (i - 1)
  local id = ARGV[base + 1]
  if id == '' then return redis.error_reply('BADARG task_id must not be empty') end
  if seen[id] then return redis.error_reply('BADARG task_id duplicated in batch: ' .. id) end
  seen[id] = true
  local mode = ARGV[base + 2]
  if mode ~= 'at' and mode ~= 'in' then
    return redis.error_reply('BADARG time mode must be at or in')
  end
  local time, priority, max_attempts, backoff
  time, err = to_int(ARGV[base + 3], 'run_at'); if not time then return err end
  priority, err = to_int(ARGV[base + 4], 'priority'); if not priority then return err end
  if priority < -2147483648 or priority > 2147483647 then
    return redis.error_reply('BADARG priority out of range')
  end
  max_attempts, err = to_int(ARGV[base + 5], 'max_attempts'); if not max_attempts then return err end
  if max_attempts < 1 then return redis.error_reply('BADARG max_attempts must be >= 1') end
  backoff, err = to_int(ARGV[base + 6], 'backoff'); if not backoff then return err end
  if backoff < 0 then return redis.error_reply('BADARG backoff must be >= 0') end
  local run_at = time
  if mode == 'in' then run_at = now + time end
  local old = load_task(k.tasks, id)
  if old and old.err then return old end
  if old and old.state == 'running' then
    return redis.error_reply('CONFLICT running ' .. id)
  end
  specs[i] = { id = id, run_at = run_at, priority = priority, max_attempts = max_attempts,
               backoff = backoff, payload = ARGV[base + 7], old = old }
end

local versions = {}
local head = false
for i = 1, n do
  local s = specs[i]
  local version = redis.call('HINCRBY', k.meta, 'seq', 1)
  local t = {
    state = 'ready', version = version, attempt = 0, max_attempts = s.max_attempts,
    backoff_ms = s.backoff, run_at = s.run_at, priority = s.priority, cancel = 0,
    updated = now, remaining = 0, optional = 0, worker = '',
  }
  if s.old then
    count_move(k.meta, s.old.state, 'ready')
    if TERMINAL[s.old.state] then redis.call('ZREM', k.finished, s.id) end
  else
    count_move(k.meta, nil, 'ready')
  end
  save_task(k.tasks, s.id, t)
  redis.call('HSET', k.payloads, s.id, s.payload)
  redis.call('HDEL', k.results, s.id)
  if enqueue(k.queue, t, s.id) then head = true end
  versions[i] = version
end
if head then redis.call('PUBLISH', k.wake, 'ready') end
return versions
