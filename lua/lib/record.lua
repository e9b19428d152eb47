-- lib/record.lua: task records and queue members.
--
--- @include run
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
local STATE_NAME = {
  p = 'pending', r = 'ready', x = 'running', s = 'succeeded', f = 'failed', c = 'cancelled',
  b = 'blocked',
}

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
