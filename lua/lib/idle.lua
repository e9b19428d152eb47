-- lib/idle.lua: waking idle workers, at most one per task that can be claimed.
--
--- @include run
--
-- The idle sorted set holds the workers waiting for work: member = the worker's own
-- wake channel (ds:{NS}:w:<worker id>), score = the time (ms, server clock) until which
-- it waits without claiming again. A worker claims again before that time, so an
-- entry older than it is stale (its worker died while idle) and is dropped. A script
-- that makes r tasks claimable pops at most r live entries, the longest waiting first
-- (so work goes round the idle workers, and a dead worker's entry takes at most one
-- wake-up), and publishes 'ready' on each one's channel.
--
-- One idle worker at a time waits by its timer for a queue head that is not due yet:
-- the meta fields timer (its channel) and timer_at (the head's run_at, ms). The others
-- get no delay hint and wait for a message (or their re-check interval).

-- SPUBLISH (Redis >= 7) keeps a namespace's messages on its own shard; a server that
-- lacks it gets PUBLISH (workers choose the same way, by the server's version). A
-- wake-up is a hint: one refused (an ACL without the channel) must not undo the
-- transition, and the worker finds the work at its next re-check.
local function publish(channel, message)
  local res = redis.pcall('SPUBLISH', channel, message)
  if type(res) == 'table' and res.err then redis.pcall('PUBLISH', channel, message) end
end

-- Wake at most r idle workers; returns how many were woken.
local function wake_idle(r, now)
  if r < 1 then return 0 end
  -- Stale entries have the lowest scores, so they come out first: when one does, the
  -- rest of them go in one command and the live entries still wanted are popped after.
  local popped = redis.call('ZPOPMIN', k.idle, itoa(r))
  local woken = 0
  for i = 1, #popped, 2 do
    if tonumber(popped[i + 1]) >= now then
      publish(popped[i], 'ready')
      woken = woken + 1
    end
  end
  if woken < #popped / 2 then
    redis.call('ZREMRANGEBYSCORE', k.idle, '-inf', '(' .. itoa(now))
    popped = redis.call('ZPOPMIN', k.idle, itoa(r - woken))
    for i = 1, #popped, 2 do publish(popped[i], 'ready') end
    woken = woken + #popped / 2
  end
  return woken
end

-- Whether the worker on `channel` is still idle (so still waiting by its timer).
local function idle_live(channel, now)
  local until_ms = channel and redis.call('ZSCORE', k.idle, channel)
  return until_ms and tonumber(until_ms) >= now
end

-- After a claim by the worker listening on `channel` ('' when the caller does not
-- listen: nothing to do). short: it got fewer tasks than it asked for; due_at: the
-- not-due head's run_at (ms) when that is why, else nil; room: whether the fleet-wide
-- limit leaves room for another claim; ready_set: the key of the set of due work
-- besides queue (ranked in the priority order, lib/ranked.lua; fairready in a fair
-- namespace, lib/fair.lua), or nil. Returns whether this worker waits by the timer.
local function idle_after_claim(channel, until_ms, short, due_at, room, now, ready_set)
  if channel == '' then return true end
  local timer = redis.call('HMGET', k.meta, 'timer', 'timer_at')
  local holder, timer_at = timer[1], tonumber(timer[2])
  if holder == channel then
    redis.call('HDEL', k.meta, 'timer', 'timer_at')
    holder = false
  end
  if not short then
    redis.call('ZREM', k.idle, channel)
    -- A full batch: when more tasks are due, or a head nobody waits for, wake one more
    -- idle worker (which does the same after its own claim: a chain, not a herd).
    local head = redis.call('ZRANGE', k.queue, '0', '0', 'WITHSCORES')
    local more = head[1] and tonumber(head[2]) <= now
    if not more and ready_set then more = redis.call('ZCARD', ready_set) > 0 end
    if room and (more or (head[1] and not idle_live(holder, now))) then
      wake_idle(1, now)
    end
    return true
  end
  redis.call('ZADD', k.idle, itoa(until_ms), channel)
  if not due_at then return true end
  if idle_live(holder, now) and timer_at and timer_at <= due_at then return false end
  redis.call('HSET', k.meta, 'timer', channel, 'timer_at', itoa(due_at))
  return true
end
