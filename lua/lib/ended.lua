-- lib/ended.lua: a task ending, and telling the clients that wait for it.
--
--- @include record
--- @include idle
--- @include counts
--- @include fair
--- @include window
--
-- A client waiting for a task's outcome (Scheduler.wait) first adds the task id to the
-- waits sorted set (score: the time, ms, until which it waits; ZADD GT), then reads the
-- task's state, then waits for a message on the ended channel: a task that ends between
-- its read and its wait still finds the entry. Every task a script ends goes through
-- end_task, which notes it in c.ended; at its end the script calls tell_waiters: each
-- noted id that has a waits entry loses it and is published as '<state> <id>' on ended.
-- A task nobody waits for costs a ZMSCORE. Entries whose time has passed are dropped by
-- reap.lua (housekeeping), a bounded number per call.

-- Note that id ended in state (its last state of the call counts), for tell_waiters.
local function note_ended(c, id, state)
  local states = call_table(c, 'ended_state')
  if not states[id] then
    local ids = call_table(c, 'ended')
    ids[#ids + 1] = id
  end
  states[id] = state
end

-- End task id (t: its record) in terminal state `state` at now: a running one gives the
-- slot of its fairness key back (lib/fair.lua), and the task is counted (count_move), saved
-- (its member of the per-state index moves with it, lib/record.lua), listed in finished,
-- and noted for tell_waiters. A windowed child passes its slot on (lib/window.lua).
local function end_task(c, id, t, state, now)
  window_slot_back(c, id, t, now)
  if t.state == 'running' then fair_slot_back(c, id) end
  count_move(c, t.state, state)
  t.state = state
  t.updated = now
  save_task(id, t)
  redis.call('ZADD', k.finished, itoa(now), id)
  note_ended(c, id, state)
end

-- Publish '<state> <id>' on ended for each task the call ended that a client waits for.
local function tell_waiters(c)
  local all = c.ended
  if not all then return end
  for i = 1, #all, 1000 do
    local ids = { unpack(all, i, math.min(i + 999, #all)) }
    local scores = redis.call('ZMSCORE', k.waits, unpack(ids))
    for j, score in ipairs(scores) do
      if score then
        redis.call('ZREM', k.waits, ids[j])
        publish(k.ended, c.ended_state[ids[j]] .. ' ' .. ids[j])
      end
    end
  end
end
