-- leave.lua: a listening worker that stops leaves the idle set.
--
--- @include idle
--- @keys meta idle claims
--
-- Removes the worker's idle entry and its kept claim (lib/kept.lua). When it was the
-- one idle worker waiting by its clock for a queue head not due yet (the meta fields
-- timer, timer_at), it wakes another idle worker to take that over, so the head is
-- not left to the others' re-check interval. No task changes state.
--
-- Writes meta (timer, timer_at), idle, claims; publishes 'ready' on the woken
-- worker's channel.
--
-- Publishes: 'ready' on the channel of one idle worker (lib/idle.lua), to take the timer
-- over or the wake-up passed on.
--
-- ARGV[1] the worker's wake channel (ds:{NS}:w:<worker id>)
-- ARGV[2] the worker id (its field in claims)
-- ARGV[3] optional: 'pass' when a wake-up the worker got is not going to be used (a
--         worker of a pool whose slots other namespaces hold): another idle worker is
--         woken in its place ('' or absent: none).
--
-- Reply: { 0, 1 when another idle worker was woken (to take the timer over, or the
-- wake-up passed on), else 0 }.
-- Cost: O(log N) in the number of idle workers.

return run(function(c)
  local channel, worker, pass = ARGV[1], ARGV[2], ARGV[3] or ''
  if not channel or channel == '' or not worker then
    error({ err = 'BADARG ARGV expected the channel and the worker id' })
  end
  if pass ~= '' and pass ~= 'pass' then
    error({ err = "BADARG pass must be 'pass' or empty" })
  end
  local now = now_ms(c)
  redis.call('ZREM', k.idle, channel)
  redis.call('HDEL', k.claims, worker)
  local woken = 0
  if redis.call('HGET', k.meta, 'timer') == channel then
    redis.call('HDEL', k.meta, 'timer', 'timer_at')
    woken = wake_idle(1, now)
  end
  if pass == 'pass' and woken == 0 then woken = wake_idle(1, now) end
  return { 0, woken }
end)
