-- lib/queue.lua: putting ready tasks into the queue, and waking idle workers.
--
--- @include record
--- @include idle
--- @include ranked
--- @include fair
--
-- In a fair namespace the entry goes where its fairness key says (lib/fair.lua); a
-- keyed entry goes to its key's delayed section, or in the priority order, when due
-- now, to its ranked section (lib/ranked.lua).
-- In a namespace of the priority order a task due now goes straight into the ready set
-- (ranked), one not due yet into queue, whose due entries claims move (lib/ranked.lua).
--
-- At the end of the script, one idle worker is woken per entry it added that is due
-- now; when none is, and one of them is then the queue head (not due yet), one idle
-- worker is woken to wait for it by its timer.

-- queue member -> its score (run_at, ms); a member marked true counts only as a new head
local enqueued = {}
on_each_call(function() if next(enqueued) then enqueued = {} end end)

local function enqueue(t, id)
  local member = queue_member(t, id)
  local aging = order_aging()
  if fair_on() then
    -- A fair namespace (lib/fair.lua): the task's key takes part in the claims.
    local key = fair_key_of(id)
    if key ~= '' then
      member = fair_member(key, t, id)
      if aging and t.run_at <= now_ms() then
        -- Due now in the priority order: straight into its key's ranked section.
        member = fairq_ranked_member(fair_prefix(key), fair_due(t.run_at), queue_member(t, id), aging)
      end
      redis.call('ZADD', k.fairq, '0', member)
    elseif aging and t.run_at <= now_ms() then
      redis.call('ZADD', k.ranked, rank_of(t.run_at, t.priority, aging), member)
    else
      redis.call('ZADD', k.queue, itoa(t.run_at), member)
    end
    fair_activate(key, t.run_at, now_ms())
  elseif aging and t.run_at <= now_ms() then
    redis.call('ZADD', k.ranked, rank_of(t.run_at, t.priority, aging), member)
  else
    redis.call('ZADD', k.queue, itoa(t.run_at), member)
  end
  enqueued[member] = t.run_at
end

after_success(function()
  if next(enqueued) then
    local now = now_ms()
    local due = 0
    for _, score in pairs(enqueued) do
      if type(score) == 'number' and score <= now then due = due + 1 end
    end
    if due == 0 then
      local head = redis.call('ZRANGE', k.queue, '0', '0')
      if head[1] and enqueued[head[1]] then due = 1 end
    end
    wake_idle(due, now)
  end
end)
