-- recur.lua: store, replace or remove a schedule (a recurring task).
--
--- @include fires
--- @keys meta idle schedules fires firing
--
-- A schedule is its definition (field <name> of schedules: a msgpack map that only the
-- clients read: function, arguments, cron or interval, overlap policy, ...), its next
-- fire time (fires, absent while paused or ended) and its firing state (firing:
-- rev|fired|skipped|missed|last task id). 'put' writes the definition and the next fire
-- time with a new rev, keeping the counters and the last task id of a schedule it
-- replaces: a fire.lua call prepared from the old definition is then refused, and the
-- overlap policy still sees the run the old definition started. 'remove' deletes all
-- three; the tasks already created stay. 'drop' takes a schedule out of fires only when
-- its definition or firing state is missing or cannot be read (junk written by other
-- means), so that workers are not told again and again that it is due. No task changes
-- state.
--
-- Writes schedules, fires, firing; wakes one idle worker when the head of fires is
-- earlier than what the timer worker waits for (lib/fires.lua).
--
-- Publishes: 'ready' on the channel of one idle worker (lib/idle.lua) when the head of
-- fires is earlier than what the timer worker waits for (lib/fires.lua).
--
-- ARGV[1] 'put', 'remove' or 'drop'
-- ARGV[2] the schedule name (valid UTF-8, 1..256 bytes)
-- put:
-- ARGV[3] rev: the definition's revision, 1..64 bytes without '|' (distsched: random hex)
-- ARGV[4] definition: one msgpack map
-- ARGV[5] next fire time (epoch ms), or '' for none (paused, or past its end)
--
-- Reply: { 0, 1 when the schedule existed before the call, else 0 }; for 'drop': { 0, 1
-- when it was taken out of fires, else 0 }.
-- Errors (nothing written): BADARG op|name|rev|definition|next_ms <why>.
-- Cost: O(log S) in the number of schedules.

return run(function(c)
  local op = ARGV[1]
  if op ~= 'put' and op ~= 'remove' and op ~= 'drop' then
    error({ err = 'BADARG op must be put, remove or drop' })
  end
  local name = check_name(ARGV[2])
  local existed = redis.call('HEXISTS', k.schedules, name)
  if op == 'drop' then
    if #ARGV ~= 2 then error({ err = 'BADARG ARGV expected: drop name' }) end
    if existed == 1 and read_firing(name) then return { 0, 0 } end
    redis.call('ZREM', k.fires, name)
    return { 0, 1 }
  end
  if op == 'remove' then
    if #ARGV ~= 2 then error({ err = 'BADARG ARGV expected: remove name' }) end
    redis.call('HDEL', k.schedules, name)
    redis.call('HDEL', k.firing, name)
    redis.call('ZREM', k.fires, name)
    return { 0, existed }
  end
  if #ARGV ~= 5 then error({ err = 'BADARG ARGV expected: put name rev definition next_ms' }) end
  local rev, definition, next_text = ARGV[3], ARGV[4], ARGV[5]
  if rev == '' or #rev > 64 or string.find(rev, '|', 1, true) then
    error({ err = 'BADARG rev must be 1..64 bytes without |' })
  end
  if head(definition, 1) ~= 'map' or skip(new_walk(math.huge), definition, 1) ~= #definition + 1 then
    error({ err = 'BADARG definition must be one msgpack map' })
  end
  local next_ms = nil
  if next_text ~= '' then next_ms = int_arg(next_text, 'next_ms', -MAX_MS, MAX_MS) end

  local f = read_firing(name) or { fired = 0, skipped = 0, missed = 0, last = '' }
  f.rev = rev
  save_firing(name, f)
  redis.call('HSET', k.schedules, name, definition)
  if next_ms then
    redis.call('ZADD', k.fires, next_ms, name)
    fires_changed(now_ms(c))
  else
    redis.call('ZREM', k.fires, name)
  end
  return { 0, existed }
end)
