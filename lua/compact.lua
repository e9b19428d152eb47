-- compact.lua: drop stale queue entries in bounded steps when they pile up.
--
--- @include record
--- @keys tasks queue meta
--
-- No state changes. A queue entry is stale when its task's record is gone, not
-- ready, or of another version (replaced or cancelled tasks leave theirs, which
-- the claim script drops lazily when they reach the head). When stale entries
-- are more than half of the queue and at least ARGV[2], this walks the queue with
-- ZSCAN from a cursor kept in meta (compact_cursor), at most ARGV[1] entries per
-- call, removing the stale ones; a walk in progress goes on until it wraps.
--
-- Reads tasks, meta (count:ready); writes queue, meta (compact_cursor).
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
  local entries = redis.call('ZCARD', k.queue)
  local live = tonumber(redis.call('HGET', k.meta, 'count:ready')) or 0
  local stale = entries - live
  local cursor = redis.call('HGET', k.meta, 'compact_cursor')
  if not cursor and (stale < minimum or stale * 2 <= entries) then return { 0, 0, stale } end
  local removed, seen = 0, 0
  cursor = cursor or '0'
  repeat
    local page = redis.call('ZSCAN', k.queue, cursor, 'COUNT', math.min(budget - seen, 500))
    cursor = page[1]
    local items = page[2]
    for i = 1, #items, 2 do
      local member = items[i]
      local version, id = parse_member(member)
      local t = load_task(id)
      if not t or t.state ~= 'ready' or t.version ~= version then
        removed = removed + redis.call('ZREM', k.queue, member)
      end
      seen = seen + 1
    end
  until cursor == '0' or seen >= budget
  if cursor == '0' then
    redis.call('HDEL', k.meta, 'compact_cursor')
  else
    redis.call('HSET', k.meta, 'compact_cursor', cursor)
  end
  return { 0, removed, stale - removed }
end)
