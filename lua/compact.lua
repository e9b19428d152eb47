-- compact.lua: drop stale queue entries in bounded steps when they pile up.
--
--- @include record
--- @include ranked
--- @keys tasks queue meta ranked fairq
--
-- No state changes. A queue entry is stale when its task's record is gone, not
-- ready, or of another version (replaced or cancelled tasks leave theirs, which
-- the claim script drops lazily when they reach the head). When stale entries
-- (of queue, ranked and fairq together: the ready set of the priority order,
-- lib/ranked.lua, and the entries of a fair namespace's keyed tasks, lib/fair.lua) are
-- more than half of the entries and at least ARGV[2], this walks queue, then ranked,
-- then fairq, with ZSCAN from a cursor kept in meta (compact_cursor for queue,
-- compact_ranked for ranked, compact_fairq for fairq), at most ARGV[1] entries per call,
-- removing the stale ones (in fairq also members of neither form); a walk in progress
-- goes on until it has wrapped in all three. A claim drops a stale fairq entry only when
-- it reaches its key's head, so without this a key's replaced or cancelled tasks could
-- pile up behind its live ones.
--
-- Reads tasks, meta (count:ready); writes queue, ranked, fairq, meta (compact_cursor,
-- compact_ranked, compact_fairq).
--
-- Publishes: nothing.
--
-- ARGV[1] the most entries to examine in this call (>= 1; a larger one than
--         MAX_COMPACT_BUDGET, 2500, counts as that)
-- ARGV[2] the least number of stale entries worth a walk (>= 0)
--
-- Reply: { 0, stale entries removed, stale entries left (estimate: entries - ready tasks) }.
-- Cost: O(budget log N).

return run(function(c)
  local budget = to_int(ARGV[1], 'budget')
  local minimum = to_int(ARGV[2], 'minimum')
  if budget < 1 then error({ err = 'BADARG budget must be >= 1' }) end
  -- A budget asks for at most that much work: past the cap it counts as the cap.
  if budget > LIMITS.MAX_COMPACT_BUDGET then budget = LIMITS.MAX_COMPACT_BUDGET end
  local entries = redis.call('ZCARD', k.queue) + redis.call('ZCARD', k.ranked)
    + redis.call('ZCARD', k.fairq)
  local live = tonumber(redis.call('HGET', k.meta, 'count:ready')) or 0
  local stale = entries - live
  local cursors = redis.call('HMGET', k.meta, 'compact_cursor', 'compact_ranked', 'compact_fairq')
  local queue_cursor, ranked_cursor, fairq_cursor = cursors[1], cursors[2], cursors[3]
  if not queue_cursor and not ranked_cursor and not fairq_cursor then
    if stale < minimum or stale * 2 <= entries then return { 0, 0, stale } end
    queue_cursor = '0'
  end
  local removed, seen = 0, 0
  -- Walks set_key (fairq: with fairq members) from `cursor` within the budget left,
  -- removing its stale entries; the cursor to go on from, or nil once the walk wrapped.
  local function walk(set_key, cursor, fairq)
    repeat
      local page = redis.call('ZSCAN', set_key, cursor, 'COUNT', math.min(budget - seen, 500))
      local items = page[2]
      cursor = page[1]
      for i = 1, #items, 2 do
        local member = items[i]
        local qmember = member
        if fairq then qmember = select(3, fairq_parse(member)) or '' end
        local version, id = parse_member(qmember)
        local t = version and load_task(id) or nil
        if not t or t.state ~= 'ready' or t.version ~= version then
          removed = removed + redis.call('ZREM', set_key, member)
        end
        seen = seen + 1
      end
    until cursor == '0' or seen >= budget
    if cursor == '0' then return nil end
    return cursor
  end
  if queue_cursor then
    queue_cursor = walk(k.queue, queue_cursor, false)
    if not queue_cursor and redis.call('EXISTS', k.ranked) == 1 then ranked_cursor = '0' end
    if not queue_cursor and not ranked_cursor and redis.call('EXISTS', k.fairq) == 1 then
      fairq_cursor = '0'
    end
  end
  if ranked_cursor and not queue_cursor and seen < budget then
    ranked_cursor = walk(k.ranked, ranked_cursor, false)
    if not ranked_cursor and redis.call('EXISTS', k.fairq) == 1 then fairq_cursor = '0' end
  end
  if fairq_cursor and not queue_cursor and not ranked_cursor and seen < budget then
    fairq_cursor = walk(k.fairq, fairq_cursor, true)
  end
  -- Each walk's cursor is kept in meta while it goes on.
  local function keep(field, cursor)
    if cursor then
      redis.call('HSET', k.meta, field, cursor)
    else
      redis.call('HDEL', k.meta, field)
    end
  end
  keep('compact_cursor', queue_cursor)
  keep('compact_ranked', ranked_cursor)
  keep('compact_fairq', fairq_cursor)
  return { 0, removed, stale - removed }
end)
