-- claim.lua: move up to n due, current, ready tasks to running with a lease.
--
-- ready -> running. Walks the queue head in order (run_at, -priority,
-- sequence). An entry whose version is not the record's current one, or whose
-- task is no longer ready, is stale: it is removed here, at most once, and
-- skipped. Each claimed task gets attempt + 1, the worker id, and a lease
-- deadline (server clock) in the leases sorted set. The per-namespace
-- max_running (meta field) bounds the running count across the fleet.
--
-- KEYS[1..14] the namespace layout of lib/keys.lua. Reads payloads, meta; writes
--   tasks, queue, leases, meta.
--
-- ARGV[1] worker id
-- ARGV[2] n, the most tasks to claim (>= 1)
-- ARGV[3] lease length in ms (>= 1)
-- ARGV[4] the most stale entries to drop in this call (bounds its run time)
--
-- Reply: { claimed, reason, delay_us, (id, version, attempt, priority, run_at, payload) * claimed }
--   reason  '' when n were claimed; else why not more:
--           'empty' (no live entry), 'not_due' (head not due yet; delay_us until it is, or 0
--           when the stale-drop bound was reached), 'capacity' (max_running reached)
--   delay_us microseconds (from the server clock's microseconds, so a waiting worker does
--           not oversleep by the part of a millisecond already gone); -1 when not meaningful.
-- Cost: O((claimed + dropped) log N).

return run(function()
  local worker = ARGV[1]
  local n = to_int(ARGV[2], 'n')
  local lease_ms = to_int(ARGV[3], 'lease_ms')
  local max_drop = to_int(ARGV[4], 'max_drop')
  if n < 1 then error({ err = 'BADARG n must be >= 1' }) end
  if lease_ms < 1 then error({ err = 'BADARG lease_ms must be >= 1' }) end

  local clock = redis.call('TIME')
  local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  local now = math.floor(now_us / 1000)
  local limit = tonumber(redis.call('HGET', k.meta, 'max_running'))
  local running = running_count()
  local out = {}
  local claimed, dropped = 0, 0
  local reason, delay = '', -1

  while claimed < n do
    local head = redis.call('ZRANGE', k.queue, 0, 0, 'WITHSCORES')
    if #head == 0 then reason = 'empty'; break end
    local member, score = head[1], tonumber(head[2])
    local version, id = parse_member(member)
    local t = load_task(id)
    if not t or t.state ~= 'ready' or t.version ~= version then
      redis.call('ZREM', k.queue, member)
      dropped = dropped + 1
      if dropped >= max_drop then reason = 'not_due'; delay = 0; break end
    elseif score > now then
      reason = 'not_due'; delay = score * 1000 - now_us; break
    elseif limit and running >= limit then
      reason = 'capacity'; break
    else
      redis.call('ZREM', k.queue, member)
      t.state = 'running'
      t.attempt = t.attempt + 1
      t.worker = worker
      t.updated = now
      save_task(id, t)
      redis.call('ZADD', k.leases, now + lease_ms, id)
      running = running + 1
      claimed = claimed + 1
      out[#out + 1] = id
      out[#out + 1] = t.version
      out[#out + 1] = t.attempt
      out[#out + 1] = t.priority
      out[#out + 1] = t.run_at
      out[#out + 1] = redis.call('HGET', k.payloads, id) or ''
    end
  end
  if claimed > 0 then
    redis.call('HINCRBY', k.meta, 'count:ready', -claimed)
    redis.call('HINCRBY', k.meta, 'count:running', claimed)
  end
  local reply = { claimed, reason, delay }
  for i = 1, #out do reply[#reply + 1] = out[i] end
  return reply
end)
