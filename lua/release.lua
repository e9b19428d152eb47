-- release.lua: hand back claims whose function never started (worker shutdown).
--
-- running -> ready with the attempt given back (no attempt spent), at its own
-- run_at and priority; running -> cancelled instead when cancellation was
-- requested meanwhile (the function never ran). Fenced by the token: a stale
-- token changes nothing.
--
-- KEYS[1] tasks     hash: id -> task record
-- KEYS[2] queue     sorted set: the ready queue
-- KEYS[3] leases    sorted set: id -> lease deadline
-- KEYS[4] meta      hash: per-state counts, max_running
-- KEYS[5] wake      pub/sub channel
-- KEYS[6] finished  sorted set: terminal ids by time
--
-- ARGV[1] n; then 3 values per token: id, version, attempt
--
-- Reply: array of n integers: 1 handed back (ready, or cancelled), 0 stale (left as it is).
-- Publishes on KEYS[5] so that another worker picks the tasks up at once.

local k = { tasks = KEYS[1], queue = KEYS[2], leases = KEYS[3], meta = KEYS[4], wake = KEYS[5],
            finished = KEYS[6] }
local n, err = to_int(ARGV[1], 'n'); if not n then return err end
if #ARGV ~= 1 + 3 * n then return redis.error_reply('BADARG ARGV expected 3 values per token') end

local now = now_ms()
local running_before = running_count(k.meta)
local reply = {}
local released = 0
for i = 1, n do
  local base = 1 + 3 * (i - 1)
  local id = ARGV[base + 1]
  local t = load_task(k.tasks, id)
  if t and t.err then return t end
  if t and t.state == 'running' and t.version == tonumber(ARGV[base + 2])
      and t.attempt == tonumber(ARGV[base + 3]) then
    redis.call('ZREM', k.leases, id)
    t.attempt = t.attempt - 1
    t.worker = ''
    t.updated = now
    if t.cancel == 1 then
      count_move(k.meta, 'running', 'cancelled')
      t.state = 'cancelled'
      redis.call('ZADD', k.finished, now, id)
    else
      count_move(k.meta, 'running', 'ready')
      t.state = 'ready'
      enqueue(k.queue, t, id)
    end
    save_task(k.tasks, id, t)
    released = released + 1
    reply[i] = 1
  else
    reply[i] = 0
  end
end
if released > 0 then
  redis.call('PUBLISH', k.wake, 'ready')
  capacity_freed(k.meta, k.wake, running_before)
end
return reply
