-- lib/queue.lua: putting ready tasks into the queue, and waking waiting workers.
--
--- @include record
--
-- Waiting workers are woken once, at the end of the script, if one of the entries
-- it added is then the queue head.

local enqueued = {}

local function enqueue(t, id)
  local member = queue_member(t, id)
  redis.call('ZADD', k.queue, t.run_at, member)
  enqueued[member] = true
end

after_success(function()
  if next(enqueued) then
    local head = redis.call('ZRANGE', k.queue, 0, 0)
    if head[1] and enqueued[head[1]] then redis.call('PUBLISH', k.wake, 'ready') end
  end
end)
