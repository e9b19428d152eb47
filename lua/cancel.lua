-- cancel.lua: cancel one task.
--
-- pending / ready -> cancelled, atomically: a claim racing with it either ran
-- first (the task is running) or will find it cancelled and drop its entry.
-- running: cancel_requested is recorded and published, so the holder learns
-- it at once (and from its next heartbeat in any case). Terminal: nothing changes. O(1): the queue entry is left for the
-- claim script to drop.
--
-- KEYS[1] tasks     hash: id -> task record
-- KEYS[2] finished  sorted set: terminal ids by time
-- KEYS[3] meta      hash: per-state counts
-- KEYS[4] wake      pub/sub channel: 'cancel <version> <id>' for a running task
--
-- ARGV[1] task id
--
-- Reply: the state after the call ('cancelled', 'running' or the terminal state).
-- Errors: NOTFOUND <id>.

local k = { tasks = KEYS[1], finished = KEYS[2], meta = KEYS[3], wake = KEYS[4] }
local id = ARGV[1]
local t = load_task(k.tasks, id)
if not t then return redis.error_reply('NOTFOUND ' .. id) end
if t.err then return t end

if t.state == 'pending' or t.state == 'ready' then
  local now = now_ms()
  count_move(k.meta, t.state, 'cancelled')
  t.state = 'cancelled'
  t.updated = now
  save_task(k.tasks, id, t)
  redis.call('ZADD', k.finished, now, id)
  return 'cancelled'
end
if t.state == 'running' and t.cancel == 0 then
  t.cancel = 1
  save_task(k.tasks, id, t)
  redis.call('PUBLISH', k.wake, string.format('cancel %d ', t.version) .. id)
end
return t.state
