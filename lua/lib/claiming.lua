-- lib/claiming.lua: claim up to n due, current, ready tasks: claim.lua's transition, as a
-- function a script that also reports (finish.lua) calls after its reports.
--
--- @include record
--- @include counts
--- @include repair
--- @include kept
--- @include ranked
--- @include deadline
--
-- claim_args(args, at) checks claim.lua's arguments; claim_now(c, a) claims and returns
-- the reply claim.lua documents. The caller mends meta first (repair_meta) and writes the counters
-- and tells the waiters after (lib/counts.lua, lib/ended.lua), once for its whole call.

-- The most keys one fair claim visits beyond n (a key visited is served, found empty,
-- not due, or at its cap), and the most keys of fairwait it moves back per call.
local FAIR_VISITS = 64
local FAIR_MOVE = 1000

-- The head of key's entries: (member, due ms, queue member, the name of the set holding
-- it: 'queue', 'ranked' or 'fairq'), or nil;
-- nil, ..., true when due entries are left to move into the ranked order first (the
-- priority order, lib/ranked.lua: the move budget mv.left of this call is spent).
local function fair_head(key, now, aging, mv)
  if key == '' then
    local h = redis.call('ZRANGE', k.queue, '0', '0', 'WITHSCORES')
    if aging then
      -- The default key's due entries were moved into ranked at the start of the call;
      -- while some are left (more than its move took), its head may not be the lowest.
      if h[1] and tonumber(h[2]) <= now then return nil, nil, nil, nil, true end
      local r = redis.call('ZRANGE', k.ranked, '0', '0')
      if r[1] then return r[1], now, r[1], 'ranked' end
    end
    if not h[1] then return nil end
    return h[1], tonumber(h[2]), h[1], 'queue'
  end
  local p = fair_prefix(key)
  if aging then
    -- The key's due entries join its ranked section before its head is read.
    local due_max = '(' .. p .. string.format('%013x', now + 1)
    if mv.left > 0 then
      local due = redis.call('ZRANGEBYLEX', k.fairq, '[' .. p .. '0', due_max, 'LIMIT', 0, mv.left)
      if #due > 0 then
        mv.left = mv.left - #due
        local adds = {}
        for _, m in ipairs(due) do
          adds[#adds + 1] = 0
          adds[#adds + 1] = fairq_ranked_member(p, tonumber(string.sub(m, #p + 1, #p + 13), 16) or 0,
            string.sub(m, #p + 14), aging)
        end
        call_many('ZREM', k.fairq, due)
        call_many('ZADD', k.fairq, adds)
      end
    end
    -- The budget spent: a due entry left unranked could rank before the ranked head.
    if mv.left == 0 and redis.call('ZRANGEBYLEX', k.fairq, '[' .. p .. '0', due_max, 'LIMIT', '0', '1')[1] then
      return nil, nil, nil, nil, true
    end
    local r = redis.call('ZRANGEBYLEX', k.fairq, '[' .. p .. '!', '(' .. p .. '"', 'LIMIT', '0', '1')
    if r[1] then
      local _, at, qmember = fairq_parse(r[1])
      if at then return r[1], at, qmember, 'fairq' end
      return r[1], 0, '', 'fairq'
    end
  end
  local h = redis.call('ZRANGEBYLEX', k.fairq, '[' .. p, '[' .. p .. '\255', 'LIMIT', '0', '1')
  if not h[1] then return nil end
  local rest = string.sub(h[1], #p + 1)
  local at = tonumber(string.sub(rest, 1, 13), 16)
  -- A member of neither form (junk) is handed back as an entry no task matches: dropped.
  if not at then return h[1], 0, '', 'fairq' end
  return h[1], at, string.sub(rest, 14), 'fairq'
end

local function fair_drop(set, member)
  if set == 'ranked' then
    redis.call('ZREM', k.ranked, member)
  elseif set == 'queue' then
    redis.call('ZREM', k.queue, member)
  else
    redis.call('ZREM', k.fairq, member)
  end
end

-- The payload bytes a claimed task adds to the reply: its record's, else the payloads
-- hash's (HSTRLEN, nothing copied); a quarantined task's reason is small.
local function claim_size(id, t, quarantine)
  if quarantine then return 64 end
  if t.payload then return #t.payload end
  if t.payload_at then return #t.raw - t.payload_at + 1 end
  return redis.call('HSTRLEN', k.payloads, id)
end

-- Claims of a fair namespace: serve the key of lowest virtual time, one task at a time.
-- Unlike the queue walk it writes as it goes (each choice depends on the last); a
-- record that cannot be read, or an id no worker can name, is dropped as stale.
-- Returns reason, delay (as the reply's), and how many stale entries it dropped.
local function fair_claim(n, now, now_us, max_drop, limit, running, deadlines_on, aging, walk)
  local vt0 = fair_vt()
  -- Keys whose head came due rejoin the turns.
  local due = redis.call('ZRANGEBYSCORE', k.fairwait, '-inf', now, 'LIMIT', 0, FAIR_MOVE)
  if #due > 0 then
    local adds = {}
    for _, key in ipairs(due) do
      adds[#adds + 1] = vt0
      adds[#adds + 1] = key
    end
    call_many('ZADD', k.fairready, adds)
    redis.call('ZREMRANGEBYRANK', k.fairwait, 0, #due - 1)
  end
  local claimed, dropped, visits, served = 0, 0, 0, nil
  local reason, delay = '', -1
  local mv = { left = MOVE_MAX }
  while claimed < n do
    local top = redis.call('ZRANGE', k.fairready, '0', '0', 'WITHSCORES')
    if not top[1] then break end
    if visits >= n + FAIR_VISITS then reason = 'not_due'; delay = 0; break end
    visits = visits + 1
    local key, vt = top[1], tonumber(top[2])
    local member, at, qmember, set, unmoved = fair_head(key, now, aging, mv)
    if unmoved then
      reason = 'not_due'; delay = 0; break
    elseif not member then
      redis.call('ZREM', k.fairready, key)
    else
      local version, id = parse_member(qmember)
      local t, corrupt = nil, nil
      if version and not id_problem(id) and not walk.claimed_ids[id] then
        local raw = redis.call('HGET', k.tasks, id)
        if raw then t, corrupt = read_task(id, raw) end
      end
      if corrupt then
        -- As in the queue walk: handed out as a final attempt whose payload says why,
        -- so that the worker fails it (after the key's cap and the global limit).
        t = {
          state = 'ready', version = version, attempt = 0, max_attempts = 1, backoff_ms = 0,
          run_at = now, priority = member_priority(qmember), cancel = 0, remaining = 0,
          optional = 0, worker = '',
        }
      end
      if not (t and t.state == 'ready' and t.version == version) then
        fair_drop(set, member)
        dropped = dropped + 1
        if dropped >= max_drop then reason = 'not_due'; delay = 0; break end
      elseif at > now then
        redis.call('ZREM', k.fairready, key)
        redis.call('ZADD', k.fairwait, at, key)
      elseif not corrupt and deadlines_on and deadline_at(version, id, now, walk.started) then
        fair_drop(set, member)
        walk.claimed_ids[id] = true
        walk.expiring[#walk.expiring + 1] = { id = id, t = t }
      else
        local s = redis.call('HMGET', k.fair, 'run:' .. key, 'cap:' .. key, 'cap', 'w:' .. key,
          'rate:' .. key, 'tb:' .. key)
        local cap, busy = fair_cap(s[2], s[3]), tonumber(s[1]) or 0
        local weight = tonumber(s[4])
        if not weight or weight <= 0 then weight = 1 end
        -- Only a key with a rate reads its head's cost (costs: tasks of a cost other than 1).
        local tokens, next_token, units = nil, nil, nil
        if s[5] then tokens, next_token, units = fair_tokens(s[5], s[6], now, task_cost(id)) end
        if cap and busy >= cap then
          redis.call('ZREM', k.fairready, key)
          redis.call('ZADD', k.fairfull, vt, key)
        elseif next_token then
          -- Fewer units than its head's cost: the key waits for them like a delayed head
          -- (other keys take their turns meanwhile).
          redis.call('ZREM', k.fairready, key)
          redis.call('ZADD', k.fairwait, next_token, key)
        elseif limit and running + claimed >= limit then
          reason = 'capacity'
          break
        elseif claimed > 0 and walk.bytes + claim_size(id, t, corrupt) > LIMITS.MAX_CLAIM_REPLY_BYTES then
          -- The reply holds as many payload bytes as one call may carry: call again.
          reason = 'not_due'; delay = 0
          break
        else
          walk.bytes = walk.bytes + claim_size(id, t, corrupt)
          fair_drop(set, member)
          if corrupt then
            walk.quarantined[id] = cmsgpack.pack('corrupt task record: ' .. corrupt)
            redis.log(redis.LOG_WARNING, 'distsched: claimed the corrupt task record of ' .. id .. ' to fail it')
          else
            walk.ready_taken = walk.ready_taken + 1
          end
          t.state = 'running'
          t.attempt = t.attempt + 1
          t.worker = walk.worker
          t.updated = now
          walk.records[#walk.records + 1] = id
          walk.records[#walk.records + 1] = encode_task(t)
          walk.leases[#walk.leases + 1] = walk.lease_at
          walk.leases[#walk.leases + 1] = id
          walk.claimed_ids[id] = true
          walk.out[#walk.out + 1] = { id, t.version, t.attempt, t.priority, t.run_at }
          walk.inline[#walk.out] = task_payload(t)
          walk.keys[#walk.keys + 1] = key
          claimed = claimed + 1
          redis.call('HINCRBY', k.fair, 'run:' .. key, '1')
          redis.call('HSET', k.fairrun, id, key)
          if tokens then
            redis.call('HSET', k.fair, 'tb:' .. key, string.format('%.17g %d', tokens - units, now))
          end
          served = vt
          -- A key that reached its cap waits in fairfull: claims never visit it there.
          if cap and busy + 1 >= cap then
            redis.call('ZREM', k.fairready, key)
            redis.call('ZADD', k.fairfull, vt + 1 / weight, key)
          else
            redis.call('ZADD', k.fairready, vt + 1 / weight, key)
          end
        end
      end
    end
  end
  if served then redis.call('HSET', k.fair, 'vt', served) end
  if claimed < n and reason == '' then
    local head = redis.call('ZRANGE', k.fairwait, '0', '0', 'WITHSCORES')
    if head[1] then
      reason = 'not_due'
      delay = math.max(0, tonumber(head[2]) * 1000 - now_us)
      if delay > 9007199254740991 then delay = -1 end
    elseif redis.call('ZCARD', k.fairfull) > 0 then
      reason = 'capacity'
    else
      reason = 'empty'
    end
  end
  return reason, delay, dropped
end

-- claim.lua's arguments, args[at .. at + 6] as its ARGV[1..7], checked (BADARG): a table of
-- worker, n, lease_ms, max_drop, channel, idle_ms, request.
local function claim_args(args, at)
  local worker = args[at]
  local n = to_int(args[at + 1], 'n')
  local lease_ms = to_int(args[at + 2], 'lease_ms')
  local max_drop = to_int(args[at + 3], 'max_drop')
  if n < 1 or n > LIMITS.MAX_CLAIM then
    error({ err = 'BADARG n must be in [1, ' .. LIMITS.MAX_CLAIM .. '] (MAX_CLAIM)' })
  end
  if lease_ms < 1 then error({ err = 'BADARG lease_ms must be >= 1' }) end
  -- The worker id is stored in every record it claims (and the request id and channel
  -- with it): each within its cap, so no stored value grows with what a caller sends.
  if not worker or #worker == 0 or #worker > LIMITS.MAX_WORKER_ID_BYTES or not valid_utf8(worker) then
    error({ err = 'BADARG worker_id must be 1..' .. LIMITS.MAX_WORKER_ID_BYTES
      .. ' bytes of valid UTF-8 (MAX_WORKER_ID_BYTES)' })
  end
  local channel = args[at + 4] or ''
  if #channel > 2 * LIMITS.MAX_WORKER_ID_BYTES then
    error({ err = 'BADARG channel must be at most ' .. 2 * LIMITS.MAX_WORKER_ID_BYTES
      .. ' bytes (2 * MAX_WORKER_ID_BYTES)' })
  end
  local idle_ms = channel ~= '' and to_int(args[at + 5], 'idle_ms') or 0
  -- The same call sent again (a client retrying after a timeout): the same tasks.
  local request = args[at + 6] or ''
  if #request > LIMITS.MAX_WORKER_ID_BYTES then
    error({ err = 'BADARG request_id must be at most ' .. LIMITS.MAX_WORKER_ID_BYTES
      .. ' bytes (MAX_WORKER_ID_BYTES)' })
  end
  return { worker = worker, n = n, lease_ms = lease_ms, max_drop = max_drop, channel = channel,
           idle_ms = idle_ms, request = request }
end

-- Claim as claim.lua does, with a = claim_args(...): its reply.
local function claim_now(c, a)
  local worker, n, lease_ms, max_drop = a.worker, a.n, a.lease_ms, a.max_drop
  local channel, idle_ms, request = a.channel, a.idle_ms, a.request
  local again = kept_reply(worker, request)
  if again then return again end

  local now_us, now = now_us(c), now_ms(c)
  -- A max_running that is not a count (junk) is ignored, as if none were set.
  local settings = meta_fields(c, 'max_running', 'order', 'aging_ms', 'fair')
  local limit = tonumber(settings[1])
  if limit and (limit < 0 or limit ~= math.floor(limit)) then limit = nil end
  local aging = aging_of(settings[2], settings[3])
  c.aging, c.fair = aging, settings[4] == '1'
  -- The priority order: the entries due by now join the ready set first. Moving changes
  -- no task, so it may come before the reads below.
  if aging then move_due(now, aging) end
  -- The set claims walk: the ready set in the priority order, else the queue.
  local function head_page(first, last)
    if aging then return redis.call('ZRANGE', k.ranked, itoa(first), itoa(last), 'WITHSCORES') end
    return redis.call('ZRANGE', k.queue, itoa(first), itoa(last), 'WITHSCORES')
  end
  local running = running_count(c)
  local out, records, leases, claimed_ids = {}, {}, {}, {}
  -- The payload of each claimed task its record holds (by position in out).
  local inline = {}
  -- Every lease of the call ends at the same time: its text is formatted once.
  local lease_at = itoa(now + lease_ms)
  local claimed, dropped, handled, failed_here, ready_taken = 0, 0, 0, 0, 0
  -- The tasks of ids no worker can name that the walk ends failed (bad_ids).
  local bad_ids = {}
  -- The payload bytes of the tasks claimed so far (MAX_CLAIM_REPLY_BYTES).
  local reply_bytes = 0
  local quarantined = {}
  local reason, delay = '', -1
  -- Deadlines cost one EXISTS per call while no task has one.
  local deadlines_on = redis.call('EXISTS', k.deadlines) == 1
  local expiring, started_with_deadline = {}, {}
  -- The fairness key of each task a fair claim starts, in claim order (for the reply).
  local fair_keys = {}

  -- A fair namespace (lib/fair.lua): keys take turns, each in the namespace's order.
  local fair = fair_on(c)
  if fair then
    local walk = {
      out = out, records = records, leases = leases, claimed_ids = claimed_ids,
      expiring = expiring, started = started_with_deadline, worker = worker, lease_at = lease_at,
      quarantined = quarantined, ready_taken = 0, keys = fair_keys, inline = inline,
      bytes = 0,
    }
    reason, delay, dropped = fair_claim(n, now, now_us, max_drop, limit, running, deadlines_on, aging, walk)
    claimed = #out
    ready_taken = walk.ready_taken
    running = running + claimed
  end

  -- The head is read a page at a time (with the records in one HMGET); every entry
  -- handled, claimed or dropped as stale, is a prefix of the queue, removed at the end
  -- with one ZREMRANGEBYRANK. Everything is read and checked before the first write.
  while not fair and claimed < n and reason == '' do
    -- A couple of entries beyond what is wanted, to get past a stale one or two at once.
    local page = head_page(handled, handled + (n - claimed) + 1)
    if #page == 0 then
      reason = 'empty'
      if aging then
        -- No due entry ranked: the delayed set's head says when to come back (0: due
        -- entries beyond this call's move are left, call again at once).
        local head = redis.call('ZRANGE', k.queue, '0', '0', 'WITHSCORES')
        if head[1] then
          reason = 'not_due'
          delay = math.max(0, tonumber(head[2]) * 1000 - now_us)
          if delay > 9007199254740991 then delay = -1 end
        end
      end
      break
    end
    local ids = {}
    for i = 1, #page, 2 do ids[#ids + 1] = string.sub(page[i], 23) end
    local raws = redis.call('HMGET', k.tasks, unpack(ids))
    for i = 1, #page, 2 do
      local member, score = page[i], tonumber(page[i + 1])
      local version, id = parse_member(member)
      local raw = raws[(i + 1) / 2]
      local t, corrupt = nil, nil
      local bad_id = version and id_problem(id)
      if version and not bad_id and raw then t, corrupt = read_task(id, raw) end
      if bad_id and id ~= '' and raw and not claimed_ids[id] then
        -- An id no worker can name in its reports (a producer that skipped the checks):
        -- its current entry is dropped and the task ends failed where it is.
        t = load_task(id, raw)
        if t and t.state == 'ready' and t.version == version then
          t.state = 'failed'
          t.updated = now
          records[#records + 1] = id
          records[#records + 1] = encode_task(t)
          bad_ids[#bad_ids + 1] = { id = id, t = t }
          failed_here = failed_here + 1
          claimed_ids[id] = true
        end
        t = nil
      end
      local live = t and t.state == 'ready' and t.version == version and not claimed_ids[id]
      local quarantine = corrupt and not claimed_ids[id]
      if not live and not quarantine then
        handled = handled + 1
        dropped = dropped + 1
        if dropped >= max_drop then reason = 'not_due'; delay = 0; break end
      elseif not aging and score > now then
        reason = 'not_due'; delay = score * 1000 - now_us
        -- An infinite score (junk) is never due: as for an empty queue, no delay.
        if delay > 9007199254740991 then delay = -1 end
        break
      elseif live and deadlines_on and deadline_at(version, id, now, started_with_deadline) then
        handled = handled + 1
        claimed_ids[id] = true
        expiring[#expiring + 1] = { id = id, t = t }
      elseif limit and running >= limit then
        reason = 'capacity'; break
      elseif claimed > 0 and reply_bytes + claim_size(id, t, quarantine) > LIMITS.MAX_CLAIM_REPLY_BYTES then
        -- The reply holds as many payload bytes as one call may carry: call again.
        reason = 'not_due'; delay = 0; break
      else
        reply_bytes = reply_bytes + claim_size(id, t, quarantine)
        handled = handled + 1
        if quarantine then
          -- A record that cannot be read is handed out as a final attempt, whose payload
          -- is the reason (a msgpack string): the worker fails it, which stores the error,
          -- ends the task failed and tells its dependents, as for any failure.
          t = {
            state = 'running', version = version, attempt = 0, max_attempts = 1, backoff_ms = 0,
            run_at = now, priority = 2147483647 - tonumber(string.sub(member, 1, 8), 16), cancel = 0,
            remaining = 0, optional = 0,
          }
          if t.priority < -2147483648 then t.priority = -2147483648 end
          quarantined[id] = cmsgpack.pack('corrupt task record: ' .. corrupt)
          redis.log(redis.LOG_WARNING, 'distsched: claimed the corrupt task record of ' .. id .. ' to fail it')
        else
          ready_taken = ready_taken + 1
        end
        t.state = 'running'
        t.attempt = t.attempt + 1
        t.worker = worker
        t.updated = now
        records[#records + 1] = id
        records[#records + 1] = encode_task(t)
        leases[#leases + 1] = lease_at
        leases[#leases + 1] = id
        claimed_ids[id] = true
        running = running + 1
        claimed = claimed + 1
        out[#out + 1] = { id, t.version, t.attempt, t.priority, t.run_at }
        inline[#out] = task_payload(t)
        if claimed >= n then break end
      end
    end
  end
  -- The payloads: from the records, else (large ones, tasks stored by earlier versions)
  -- from the payloads hash (lib/kept.lua); a quarantined task's is why it fails.
  local ids = {}
  for i, task in ipairs(out) do
    ids[i] = task[1]
    inline[i] = quarantined[task[1]] or inline[i]
  end
  local payloads = payloads_of(ids, inline)

  -- Writes, only now that every read and check is done.
  if handled > 0 then
    if aging then
      redis.call('ZREMRANGEBYRANK', k.ranked, '0', itoa(handled - 1))
    else
      redis.call('ZREMRANGEBYRANK', k.queue, '0', itoa(handled - 1))
    end
  end
  call_many('HSET', k.tasks, records)
  call_many('ZADD', k.leases, leases)
  if ready_taken + failed_here > 0 then
    count_add('count:ready', -(ready_taken + failed_here))
  end
  if failed_here > 0 then redis.call('HINCRBY', k.meta, 'count:failed', itoa(failed_here)) end
  -- A task ended failed here is listed like any ended task (finished, the state index),
  -- so that retention purges it.
  for _, b in ipairs(bad_ids) do
    redis.call('ZADD', k.finished, itoa(now), b.id)
    redis.call('ZADD', k.states, '0', index_member(b.t, b.id))
  end
  if claimed > 0 then redis.call('HINCRBY', k.meta, 'count:running', itoa(claimed)) end
  for _, e in ipairs(expiring) do expire_task(c, e.id, e.t, now) end
  if next(started_with_deadline) then
    for _, task in ipairs(out) do
      local member = started_with_deadline[task[1]]
      if member then redis.call('ZREM', k.deadlines, member) end
    end
  end
  -- A schedule's next fire time (the head of fires; one ZRANGE on an absent key when
  -- there is no schedule): due, the worker fires it first; else it counts like a queue
  -- head not due yet for the delay hint and the timer.
  local fire_head = redis.call('ZRANGE', k.fires, '0', '0', 'WITHSCORES')
  if fire_head[1] then
    local fire_us = tonumber(fire_head[2]) * 1000 - now_us
    if fire_us <= 0 then
      reason = 'fire'; delay = 0
    elseif claimed < n and (delay < 0 or fire_us < delay) then
      delay = fire_us
    end
  end
  -- Wake-ups (lib/idle.lua): register as idle, or pass the work on to one more worker.
  if channel ~= '' then
    local due_at = delay > 0 and math.floor((now_us + delay) / 1000) or nil
    local room = not limit or running < limit
    local ready_set = (fair and k.fairready) or (aging and k.ranked) or nil
    if not idle_after_claim(channel, now + idle_ms, claimed < n, due_at, room, now, ready_set) then
      delay = -1
    end
  end
  keep_claim(worker, request, out)
  local left = #expiring > 0 and redis.call('ZCARD', k.propagating) or 0
  local reply = { left, claimed, reason, delay }
  for i, task in ipairs(out) do
    for _, value in ipairs(task) do reply[#reply + 1] = value end
    reply[#reply + 1] = payloads[i] or ''
  end
  for _, key in ipairs(fair_keys) do reply[#reply + 1] = key end
  -- An expired task: its counters, and its waiters (lib/ended.lua).
  return reply
end
