-- claim.lua: move up to n due, current, ready tasks to running with a lease.
--
--- @include record
--- @include counts
--- @include kept
--- @keys tasks payloads queue leases meta idle claims
--
-- ready -> running. Walks the queue head in order (run_at, -priority,
-- sequence). An entry whose version is not the record's current one, or whose
-- task is no longer ready, is stale: it is removed here, at most once, and
-- skipped. Each claimed task gets attempt + 1, the worker id, and a lease
-- deadline (server clock) in the leases sorted set. The per-namespace
-- max_running (meta field) bounds the running count across the fleet.
--
-- Reads payloads, meta (max_running, count:running); writes tasks, queue, leases,
-- meta (count:ready, count:running, timer, timer_at), idle, claims.
--
-- ARGV[1] worker id
-- ARGV[2] n, the most tasks to claim (>= 1)
-- ARGV[3] lease length in ms (>= 1)
-- ARGV[4] the most stale entries to drop in this call (bounds its run time)
-- ARGV[5] optional: the caller's own wake channel (ds:{NS}:w:<worker id>), when it listens
--         on it; '' or absent: it does not (and is never registered as idle)
-- ARGV[6] with ARGV[5]: how long (ms) it waits at most before it claims again
-- ARGV[7] optional: a request id; the call's tokens are then kept in claims (field: the
--         worker id; lib/kept.lua): the same call sent again gets the same tasks, and a
--         caller whose reply was lost hands them back (release.lua)
--
-- Reply: { 0, claimed, reason, delay_us,
--          (id, version, attempt, priority, run_at_ms, payload) * claimed }
--   reason  '' when n were claimed; else why not more:
--           'empty' (no live entry), 'not_due' (head not due yet; delay_us until it is, or 0
--           when the stale-drop bound was reached), 'capacity' (max_running reached)
--   delay_us microseconds (from the server clock's microseconds, so a waiting worker does
--           not oversleep by the part of a millisecond already gone); -1 when not meaningful,
--           or when another idle worker already waits for that head (lib/idle.lua).
-- With a channel, a claim that gets fewer than n registers the caller in idle until now +
-- ARGV[6]; one that gets n while more tasks are due wakes one more idle worker.
-- Cost: O((claimed + dropped) log N), in a few commands per call whatever n is.

return run(function()
  local worker = ARGV[1]
  local n = to_int(ARGV[2], 'n')
  local lease_ms = to_int(ARGV[3], 'lease_ms')
  local max_drop = to_int(ARGV[4], 'max_drop')
  if n < 1 then error({ err = 'BADARG n must be >= 1' }) end
  if lease_ms < 1 then error({ err = 'BADARG lease_ms must be >= 1' }) end

  -- The same call sent again (a client retrying after a timeout): the same tasks.
  local request = ARGV[7] or ''
  local again = kept_reply(worker, request)
  if again then return again end

  local clock = redis.call('TIME')
  local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
  local now = math.floor(now_us / 1000)
  local limit = tonumber(redis.call('HGET', k.meta, 'max_running'))
  local running = running_count()
  local out, records, leases, claimed_ids = {}, {}, {}, {}
  local claimed, dropped, handled = 0, 0, 0
  local reason, delay = '', -1

  -- The head is read a page at a time (with the records in one HMGET); every entry
  -- handled, claimed or dropped as stale, is a prefix of the queue, removed at the end
  -- with one ZREMRANGEBYRANK.
  while claimed < n and reason == '' do
    -- A couple of entries beyond what is wanted, to get past a stale one or two at once.
    local page = redis.call('ZRANGE', k.queue, handled, handled + (n - claimed) + 1, 'WITHSCORES')
    if #page == 0 then reason = 'empty'; break end
    local ids = {}
    for i = 1, #page, 2 do ids[#ids + 1] = string.sub(page[i], 23) end
    local raws = redis.call('HMGET', k.tasks, unpack(ids))
    for i = 1, #page, 2 do
      local member, score = page[i], tonumber(page[i + 1])
      local version, id = parse_member(member)
      local raw = raws[(i + 1) / 2]
      local t = raw and load_task(id, raw)
      if not t or t.state ~= 'ready' or t.version ~= version or claimed_ids[id] then
        handled = handled + 1
        dropped = dropped + 1
        if dropped >= max_drop then reason = 'not_due'; delay = 0; break end
      elseif score > now then
        reason = 'not_due'; delay = score * 1000 - now_us; break
      elseif limit and running >= limit then
        reason = 'capacity'; break
      else
        handled = handled + 1
        t.state = 'running'
        t.attempt = t.attempt + 1
        t.worker = worker
        t.updated = now
        records[#records + 1] = id
        records[#records + 1] = encode_task(t)
        leases[#leases + 1] = now + lease_ms
        leases[#leases + 1] = id
        claimed_ids[id] = true
        running = running + 1
        claimed = claimed + 1
        out[#out + 1] = { id, t.version, t.attempt, t.priority, t.run_at }
        if claimed >= n then break end
      end
    end
  end
  if handled > 0 then redis.call('ZREMRANGEBYRANK', k.queue, 0, handled - 1) end
  call_many('HSET', k.tasks, records)
  call_many('ZADD', k.leases, leases)
  local payloads = {}
  if claimed > 0 then
    local ids = {}
    for i, c in ipairs(out) do ids[i] = c[1] end
    payloads = redis.call('HMGET', k.payloads, unpack(ids))
  end
  -- Wake-ups (lib/idle.lua): register as idle, or pass the work on to one more worker.
  local channel = ARGV[5] or ''
  if channel ~= '' then
    local idle_ms = to_int(ARGV[6], 'idle_ms')
    local due_at = reason == 'not_due' and delay > 0 and math.floor((now_us + delay) / 1000) or nil
    local room = not limit or running < limit
    if not idle_after_claim(channel, now + idle_ms, claimed < n, due_at, room, now) then delay = -1 end
  end
  keep_claim(worker, request, out)
  if claimed > 0 then
    redis.call('HINCRBY', k.meta, 'count:ready', -claimed)
    redis.call('HINCRBY', k.meta, 'count:running', claimed)
  end
  local reply = { 0, claimed, reason, delay }
  for i, c in ipairs(out) do
    for _, value in ipairs(c) do reply[#reply + 1] = value end
    reply[#reply + 1] = payloads[i] or ''
  end
  return reply
end)
