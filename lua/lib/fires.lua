-- lib/fires.lua: schedules' next fire times in the workers' wake-ups.
--
--- @include record
--- @include payload
--- @include idle
--
-- The fires sorted set holds, per schedule, the time (ms) of its next slot. claim.lua
-- reads its head: a due head makes the claim reply 'fire' (the worker runs fire.lua,
-- then claims again), and a head not due yet counts like a queue head not due yet for
-- the delay hint and the timer (the meta fields timer, timer_at). A script that moves a
-- schedule's next fire calls fires_changed: when the head is now earlier than what the
-- timer worker waits for, or no live idle worker holds the timer, one idle worker is
-- woken, and its claim makes it the timer for that head.

local function fires_changed(now)
  local head = redis.call('ZRANGE', k.fires, 0, 0, 'WITHSCORES')
  if not head[1] then return end
  local at = tonumber(head[2])
  local timer = redis.call('HMGET', k.meta, 'timer', 'timer_at')
  local timer_at = tonumber(timer[2])
  if at <= now or not idle_live(timer[1], now) or not timer_at or at < timer_at then
    wake_idle(1, now)
  end
end

-- A schedule name: valid UTF-8 of 1..256 bytes, so that the task id of a slot
-- (<name>@<ms>) is a valid task id.
local MAX_NAME_BYTES = 256

local function check_name(name)
  if not name or name == '' then error({ err = 'BADARG name must not be empty' }) end
  if #name > MAX_NAME_BYTES then
    error({ err = 'BADARG name must be at most ' .. MAX_NAME_BYTES .. ' bytes in UTF-8' })
  end
  if not valid_utf8(name) then error({ err = 'BADARG name must be valid UTF-8' }) end
  return name
end

-- Firing state (field <name> of the firing hash): rev|fired|skipped|missed|last task id.
-- rev names the definition it belongs to (a new one per put); the last task id is what
-- the overlap policy looks at. A value that does not parse counts as a fresh state.
local FIRING_PATTERN = '^([^|]+)|(%d+)|(%d+)|(%d+)|(.*)$'

local function read_firing(name)
  local raw = redis.call('HGET', k.firing, name)
  local rev, fired, skipped, missed, last = string.match(raw or '', FIRING_PATTERN)
  if not rev then return nil end
  return { rev = rev, fired = tonumber(fired), skipped = tonumber(skipped),
           missed = tonumber(missed), last = last }
end

local function save_firing(name, f)
  redis.call('HSET', k.firing, name,
    string.format('%s|%d|%d|%d|%s', f.rev, f.fired, f.skipped, f.missed, f.last))
end

-- An integer argument in plain decimal within [lo, hi], or BADARG naming field.
local function int_arg(text, field, lo, hi)
  if not text or not string.match(text, '^-?%d+$') then
    error({ err = 'BADARG ' .. field .. ' must be an integer' })
  end
  return bounded(text, field, lo, hi)
end
