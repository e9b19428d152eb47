-- fire.lua: create the tasks of a schedule's due slots, each slot exactly once.
--
--- @include settle
--- @include fires
--- @keys tasks payloads results queue finished meta wake idle
--- @keys edges deps blocked blockedby propagating states fires firing ranked
--- @keys waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys joins
--
-- The caller (any worker) reads the head of fires, computes the schedule's slots from
-- its definition (cron or interval, catch-up window) and sends them here. Fenced:
-- in mode 'fire' the schedule's stored next fire time must still be the one the caller
-- started from (ARGV[5]) and its rev the one it read, else the call writes nothing and
-- replies 'moved' (another worker fired these slots first, or the schedule changed).
-- So however many workers race, one wins each slot. Each slot's task has the id
-- <name>@<slot ms>, or {<name>}@<slot ms> when ARGV[13 + 2m] is 'tagged' (a striped
-- namespace: the id then maps to the stripe of the name, the schedule's stripe, which
-- this call runs on); a slot whose task id exists already creates nothing.
--
-- Overlap policy, when the schedule's last task (trigger and fire modes) is still
-- pending, ready or running as a slot comes:
--   skip             the slot creates nothing (counted as skipped)
--   buffer_one       while it runs, one new task waits for it (an optional dependency);
--                    while it is queued, or one already waits, the slot is skipped
--   buffer_all       the new task waits for it (optional dependency), so runs queue up
--   cancel_previous  a queued one is cancelled, a running one asked to stop
--                    (cancel_requested, published on wake), and the new task starts
--   allow            the new task is created regardless
-- Mode 'trigger' creates one task due now (slot 'now': the server clock, or the first
-- millisecond after it whose task id is free) through the same policy, without moving
-- the next fire time. Mode 'backfill' creates the tasks of the
-- given past slots as they are (no policy; they do not become the last task).
--
-- Writes tasks, payloads, queue, meta, fires, firing (with a key: meta fair, fairkeys and
-- the keys' turns, lib/fair.lua); cancel_previous also finished,
-- wake and, for dependents, the propagation keys. Wakes one idle worker per task due
-- now (lib/queue.lua), and the timer worker when the next fire time moved earlier than
-- what it waits for (lib/fires.lua).
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua): one per task due now
-- (or one for a new queue head not due yet), one when the head of fires moved earlier
-- than what the timer worker waits for, one per dependent that settling makes claimable;
-- 'cancel <version> <id>' on wake when cancel_previous asks a running last run to stop;
-- '<state> <id>' on ended for each task it ends that a client waits for, whose waits
-- entry it removes (lib/ended.lua): a queued last run it cancels.
--
-- ARGV[1] propagation budget (>= 1; at most MAX_PROPAGATE_BUDGET, 250, counts)
-- ARGV[2] the schedule name
-- ARGV[3] the rev of the definition the caller read (firing state)
-- ARGV[4] mode: 'fire', 'trigger' or 'backfill'
-- ARGV[5] fire: the stored next fire time (ms) the slots start from; else ''
-- ARGV[6] fire: the next fire time after these slots (ms), '' when none (the schedule
--         ended); else ''
-- ARGV[7] the number of slots counted as missed (older than the catch-up window), >= 0
-- ARGV[8] overlap policy: skip | buffer_one | buffer_all | cancel_previous | allow
-- ARGV[9] task spec: 'priority max_attempts backoff_ms' (ranges as in schedule.lua),
--         optionally followed by ' key=<hex>': the fairness key of the tasks created (its
--         UTF-8 bytes in hex, 1..256 bytes; lib/fair.lua). A key turns the namespace fair
--         and each task created is written to fairkeys before it is queued.
-- ARGV[10] payload (msgpack map, as in schedule.lua)
-- ARGV[11] the caller's largest payload, in bytes (>= 1): it can only lower the namespace's
--          payload limit (schedule.lua)
-- ARGV[12] m, the number of slots (0..1000; 0 only in mode 'fire': the next fire time
--          moves and nothing is created, ARGV[9..10] are then not read), then m pairs:
--          slot time (ms; strictly increasing), the task's run_at (ms; the slot plus its
--          jitter). Trigger: one pair 'now' 'now'.
-- ARGV[13 + 2m] optional: the slot ids' form, 'plain' (the default when absent:
--          <name>@<slot ms>) or 'tagged' ({<name>}@<slot ms>; the name must then hold
--          no '}', so that the tag is the whole name)
--
-- Reply: { propagating jobs left, outcome ('fired' or 'moved'), tasks created,
--          slots skipped, the last task created or '' }.
-- Errors (nothing written): BADARG <field> <why> (name, rev, mode, expected_ms,
-- next_ms, missed, policy, spec, priority, max_attempts, backoff, key, payload, m, slot,
-- ids).
-- Caps (lib/limits.lua): each task created stores the payload, so m slots of it at most
-- MAX_PAYLOAD_BYTES_PER_CALL (1048576) bytes together, one slot always allowed (BADARG
-- m ... (MAX_PAYLOAD_BYTES_PER_CALL)); the payload at most MAX_PAYLOAD_VALUES values.
-- Cost: O(m log N), plus what cancel_previous settles within the budget.

local POLICIES = { skip = true, buffer_one = true, buffer_all = true, cancel_previous = true,
                   allow = true }
local MAX_SLOTS = 1000

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local name = check_name(ARGV[2])
  local rev = ARGV[3] or ''
  if rev == '' then error({ err = 'BADARG rev must not be empty' }) end
  local mode = ARGV[4]
  if mode ~= 'fire' and mode ~= 'trigger' and mode ~= 'backfill' then
    error({ err = 'BADARG mode must be fire, trigger or backfill' })
  end
  local expected, next_ms = nil, nil
  if mode == 'fire' then
    expected = int_arg(ARGV[5], 'expected_ms', -MAX_MS, MAX_MS)
    if ARGV[6] ~= '' then next_ms = int_arg(ARGV[6], 'next_ms', -MAX_MS, MAX_MS) end
  end
  local missed = int_arg(ARGV[7], 'missed', 0, MAX_MS)
  local policy = ARGV[8]
  if not POLICIES[policy] then
    error({ err = 'BADARG policy must be skip, buffer_one, buffer_all, cancel_previous or allow' })
  end
  local m = int_arg(ARGV[12], 'm', 0, MAX_SLOTS)
  if #ARGV ~= 12 + 2 * m and #ARGV ~= 13 + 2 * m then
    error({ err = 'BADARG ARGV length does not match m' })
  end
  local ids = ARGV[13 + 2 * m] or 'plain'
  if ids ~= 'plain' and ids ~= 'tagged' then
    error({ err = 'BADARG ids must be plain or tagged' })
  end
  if ids == 'tagged' and string.find(name, '}', 1, true) then
    error({ err = 'BADARG ids tagged needs a name without }' })
  end
  -- The task id of a slot: on the stripe of the name when tagged.
  local prefix = ids == 'tagged' and ('{' .. name .. '}@') or (name .. '@')
  local function slot_id(slot) return prefix .. string.format('%d', slot) end
  if mode == 'trigger' and m ~= 1 then error({ err = 'BADARG m must be 1 to trigger' }) end
  if mode ~= 'fire' and m < 1 then error({ err = 'BADARG m must be >= 1' }) end
  -- Without slots (all missed, or a definition that cannot be read), only the next fire
  -- time moves, and the task fields are not read.
  local p, payload = {}, ''
  if m > 0 then
    local pr, ma, bo, rest = string.match(ARGV[9] or '', '^(-?%d+) (%d+) (%d+)(.*)$')
    local key_hex = rest and string.match(rest, '^ key=(%x*)$')
    if not pr or (rest ~= '' and not key_hex) then
      error({ err = 'BADARG spec must be: priority max_attempts backoff_ms [key=<hex>]' })
    end
    p = {
      priority = bounded(pr, 'priority', -2147483648, 2147483647),
      max_attempts = bounded(ma, 'max_attempts', 1, MAX_ATTEMPTS),
      backoff = bounded(bo, 'backoff', 0, MAX_MS),
    }
    if key_hex then
      local key, why = fair_key_from_hex(key_hex)
      if not key then error({ err = 'BADARG key ' .. why }) end
      p.key = key
    end
    payload = ARGV[10] or ''
    local limit = payload_limit(int_arg(ARGV[11], 'max_payload_bytes', 1, MAX_MS))
    local problem = payload_problem(payload, limit)
    if problem then error({ err = 'BADARG payload ' .. problem }) end
    if m > 1 and m * #payload > LIMITS.MAX_PAYLOAD_BYTES_PER_CALL then
      error({ err = 'BADARG m at most ' .. LIMITS.MAX_PAYLOAD_BYTES_PER_CALL
        .. ' bytes of payloads per call (MAX_PAYLOAD_BYTES_PER_CALL): '
        .. math.floor(LIMITS.MAX_PAYLOAD_BYTES_PER_CALL / #payload) .. ' slots of this payload' })
    end
  end
  local now = now_ms(c)
  local slots, previous = {}, nil
  for i = 1, m do
    local slot_text, run_text = ARGV[11 + 2 * i], ARGV[12 + 2 * i]
    local slot, run_at
    if mode == 'trigger' and slot_text == 'now' and run_text == 'now' then
      -- The first millisecond from now whose task id is free: two triggers in one
      -- millisecond are two runs.
      slot = now
      while redis.call('HEXISTS', k.tasks, slot_id(slot)) == 1 do
        slot = slot + 1
      end
      run_at = now
    else
      slot = int_arg(slot_text, 'slot', -MAX_MS, MAX_MS)
      run_at = int_arg(run_text, 'run_at', -MAX_MS, MAX_MS)
    end
    if previous and slot <= previous then
      error({ err = 'BADARG slot times must be strictly increasing' })
    end
    previous = slot
    slots[i] = { slot = slot, run_at = run_at }
  end

  -- The fence: the state read must still be the stored one.
  local f = read_firing(name)
  if not f or f.rev ~= rev then return { 0, 'moved', 0, 0, '' } end
  if mode == 'fire' and tonumber(redis.call('ZSCORE', k.fires, name)) ~= expected then
    return { 0, 'moved', 0, 0, '' }
  end

  -- The last task while it is pending, ready or running, else nil.
  local function active(id)
    if id == '' then return nil end
    local t = load_task(id)
    if t and (t.state == 'pending' or t.state == 'ready' or t.state == 'running') then return t end
    return nil
  end

  local created, skipped, cancelled, last_created = 0, 0, {}, ''
  for _, s in ipairs(slots) do
    local id = slot_id(s.slot)
    if redis.call('HEXISTS', k.tasks, id) == 0 then
      local deps, make = {}, true
      local prev = mode ~= 'backfill' and active(f.last) or nil
      if prev and policy == 'skip' then
        make = false
      elseif prev and policy == 'buffer_one' then
        if prev.state == 'running' then deps = { { kind = 'o', id = f.last } } else make = false end
      elseif prev and policy == 'buffer_all' then
        deps = { { kind = 'o', id = f.last } }
      elseif prev and policy == 'cancel_previous' then
        if prev.state == 'running' then
          if prev.cancel == 0 then
            prev.cancel = 1
            save_task(f.last, prev)
            publish(k.wake, string.format('cancel %d ', prev.version) .. f.last)
          end
        else
          end_task(c, f.last, prev, 'cancelled', now)
          cancelled[#cancelled + 1] = f.last
        end
      end
      if make then
        local spec = { run_at = s.run_at, priority = p.priority, max_attempts = p.max_attempts,
                       backoff = p.backoff, inline = payload_inline(payload) and payload }
        if p.key then
          -- The schedule's fairness key: read by enqueue, kept for the task's retries.
          if not fair_on(c) then fair_turn_on(c, now) end
          redis.call('HSET', k.fairkeys, id, p.key)
        end
        write_version(c, id, nil, spec, deps, now, record_state)
        if not spec.inline then redis.call('HSET', k.payloads, id, payload) end
        created = created + 1
        last_created = id
        if mode ~= 'backfill' then f.last = id end
      else
        skipped = skipped + 1
      end
    end
  end

  f.fired = f.fired + created
  f.skipped = f.skipped + skipped
  f.missed = f.missed + missed
  save_firing(name, f)
  if mode == 'fire' then
    if next_ms then
      redis.call('ZADD', k.fires, next_ms, name)
      fires_changed(now)
    else
      redis.call('ZREM', k.fires, name)
    end
  end
  local left
  if #cancelled > 0 then
    left = settle_after_terminal(c, cancelled, now, budget)
  else
    left = redis.call('ZCARD', k.propagating)
  end
  end_call(c)
  return { left, 'fired', created, skipped, last_created }
end)
