-- lib/ranked.lua: the priority-first order of a namespace (meta fields order, aging_ms).
--
--- @include record
--
-- In the default order the queue key holds every ready task, due or not, scored by the
-- time it is due. A namespace whose meta field order is 'priority' keeps two sets:
-- queue, the delayed set (same members and scores: entries not moved yet), and ranked,
-- the ready set of due entries scored by their rank
--   rank = due time (ms) - priority * aging_ms
-- (priority as a credit of aging_ms per point), equal ranks in member order (higher
-- priority, then version). Claims move due entries from queue into ranked, at most
-- MOVE_MAX per call in due order, and pop the ranked head; schedule.lua puts a task
-- that is due when submitted straight into ranked. A ranked member is the queue member
-- it was (lib/record.lua), so the stale-entry rules are the same in both sets.

local MOVE_MAX = 1000

-- The meta fields order and aging_ms as read: nil in the default order, else aging_ms
-- (a number >= 0; junk, never written by order.lua, counts as no credit).
local function aging_of(order, aging_ms)
  if order ~= 'priority' then return nil end
  local aging = tonumber(aging_ms)
  if not aging or aging < 0 or aging ~= math.floor(aging) then aging = 0 end
  return aging
end

-- aging_of the namespace's meta fields, read once per call; with them the meta field
-- fair (lib/fair.lua), so that a namespace's settings cost one read per call.
local cached_aging, cached_fair
on_each_call(function() cached_aging, cached_fair = false, nil end)
local function order_aging()
  if cached_aging == false then
    local fields = meta_fields('order', 'aging_ms', 'fair')
    cached_aging = aging_of(fields[1], fields[2])
    if cached_fair == nil then cached_fair = fields[3] == '1' end
  end
  return cached_aging
end

-- The priority a queue member carries; 0 for a member whose head is junk.
local function member_priority(member)
  local head = string.sub(member, 1, 8)
  if #head ~= 8 or not string.match(head, '^%x+$') then return 0 end
  return 2147483647 - tonumber(head, 16)
end

local function rank_of(due, priority, aging)
  return due - priority * aging
end

-- Move the entries of queue due at `now` into ranked, at most MOVE_MAX, in due order.
-- Returns how many moved (due entries beyond MOVE_MAX are moved by the next calls).
local function move_due(now, aging)
  local due = redis.call('ZRANGEBYSCORE', k.queue, '-inf', now, 'WITHSCORES', 'LIMIT', 0, MOVE_MAX)
  local moved = #due / 2
  if moved == 0 then return 0 end
  local adds = {}
  for i = 1, #due, 2 do
    adds[#adds + 1] = rank_of(tonumber(due[i + 1]), member_priority(due[i]), aging)
    adds[#adds + 1] = due[i]
  end
  call_many('ZADD', k.ranked, adds)
  -- ZRANGEBYSCORE from -inf: the entries read are the first `moved` ranks.
  redis.call('ZREMRANGEBYRANK', k.queue, 0, moved - 1)
  return moved
end
