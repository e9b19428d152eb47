-- lib/window.lua: a spawn's window, the most of its children ready or running at once.
--
--- @include workflow
--- @include queue
--- @include counts
--
-- A spawn with a window w (spawn.lua) writes its first w children ready and the others
-- pending, held by the window: their record counts one awaited dependency (remaining 1)
-- with no dependency list and no edge, so nothing but the window settles it. Every child
-- of a windowed spawn has flag 'w' in parents (lib/workflow.lua). The held children wait
-- in the window sorted set (every score 0), in the order given:
--   hex3(#parent) .. parent .. hex8(order) .. child
-- so a parent's line is one ZRANGEBYLEX away, its first member the next to go. The
-- windows hash holds, per parent, '<w> <holding>': its window and how many of its
-- children hold a slot (ready or running, or ended without passing the slot on yet).
-- Every ending goes through end_task (lib/ended.lua), which calls window_slot_back: a
-- windowed child that ends while it waits leaves the line; one that held a slot passes it
-- to the first child in line (ready at once), or gives it back when none waits. So at most
-- w children of a parent are ready or running at any time, started in the order given,
-- without a scheduler process. A retried child (retry.lua) runs again outside the window.

-- The most stale members (a record no longer held by the window) one ending skips.
local WINDOW_SKIPS = 8

local function window_member(parent, order, child)
  return wf_prefix(parent) .. string.format('%08x', order) .. child
end

-- (window, holding) of parent's windows entry, or nil for none (or junk).
local function window_of(parent)
  local w, holding = string.match(redis.call('HGET', k.windows, parent) or '', '^(%d+) (%d+)$')
  if not w then return nil end
  return tonumber(w), tonumber(holding)
end

-- Task id (t: its record as it was before its ending) ends: when it is a windowed child,
-- it leaves the line (it was waiting), or its slot goes to the next child in line.
local function window_slot_back(c, id, t, now)
  local parent, _, _, flag, order = parse_parent(redis.call('HGET', k.parents, id))
  if flag ~= 'w' then return end
  if t.state == 'pending' then
    redis.call('ZREM', k.window, window_member(parent, order, id))
    return
  end
  local w, holding = window_of(parent)
  if not w then return end
  local prefix = wf_prefix(parent)
  for _ = 1, WINDOW_SKIPS do
    local head = redis.call('ZRANGEBYLEX', k.window, '[' .. prefix, '(' .. prefix .. '\255', 'LIMIT', '0', '1')[1]
    if not head then break end
    redis.call('ZREM', k.window, head)
    local next_id = string.sub(head, #prefix + 9)
    local nt = load_task(next_id)
    if nt and nt.state == 'pending' and nt.remaining > 0 then
      nt.remaining = nt.remaining - 1
      nt.updated = now
      if nt.remaining <= 0 and nt.optional <= 0 then
        count_move(c, 'pending', 'ready')
        nt.state = 'ready'
        save_task(next_id, nt)
        enqueue(c, nt, next_id)
      else
        save_task(next_id, nt)
      end
      return  -- the slot passed on: holding stays
    end
  end
  if holding <= 1 then
    redis.call('HDEL', k.windows, parent)
  else
    redis.call('HSET', k.windows, parent, string.format('%d %d', w, holding - 1))
  end
end
