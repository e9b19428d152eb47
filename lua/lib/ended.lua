-- lib/ended.lua: telling clients that wait for a task that it ended.
--
--- @include record
--- @include idle
--
-- A client waiting for a task's outcome (Scheduler.wait) first adds the task id to the
-- waits sorted set (score: the time, ms, until which it waits; ZADD GT), then reads the
-- task's state, then waits for a message on the ended channel: a task that ends between
-- its read and its wait still finds the entry. Every record saved in a terminal state
-- is noted here (lib/record.lua's save_task calls on_terminal_save); once the script's
-- body has succeeded, each noted id that has a waits entry loses it and is published
-- as '<state> <id>' on ended. A task nobody waits for costs a ZMSCORE. Entries whose
-- time has passed are dropped by reap.lua (housekeeping), a bounded number per call.

local ended_ids, ended_state = {}, {}
on_each_call(function()
  if next(ended_ids) or next(ended_state) then ended_ids, ended_state = {}, {} end
end)

on_terminal_save = function(id, state)
  if not ended_state[id] then ended_ids[#ended_ids + 1] = id end
  ended_state[id] = state
end

after_success(function()
  for i = 1, #ended_ids, 1000 do
    local ids = { unpack(ended_ids, i, math.min(i + 999, #ended_ids)) }
    local scores = redis.call('ZMSCORE', k.waits, unpack(ids))
    for j, score in ipairs(scores) do
      if score then
        redis.call('ZREM', k.waits, ids[j])
        publish(k.ended, ended_state[ids[j]] .. ' ' .. ids[j])
      end
    end
  end
end)
