-- lib/fair.lua: fairness keys (tenants), their concurrency caps and weights.
--
--- @include record
--- @include idle
--- @include ranked
--
-- A namespace turns fair (meta field fair = '1') with its first task given a fairness
-- key, or when a key setting is written (fairness.lua); it stays fair. Only then are the
-- structures below read or written: a namespace that never saw a key claims as before.
--
-- Every ready task of a fair namespace belongs to one key: the one it was scheduled
-- with (fairkeys hash: task id -> key, kept while the task exists), or the default
-- key '' for a task given none. The default key's entries stay in queue (so turning
-- fairness on moves nothing); every other key's entries live in fairq, one sorted set
-- of score 0 ordered by member:
--   hex3(#key) key hex13(due ms, clamped to [0, 2^52 - 1]) <queue member>
-- so ZRANGEBYLEX over '[' .. hex3(#key) .. key gives one key's head in O(log N), in the
-- default order (due, -priority, sequence) exactly. In the priority order a claim moves
-- a key's due entries into its ranked section first (lib/ranked.lua), so that its head is
-- the entry of lowest rank; the default key's entries are then in queue and ranked, as in
-- a namespace without keys.
--
-- A key with ready work is in exactly one of:
--   fairready  keys to serve now, scored by virtual time; a claim serves the lowest and
--              adds 1/weight to its score (weighted fair queuing over claims)
--   fairwait   keys whose head is not due yet, scored by its due time (ms); claims move
--              the due ones back into fairready and their head joins the wait hint
--   fairfull   keys at their concurrency cap, scored by virtual time; a running task of
--              the key that ends (any script that moves it out of running) moves the key
--              back into fairready and wakes one idle worker
-- A key leaving fairwait or fairfull, or becoming active, rejoins at the virtual time of
-- the last key served (field vt of the fair hash): it gets its share from then on, no
-- credit for the time it had no work.
--
-- The fair hash: vt, cap (the namespace default cap; absent: none), cap:<key>, w:<key>
-- (weight, default 1), run:<key> (its running tasks), rate:<key> and tb:<key> (its rate
-- limit and token bucket, fair_tokens below; a key whose head task's cost is more than
-- the units in its bucket waits in fairwait until they are there). fairrun maps each running task a
-- fair claim started to its key, so a task leaving running gives its slot back exactly
-- once, whatever script moves it.

local FAIR_DUE_MAX = 4503599627370495

-- Whether the namespace is fair, read once per call (with the order: lib/ranked.lua).
local function fair_on(c)
  read_settings(c)
  return c.fair
end

local function fair_prefix(key)
  return string.format('%03x', #key) .. key
end

local function fair_due(due)
  if due < 0 then return 0 elseif due > FAIR_DUE_MAX then return FAIR_DUE_MAX end
  return due
end

local function fair_member(key, t, id)
  return fairq_delayed_member(fair_prefix(key), fair_due(t.run_at), queue_member(t, id))
end

local function fair_vt()
  return tonumber(redis.call('HGET', k.fair, 'vt')) or 0
end

-- The cap of key: its own, else the namespace default; nil when none.
local function fair_cap(own, default)
  local cap = tonumber(own)
  if not cap then cap = tonumber(default) end
  if cap and (cap < 0 or cap ~= math.floor(cap)) then cap = nil end
  return cap
end

-- A key's rate limit (fair fields rate:<key> = '<count> <interval ms>', tb:<key> =
-- '<tokens> <ms of the last update>'): a token bucket of `count` units refilled at
-- count per interval on the server clock, full at first. A task takes `need` units (its
-- cost, costs hash; 1 unless given), never more than the whole bucket: a cost above
-- `count` (a rate lowered after the task was scheduled) waits for a full bucket and
-- empties it. Returns (units now, nil, units taken) when the task may start, (nil, the ms
-- at which `need` units are there, units taken) when not, (nil, nil) with no limit.
local function fair_tokens(rate, bucket, now, need)
  if not rate then return nil, nil end
  local count, interval = string.match(rate, '^(%d+) (%d+)$')
  count, interval = tonumber(count), tonumber(interval)
  if not count or count < 1 or interval < 1 then return nil, nil end
  need = need or 1
  if need > count then need = count end
  local tokens, last = count, now
  if bucket then
    local t, l = string.match(bucket, '^(%S+) (%d+)$')
    if tonumber(t) and tonumber(l) then tokens, last = tonumber(t), tonumber(l) end
  end
  if now > last then tokens = tokens + (now - last) * count / interval end
  if tokens > count then tokens = count end
  if tokens >= need then return tokens, nil, need end
  return nil, now + math.max(1, math.ceil((need - tokens) * interval / count)), need
end

-- The cost of task id (costs hash: id -> units, only for a cost other than 1), 1 for none
-- or junk; MAX_COST at most.
local MAX_COST = 1000000000
local function task_cost(id)
  local cost = tonumber(redis.call('HGET', k.costs, id))
  if not cost or cost < 1 or cost ~= math.floor(cost) then return 1 end
  if cost > MAX_COST then return MAX_COST end
  return cost
end

-- Key has ready work due at `due` (ms): make it served, or waited for.
local function fair_activate(key, due, now)
  if redis.call('ZSCORE', k.fairready, key) or redis.call('ZSCORE', k.fairfull, key) then return end
  local waiting = tonumber(redis.call('ZSCORE', k.fairwait, key))
  if waiting then
    if due < waiting then
      if due <= now then
        redis.call('ZREM', k.fairwait, key)
        redis.call('ZADD', k.fairready, fair_vt(), key)
      else
        redis.call('ZADD', k.fairwait, due, key)
      end
    end
    return
  end
  redis.call('ZADD', k.fairready, fair_vt(), key)
end

-- Turn the namespace fair: the default key's entries (queue, and ranked in the priority
-- order) take their turns from now on.
local function fair_turn_on(c, now)
  redis.call('HSET', k.meta, 'fair', '1')
  read_settings(c)
  c.fair = true
  if order_aging(c) and redis.call('ZCARD', k.ranked) > 0 then
    fair_activate('', now, now)
    return
  end
  local head = redis.call('ZRANGE', k.queue, 0, 0, 'WITHSCORES')
  if head[1] then fair_activate('', tonumber(head[2]), now) end
end

-- A fairness key sent in hex (its UTF-8 bytes): the key, or nil and why not.
local FAIR_KEY_MAX = 256
local function fair_key_from_hex(hex)
  if #hex < 2 or #hex > 2 * FAIR_KEY_MAX or #hex % 2 ~= 0 or not string.match(hex, '^%x+$') then
    return nil, 'must be 1..' .. FAIR_KEY_MAX .. ' bytes in hex'
  end
  local key = string.gsub(hex, '%x%x', function(c) return string.char(tonumber(c, 16)) end)
  if not valid_utf8(key) then return nil, 'must be valid UTF-8' end
  return key, nil
end

-- The fairness key of a task id ('' for the default key).
local function fair_key_of(id)
  return redis.call('HGET', k.fairkeys, id) or ''
end

-- Running task id leaves running (ended, retried or handed back): the slot of the key a
-- fair claim started it under comes back (once: the fairrun entry goes with it), and the
-- key, when it waited at its cap, takes its turns again and wakes one idle worker.
local function fair_slot_back(c, id)
  if not fair_on(c) then return end  -- fairrun is only written in a fair namespace
  local key = redis.call('HGET', k.fairrun, id)
  if not key then return end
  redis.call('HDEL', k.fairrun, id)
  local running = redis.call('HINCRBY', k.fair, 'run:' .. key, -1)
  if running <= 0 then redis.call('HDEL', k.fair, 'run:' .. key) end
  if redis.call('ZSCORE', k.fairfull, key) then
    local s = redis.call('HMGET', k.fair, 'cap:' .. key, 'cap')
    local cap = fair_cap(s[1], s[2])
    if not cap or running < cap then
      redis.call('ZREM', k.fairfull, key)
      redis.call('ZADD', k.fairready, fair_vt(), key)
      wake_idle(1, now_ms(c))
    end
  end
end
