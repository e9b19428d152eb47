-- lib/queue.lua: putting ready tasks into the queue, and waking idle workers for them.
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
-- enqueue notes each entry in c.enqueued (queue member -> its score, run_at ms); at its
-- end the script calls wake_for_enqueued: one idle worker is woken per entry added that
-- is due now; when none is, and one of them is then the queue head (not due yet), one
-- idle worker is woken to wait for it by its timer.

-- Note an entry the call added (score: when it is due), for wake_for_enqueued.
local function note_enqueued(c, member, score)
  call_table(c, 'enqueued')[member] = score
end

local function enqueue(c, t, id)
  local member = queue_member(t, id)
  local aging = order_aging(c)
  local now = now_ms(c)
  if fair_on(c) then
    -- A fair namespace (lib/fair.lua): the task's key takes part in the claims.
    local key = fair_key_of(id)
    if key ~= '' then
      member = fair_member(key, t, id)
      if aging and t.run_at <= now then
        -- Due now in the priority order: straight into its key's ranked section.
        member = fairq_ranked_member(fair_prefix(key), fair_due(t.run_at), queue_member(t, id), aging)
      end
      redis.call('ZADD', k.fairq, '0', member)
    elseif aging and t.run_at <= now then
      redis.call('ZADD', k.ranked, rank_of(t.run_at, t.priority, aging), member)
    else
      redis.call('ZADD', k.queue, itoa(t.run_at), member)
    end
    fair_activate(key, t.run_at, now)
  elseif aging and t.run_at <= now then
    redis.call('ZADD', k.ranked, rank_of(t.run_at, t.priority, aging), member)
  else
    redis.call('ZADD', k.queue, itoa(t.run_at), member)
  end
  note_enqueued(c, member, t.run_at)
end

-- Wake idle workers for the entries the call added (enqueue, note_enqueued).
local function wake_for_enqueued(c)
  local enqueued = c.enqueued
  if not enqueued then return end
  local now = now_ms(c)
  local due = 0
  for _, score in pairs(enqueued) do
    if score <= now then due = due + 1 end
  end
  if due == 0 then
    local head = redis.call('ZRANGE', k.queue, '0', '0')
    if head[1] and enqueued[head[1]] then due = 1 end
  end
  wake_idle(due, now)
end
