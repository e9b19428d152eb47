-- lib/record.lua: task records, the queue, tokens and counters.
--
-- Prepended (after lib/keys.lua, which defines k) to every transition script.
--
-- Task record (field <task id> of the tasks hash), fields joined by '|' (state as
-- one letter: p pending, r ready, x running, s succeeded, f failed, c cancelled,
-- b blocked):
--   state|version|attempt|max_attempts|backoff_ms|run_at_ms|priority|
--   cancel_requested|updated_delta_ms|remaining|optional_remaining|worker
-- updated_delta_ms is the time of the last transition minus run_at: 0 for a task
-- submitted due now, which keeps a queued record within a smaller allocation.
-- worker is last and may itself contain '|'. remaining counts the required
-- dependencies not yet succeeded, optional_remaining the optional ones not
-- yet terminal.
--
-- Queue member: 8 hex digits of (2147483647 - priority), 14 hex digits of the
-- version (the namespace sequence at submission), then the task id. The score
-- is run_at in ms, so ZRANGE order is exactly (run_at, -priority, sequence).

local RECORD_PATTERN =
  '^(%a+)|(%d+)|(%d+)|(%d+)|(%d+)|(-?%d+)|(-?%d+)|(%d)|(-?%d+)|(%d+)|(%d+)|(.*)$'

local TERMINAL = { succeeded = true, failed = true, cancelled = true, blocked = true }

-- States are stored as one letter (a queued record then fits a smaller allocation).
local STATE_CODE = {
  pending = 'p', ready = 'r', running = 'x', succeeded = 's', failed = 'f', cancelled = 'c',
  blocked = 'b',
}
local STATE_NAME = {}
for name, code in pairs(STATE_CODE) do STATE_NAME[code] = name end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Returns the record table, nil for an unknown id; raises on a corrupt record.
-- raw: the stored record when the caller already read it.
local function load_task(id, raw)
  raw = raw or redis.call('HGET', k.tasks, id)
  if not raw then return nil end
  local s, v, a, ma, bo, ra, pr, cr, ut, rem, orem, w = string.match(raw, RECORD_PATTERN)
  if not s or not STATE_NAME[s] then error({ err = 'CORRUPT task record of ' .. id }) end
  return {
    state = STATE_NAME[s], version = tonumber(v), attempt = tonumber(a), max_attempts = tonumber(ma),
    backoff_ms = tonumber(bo), run_at = tonumber(ra), priority = tonumber(pr),
    cancel = tonumber(cr), updated = tonumber(ra) + tonumber(ut), remaining = tonumber(rem),
    optional = tonumber(orem), worker = w,
  }
end

local function encode_task(t)
  return string.format('%s|%d|%d|%d|%d|%d|%d|%d|%d|%d|%d|%s',
    STATE_CODE[t.state], t.version, t.attempt, t.max_attempts, t.backoff_ms, t.run_at, t.priority,
    t.cancel, t.updated - t.run_at, t.remaining, t.optional, t.worker)
end

local function save_task(id, t)
  redis.call('HSET', k.tasks, id, encode_task(t))
end

-- Send one command with many trailing arguments (field/value or score/member pairs),
-- in slices that stay within Lua's argument limit.
local function call_many(command, key, args)
  for i = 1, #args, 1000 do
    redis.call(command, key, unpack(args, i, math.min(i + 999, #args)))
  end
end

local function queue_member(t, id)
  return string.format('%08x%014x', 2147483647 - t.priority, t.version) .. id
end

-- Split a queue member back into (version, id).
local function parse_member(member)
  return tonumber(string.sub(member, 9, 22), 16), string.sub(member, 23)
end

-- Per-state counters live in the meta hash as count:<state>. A script tallies its
-- moves and writes each changed counter once, when its body has succeeded.
local count_delta = {}

local function count_move(from_state, to_state)
  if from_state then count_delta[from_state] = (count_delta[from_state] or 0) - 1 end
  if to_state then count_delta[to_state] = (count_delta[to_state] or 0) + 1 end
end

-- Put a ready task into the queue. Waiting workers are woken once, at the end of
-- the script, if one of the entries it added is then the queue head.
local enqueued = {}

local function enqueue(t, id)
  local member = queue_member(t, id)
  redis.call('ZADD', k.queue, t.run_at, member)
  enqueued[member] = true
end

-- A token is (version, attempt). The done hash keeps the most recent applied
-- tokens of an id so that a repeated report is told apart from a stale one.
local DONE_KEEP = 8

local function token_applied(id, version, attempt)
  local raw = redis.call('HGET', k.done, id)
  if not raw then return false end
  local needle = ' ' .. string.format('%d.%d', version, attempt) .. ' '
  return string.find(' ' .. raw .. ' ', needle, 1, true) ~= nil
end

local function remember_token(id, version, attempt)
  local raw = redis.call('HGET', k.done, id)
  local tokens = {}
  if raw then
    for tok in string.gmatch(raw, '%S+') do tokens[#tokens + 1] = tok end
  end
  tokens[#tokens + 1] = string.format('%d.%d', version, attempt)
  while #tokens > DONE_KEEP do table.remove(tokens, 1) end
  redis.call('HSET', k.done, id, table.concat(tokens, ' '))
end

-- Classify a report's token against the current record.
local function token_outcome(t, id, version, attempt)
  if t and t.state == 'running' and t.version == version and t.attempt == attempt then
    return 'applied'
  end
  if token_applied(id, version, attempt) then return 'duplicate' end
  return 'stale'
end

local function to_int(value, field)
  local n = tonumber(value)
  if not n or n ~= math.floor(n) then
    error({ err = 'BADARG ' .. field .. ' must be an integer' })
  end
  return n
end

local function running_count()
  return (tonumber(redis.call('HGET', k.meta, 'count:running')) or 0) + (count_delta.running or 0)
end

-- Wake waiting workers when the fleet-wide capacity was full and a slot frees.
local function capacity_freed(running_before)
  local limit = tonumber(redis.call('HGET', k.meta, 'max_running'))
  if limit and running_before >= limit then redis.call('PUBLISH', k.wake, 'capacity') end
end

-- Run a script body; an error raised as {err = 'CODE ...'} becomes that error reply.
-- After a body that succeeded: the tallied counters, then the wake-up.
local function run(body)
  local ok, res = pcall(body)
  if ok then
    for state, delta in pairs(count_delta) do
      if delta ~= 0 then redis.call('HINCRBY', k.meta, 'count:' .. state, delta) end
    end
    if next(enqueued) then
      local head = redis.call('ZRANGE', k.queue, 0, 0)
      if head[1] and enqueued[head[1]] then redis.call('PUBLISH', k.wake, 'ready') end
    end
    return res
  end
  if type(res) == 'table' and res.err then return redis.error_reply(res.err) end
  return redis.error_reply('ERR ' .. tostring(res))
end
