-- lib/record.lua: helpers shared by every distsched script.
--
-- The script registry prepends this file to each transition script, so its
-- locals are in scope there. It touches no key by itself: every function takes
-- the key names it needs, which the callers received in KEYS.
--
-- Task record (field <task id> of the tasks hash), fields joined by '|':
--   state|version|attempt|max_attempts|backoff_ms|run_at_ms|priority|
--   cancel_requested|updated_ms|remaining|optional_remaining|worker
-- worker is last and may itself contain '|'.
--
-- Queue member: 8 hex digits of (2147483647 - priority), 14 hex digits of the
-- version (the namespace sequence at submission), then the task id. The score
-- is run_at in ms, so ZRANGE order is exactly (run_at, -priority, sequence).

local RECORD_PATTERN =
  '^(%a+)|(%d+)|(%d+)|(%d+)|(%d+)|(-?%d+)|(-?%d+)|(%d)|(%d+)|(%d+)|(%d+)|(.*)$'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function load_task(tasks_key, id)
  local raw = redis.call('HGET', tasks_key, id)
  if not raw then return nil end
  local s, v, a, ma, bo, ra, pr, cr, ut, rem, orem, w = string.match(raw, RECORD_PATTERN)
  if not s then return redis.error_reply('CORRUPT task record of ' .. id) end
  return {
    state = s, version = tonumber(v), attempt = tonumber(a), max_attempts = tonumber(ma),
    backoff_ms = tonumber(bo), run_at = tonumber(ra), priority = tonumber(pr),
    cancel = tonumber(cr), updated = tonumber(ut), remaining = tonumber(rem),
    optional = tonumber(orem), worker = w,
  }
end

local function save_task(tasks_key, id, t)
  redis.call('HSET', tasks_key, id, string.format('%s|%d|%d|%d|%d|%d|%d|%d|%d|%d|%d|%s',
    t.state, t.version, t.attempt, t.max_attempts, t.backoff_ms, t.run_at, t.priority,
    t.cancel, t.updated, t.remaining, t.optional, t.worker))
end

local function queue_member(t, id)
  return string.format('%08x%014x', 2147483647 - t.priority, t.version) .. id
end

-- Split a queue member back into (version, id).
local function parse_member(member)
  return tonumber(string.sub(member, 9, 22), 16), string.sub(member, 23)
end

-- Per-state counters live in the meta hash as count:<state>.
local function count_move(meta_key, from_state, to_state)
  if from_state then redis.call('HINCRBY', meta_key, 'count:' .. from_state, -1) end
  if to_state then redis.call('HINCRBY', meta_key, 'count:' .. to_state, 1) end
end

local TERMINAL = { succeeded = true, failed = true, cancelled = true, blocked = true }

-- Put a ready task into the queue; returns true when it became the head, so
-- the caller knows waiting workers should be woken.
local function enqueue(queue_key, t, id)
  local member = queue_member(t, id)
  redis.call('ZADD', queue_key, t.run_at, member)
  return redis.call('ZRANK', queue_key, member) == 0
end

-- A token is (version, attempt). The done hash keeps the most recent applied
-- tokens of an id so that a repeated report is told apart from a stale one.
local DONE_KEEP = 8

local function token_applied(done_key, id, version, attempt)
  local raw = redis.call('HGET', done_key, id)
  if not raw then return false end
  local needle = ' ' .. string.format('%d.%d', version, attempt) .. ' '
  return string.find(' ' .. raw .. ' ', needle, 1, true) ~= nil
end

local function remember_token(done_key, id, version, attempt)
  local raw = redis.call('HGET', done_key, id)
  local tokens = {}
  if raw then
    for tok in string.gmatch(raw, '%S+') do tokens[#tokens + 1] = tok end
  end
  tokens[#tokens + 1] = string.format('%d.%d', version, attempt)
  while #tokens > DONE_KEEP do table.remove(tokens, 1) end
  redis.call('HSET', done_key, id, table.concat(tokens, ' '))
end

-- Classify a report's token against the current record.
local function token_outcome(t, done_key, id, version, attempt)
  if t and t.state == 'running' and t.version == version and t.attempt == attempt then
    return 'applied'
  end
  if token_applied(done_key, id, version, attempt) then return 'duplicate' end
  return 'stale'
end

local function to_int(value, field)
  local n = tonumber(value)
  if not n or n ~= math.floor(n) then
    return nil, redis.error_reply('BADARG ' .. field .. ' must be an integer')
  end
  return n
end

-- Wake waiting workers when the fleet-wide capacity was full and a slot frees.
local function capacity_freed(meta_key, wake_channel, running_before)
  local limit = tonumber(redis.call('HGET', meta_key, 'max_running'))
  if limit and running_before >= limit then redis.call('PUBLISH', wake_channel, 'capacity') end
end

local function running_count(meta_key)
  return tonumber(redis.call('HGET', meta_key, 'count:running')) or 0
end

-- End a running attempt that failed (raised, or its lease expired): a new
-- attempt after backoff while attempts remain, otherwise failed. Returns true
-- when the task re-entered the queue at its head.
local function end_attempt_failed(k, id, t, now, reason)
  local running_before = running_count(k.meta)
  redis.call('ZREM', k.leases, id)
  t.worker = ''
  t.updated = now
  local woke = false
  -- A task whose cancellation was requested gets no new attempt; the request stays on record.
  if t.attempt < t.max_attempts and t.cancel == 0 then
    local delay = t.backoff_ms * 2 ^ (t.attempt - 1)
    if delay > 3600000 then delay = 3600000 end
    t.run_at = now + math.floor(delay)
    t.state = 'ready'
    count_move(k.meta, 'running', 'ready')
    save_task(k.tasks, id, t)
    woke = enqueue(k.queue, t, id)
  else
    t.state = 'failed'
    count_move(k.meta, 'running', 'failed')
    save_task(k.tasks, id, t)
    redis.call('ZADD', k.finished, now, id)
  end
  redis.call('HSET', k.results, id, 'E' .. reason)
  if woke then redis.call('PUBLISH', k.wake, 'ready') end
  capacity_freed(k.meta, k.wake, running_before)
end
