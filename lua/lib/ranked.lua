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

-- The order and fairness settings of the namespace, read once per call into c: c.aging
-- (aging_of the meta fields order and aging_ms: nil in the default order) and c.fair
-- (whether the meta field fair is '1', lib/fair.lua). A script that changes a setting
-- sets the field of c too (lib/fair.lua's fair_turn_on).
local function read_settings(c)
  if c.fair == nil then
    local fields = meta_fields(c, 'order', 'aging_ms', 'fair')
    c.aging = aging_of(fields[1], fields[2])
    c.fair = fields[3] == '1'
  end
end

-- aging_of the namespace's meta fields (read_settings).
local function order_aging(c)
  read_settings(c)
  return c.aging
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

-- A fair namespace (lib/fair.lua) keeps the entries of each key other than the default
-- one in fairq, under the key's prefix hex3(#key) key. In the default order an entry is
--   prefix hex13(due ms) <queue member>                       (the key's delayed section)
-- In the priority order a claim that visits a key first moves its due entries into the
-- key's ranked section, which sorts before the delayed one ('!' < any hex digit):
--   prefix '!' rankhex(rank) <queue member> hex13(due ms)
-- rank as for ranked above; rankhex is a fixed-width text that sorts as the number does
-- (a sign digit, then 16 hex digits, complemented for a negative rank), so a key's
-- ranked head is its entry of lowest rank, equal ranks in queue member order: the order
-- of the ranked set exactly. The due time is kept at the end to put an entry back.
local FAIR_RANKED = '!'
local FLIP = {
  ['0'] = 'f', ['1'] = 'e', ['2'] = 'd', ['3'] = 'c', ['4'] = 'b', ['5'] = 'a', ['6'] = '9',
  ['7'] = '8', ['8'] = '7', ['9'] = '6', a = '5', b = '4', c = '3', d = '2', e = '1', f = '0',
}

local function rank_hex(rank)
  if rank >= 0 then return '1' .. string.format('%016x', rank) end
  return '0' .. (string.gsub(string.format('%016x', -rank), '%x', FLIP))
end

local function fairq_ranked_member(prefix, due, qmember, aging)
  return prefix .. FAIR_RANKED .. rank_hex(rank_of(due, member_priority(qmember), aging))
    .. qmember .. string.format('%013x', due)
end

local function fairq_delayed_member(prefix, due, qmember)
  return prefix .. string.format('%013x', due) .. qmember
end

-- A fairq member's parts: its key's prefix, due ms, queue member, and whether it is in
-- the ranked section; nil for a member that is neither form.
local function fairq_parse(member)
  local n = tonumber(string.sub(member, 1, 3), 16)
  if not n or #member < 3 + n + 14 then return nil end
  local prefix = string.sub(member, 1, 3 + n)
  local rest = string.sub(member, 4 + n)
  if string.sub(rest, 1, 1) == FAIR_RANKED then
    if #rest < 1 + 17 + 13 then return nil end
    local due = tonumber(string.sub(rest, -13), 16)
    if not due then return nil end
    return prefix, due, string.sub(rest, 19, -14), true
  end
  local due = tonumber(string.sub(rest, 1, 13), 16)
  if not due then return nil end
  return prefix, due, string.sub(rest, 14), false
end
