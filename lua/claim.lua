-- claim.lua: move up to n due, current, ready tasks to running with a lease.
--
--- @include record
--- @include counts
--- @include repair
--- @include kept
--- @include ranked
--- @include deadline
--- @keys tasks payloads queue leases meta idle claims fires ranked
--- @keys results finished states propagating deadlines
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun costs
--- @keys parents window windows
--
-- ready -> running. Walks the queue head in order (run_at, -priority,
-- sequence); in a namespace of the priority order (lib/ranked.lua) it first moves the
-- due entries of queue into ranked (at most MOVE_MAX, the rest by the next calls), then
-- walks the ranked head (rank, -priority, sequence). An entry whose version is not
-- the record's current one, or whose
-- task is no longer ready, is stale: it is removed here, at most once, and
-- skipped. Each claimed task gets attempt + 1, the worker id, and a lease
-- deadline (server clock) in the leases sorted set. The per-namespace
-- max_running (meta field) bounds the running count across the fleet (a value that
-- is not a count is ignored).
-- One bad entry never stops the claim: an entry whose head is not a queue member's
-- or whose id is not valid (UTF-8, 1..512 bytes) is dropped, and the task of such an
-- id ends failed where it is (listed in finished and states like any ended task, so that
-- retention purges it); a record that cannot be read is claimed as a final
-- attempt (attempt 1 of 1) whose payload is a msgpack string saying why, so that the
-- worker fails it (fail.lua stores the error and settles its dependents). Everything
-- is read and checked before the first write.
--
-- A fair namespace (meta fair = '1'; lib/fair.lua) claims by fairness key instead: the
-- key of lowest virtual time in fairready gives its head (queue for the default key, fairq
-- for the others; in the priority order ranked for the default key, and for the others
-- the key's ranked section of fairq, into which the visit first moves the key's due
-- entries, at most MOVE_MAX per call over all keys: when due entries of the key are left
-- unranked the call stops, 'not_due' with delay 0), one task at a time, each key within its cap and rate limit (a
-- task takes its cost in units of its key's token bucket, costs hash, read only for a
-- key with a rate; lib/fair.lua); keys whose head is not due, at their cap or short of
-- their head's units leave fairready (for fairwait or
-- fairfull), and the head of fairwait joins the delay hint. At most n + 64 keys are
-- visited per call ('not_due', delay 0, when that bound stops it); 'capacity' also when
-- every key with work is at its cap. It writes as it goes; an id no worker can name is
-- dropped there as a stale entry (a record that cannot be read is handed out to fail, as
-- in the queue walk). Writes fair (run:<key>, tb:<key>,
-- vt), fairq, fairready, fairwait, fairfull, fairrun. fairkeys is received and never
-- touched (kept so that the keys of the call stay as they were).
--
-- A due task whose deadline has passed (lib/deadline.lua; looked up only while the
-- deadlines set is not empty) is never started: it is expired here instead, ending
-- cancelled as with expire.lua, and its dependents get a propagation job (the reply's
-- first element then counts the jobs left, as for the scripts that settle).
--
-- Reads costs (a keyed head's cost, only for a key with a rate), payloads, fires (its head), meta (max_running, count:running, order, aging_ms, fair); writes
-- tasks, queue, leases, meta (count:ready, count:running, timer, timer_at), idle, claims,
-- ranked; for expired tasks results, finished, states, propagating, deadlines, and waits
-- (a waited-for task that expired is published on ended, lib/ended.lua); for a task of
-- an id no worker can name, ended failed, meta (count:failed), finished and states.
--
-- Publishes: 'ready' on the channel of one more idle worker (lib/idle.lua) when it filled
-- its batch while more is due; '<state> <id>' on ended for each task it ends that a
-- client waits for, whose waits entry it removes (lib/ended.lua): a task it expires.
--
-- ARGV[1] worker id (1..MAX_WORKER_ID_BYTES, 256, bytes of valid UTF-8)
-- ARGV[2] n, the most tasks to claim (1..MAX_CLAIM, 1000)
-- ARGV[3] lease length in ms (>= 1)
-- ARGV[4] the most stale entries to drop in this call (bounds its run time)
-- ARGV[5] optional: the caller's own wake channel (ds:{NS}:w:<worker id>), when it listens
--         on it; '' or absent: it does not (and is never registered as idle); at most
--         2 * MAX_WORKER_ID_BYTES (512) bytes
-- ARGV[6] with ARGV[5]: how long (ms) it waits at most before it claims again
-- ARGV[7] optional: a request id; the call's tokens are then kept in claims (field: the
--         worker id; lib/kept.lua): the same call sent again gets the same tasks, and a
--         caller whose reply was lost hands them back (release.lua); at most
--         MAX_WORKER_ID_BYTES (256) bytes
--
-- Reply: { jobs left (0 unless a task expired), claimed, reason, delay_us,
--          (id, version, attempt, priority, run_at_ms, payload) * claimed, keys }
--   payload  the stored payload; a msgpack string instead of a map for a corrupt record
--           (the text of the error to fail the task with)
--   reason  '' when n were claimed; else why not more:
--           'empty' (no live entry), 'not_due' (head not due yet; delay_us until it is, or 0
--           when the stale-drop bound was reached, or when the payloads claimed reached
--           MAX_CLAIM_REPLY_BYTES, 2097152 bytes: the call hands out at least one task and
--           stops before the task that would take its reply past that), 'capacity'
--           (max_running reached);
--           in the priority order, 'not_due' when ranked has no live entry and queue has
--           one (delay_us until the head of queue, 0 when due entries are left to move);
--           'fire' (whatever was claimed): a schedule's slot is due (the head of fires),
--           run fire.lua, then claim again; delay_us is then 0
--   keys    in a fair namespace only: after the claimed tasks, the fairness key of each
--           ('' for the default key), in the same order (a reply sent again for a kept
--           request id, ARGV[7], has none)
--   delay_us microseconds (from the server clock's microseconds, so a waiting worker does
--           not oversleep by the part of a millisecond already gone) until the queue head
--           or the next fire time (the head of fires), whichever comes first, when fewer
--           than n were claimed; -1 when not meaningful, or when another idle worker
--           already waits for that time (lib/idle.lua).
-- Errors (nothing written): BADARG n must be in [1, 1000] (MAX_CLAIM); BADARG worker_id,
--   channel, request_id (over MAX_WORKER_ID_BYTES); BADARG lease_ms, max_drop, idle_ms.
-- With a channel, a claim that gets fewer than n registers the caller in idle until now +
-- ARGV[6]; one that gets n while more tasks are due wakes one more idle worker.
-- Cost: O((claimed + dropped + moved) log N), in a few commands per call whatever n is
-- (moved: the entries moved into ranked in the priority order, at most MOVE_MAX).

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

return run(function(c)
  repair_meta(c)
  local worker = ARGV[1]
  local n = to_int(ARGV[2], 'n')
  local lease_ms = to_int(ARGV[3], 'lease_ms')
  local max_drop = to_int(ARGV[4], 'max_drop')
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
  local channel = ARGV[5] or ''
  if #channel > 2 * LIMITS.MAX_WORKER_ID_BYTES then
    error({ err = 'BADARG channel must be at most ' .. 2 * LIMITS.MAX_WORKER_ID_BYTES
      .. ' bytes (2 * MAX_WORKER_ID_BYTES)' })
  end
  local idle_ms = channel ~= '' and to_int(ARGV[6], 'idle_ms') or 0

  -- The same call sent again (a client retrying after a timeout): the same tasks.
  local request = ARGV[7] or ''
  if #request > LIMITS.MAX_WORKER_ID_BYTES then
    error({ err = 'BADARG request_id must be at most ' .. LIMITS.MAX_WORKER_ID_BYTES
      .. ' bytes (MAX_WORKER_ID_BYTES)' })
  end
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
  write_counts(c)
  tell_waiters(c)
  return reply
end)
