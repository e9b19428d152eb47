-- compact.lua: drop stale queue entries in bounded steps when they pile up.
--
--- @include record
--- @keys tasks queue meta ranked
--
-- No state changes. A queue entry is stale when its task's record is gone, not
-- ready, or of another version (replaced or cancelled tasks leave theirs, which
-- the claim script drops lazily when they reach the head). When stale entries
-- (of queue and ranked together: the ready set of the priority order, lib/ranked.lua)
-- are more than half of the entries and at least ARGV[2], this walks queue, then
-- ranked, with ZSCAN from a cursor kept in meta (compact_cursor for queue,
-- compact_ranked for ranked), at most ARGV[1] entries per call, removing the stale
-- ones; a walk in progress goes on until it has wrapped in both.
--
-- Reads tasks, meta (count:ready); writes queue, ranked, meta (compact_cursor,
-- compact_ranked).
--
-- ARGV[1] the most entries to examine in this call (>= 1)
-- ARGV[2] the least number of stale entries worth a walk (>= 0)
--
-- Reply: { 0, stale entries removed, stale entries left (estimate: entries - ready tasks) }.
-- Cost: O(budget log N).

return run(function()
  local budget = to_int(ARGV[1], 'budget')
  local minimum = to_int(ARGV[2], 'minimum')
  if budget < 1 then error({ err = 'BADARG budget must be >= 1' }) end
  local entries = redis.call('ZCARD', k.queue) + redis.call('ZCARD', k.ranked)
  local live = tonumber(redis.call('HGET', k.meta, 'count:ready')) or 0
  local stale = entries - live
  local cursors = redis.call('HMGET', k.meta, 'compact_cursor', 'compact_ranked')
  local queue_cursor, ranked_cursor = cursors[1], cursors[2]
  if not queue_cursor and not ranked_cursor then
    if stale < minimum or stale * 2 <= entries then return { 0, 0, stale } end
    queue_cursor = '0'
  end
  local removed, seen = 0, 0
  -- Walks `key` from `cursor` within the budget left; the cursor to go on from, or nil
  -- once the walk wrapped.
  local function walk(key, cursor)
    repeat
      local page = redis.call('ZSCAN', key, cursor, 'COUNT', math.min(budget - seen, 500))
      cursor = page[1]
      local items = page[2]
      for i = 1, #items, 2 do
        local member = items[i]
        local version, id = parse_member(member)
        local t = load_task(id)
        if not t or t.state ~= 'ready' or t.version ~= version then
          removed = removed + redis.call('ZREM', key, member)
        end
        seen = seen + 1
      end
    until cursor == '0' or seen >= budget
    if cursor == '0' then return nil end
    return cursor
  end
  if queue_cursor then
    queue_cursor = walk(k.queue, queue_cursor)
    if not queue_cursor and redis.call('EXISTS', k.ranked) == 1 then ranked_cursor = '0' end
  end
  if ranked_cursor and not queue_cursor and seen < budget then
    ranked_cursor = walk(k.ranked, ranked_cursor)
  end
  if queue_cursor then
    redis.call('HSET', k.meta, 'compact_cursor', queue_cursor)
  else
    redis.call('HDEL', k.meta, 'compact_cursor')
  end
  if ranked_cursor then
    redis.call('HSET', k.meta, 'compact_ranked', ranked_cursor)
  else
    redis.call('HDEL', k.meta, 'compact_ranked')
  end
  return { 0, removed, stale - removed }
end)
