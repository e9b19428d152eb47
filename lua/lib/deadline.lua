-- lib/deadline.lua: task deadlines (the deadlines sorted set) and expiring a task.
--
--- @include graph
--- @include ended
--
-- deadlines member: 14 hex digits of the version, then the task id; score: the deadline
-- (ms, server clock). Only versions scheduled with a deadline or ttl have one, so it is
-- fenced by version: an entry of an older version (the task was replaced, retried or
-- cancelled meanwhile) never applies to the current one, and is removed when the
-- housekeeping (expire.lua) reaches its time. claim.lua removes the entry of a version
-- it starts, and never starts one whose deadline has passed: it expires it instead.
--
-- Waitpoints (waitpoint.lua; a task scheduled with wait=<timeout>, its dependency list
-- led by the wait, lib/graph.lua) have one member each in the same set: 'w' then the
-- task id (never a version's member: 'w' is no hex digit), scored by when expire.lua
-- looks at it next. A waitpoint times out `timeout` ms after it starts waiting for its
-- completion: its record's last transition once it awaits nothing else (created, its
-- last own dependency settled, or a new version by retry or cascade), so the deadline
-- is its record's updated + timeout, whatever version it is. The member is scored:
-- - at that deadline while the current version waits for its completion;
-- - timeout ms later while it still awaits its own dependencies (checked again at most
--   a timeout apart, so once they settle the next look finds the exact deadline);
-- - max(timeout, WAITPOINT_RECHECK_MS) later once it ended: a retry or a cascade may
--   give it a new version that waits again (Scheduler.retry arms that one at once,
--   waitpoint.lua's arm); a record that is gone or no waitpoint's any more loses it.
-- So no call of a settling script needs this key, and a waitpoint costs one entry.

local EXPIRED_TEXT = 'expired: not started by its deadline'
local TIMED_OUT_TEXT = 'timed out waiting for completion'
local WAITPOINT_RECHECK_MS = 60 * 60 * 1000 -- an hour
-- The longest waitpoint timeout: a year.
local MAX_WAIT_MS = 365 * 24 * 60 * 60 * 1000 -- a year

local function deadline_member(version, id)
  return string.format('%014x', version) .. id
end

-- Split a deadlines member into (version, id); nil for junk.
local function parse_deadline_member(member)
  local head = string.sub(member, 1, 14)
  if #head ~= 14 or not string.match(head, '^%x+$') then return nil end
  return tonumber(head, 16), string.sub(member, 15)
end

-- End queued task id (t: its pending or ready record) cancelled (end_task, lib/ended.lua),
-- with the error text saying it expired; its dependents are told as for any cancel (a
-- propagation job).
local function expire_task(c, id, t, now)
  redis.call('ZREM', k.deadlines, deadline_member(t.version, id))
  end_task(c, id, t, 'cancelled', now)
  redis.call('HSET', k.results, id, 'E' .. EXPIRED_TEXT)
  needs_propagation(id)
end

-- Has the deadline of this version of id passed? The member of a deadline not passed
-- yet is kept in started[id]: the entry to remove if the claim starts it.
local function deadline_at(version, id, now, started)
  local member = deadline_member(version, id)
  local score = redis.call('ZSCORE', k.deadlines, member)
  if not score then return false end
  if tonumber(score) <= now then return true end
  started[id] = member
  return false
end

local function waitpoint_member(id)
  return 'w' .. id
end

-- When waitpoint t (its record; timeout: its list's, ms) times out: its last transition
-- plus the timeout while its current version waits for its completion (pending, nothing
-- else awaited); nil otherwise.
local function waitpoint_deadline(t, timeout)
  if t.state ~= 'pending' or t.remaining > 1 or t.optional > 0 then return nil end
  return t.updated + timeout
end

-- End waitpoint id (t: its pending record) failed: it timed out. Its dependents are told
-- as for any failure (a propagation job): the pending ones are blocked with it as root.
local function time_out_waitpoint(c, id, t, now)
  end_task(c, id, t, 'failed', now)
  redis.call('HSET', k.results, id, 'E' .. TIMED_OUT_TEXT)
  needs_propagation(id)
end

-- Score the waitpoint member of id (t: its record, timeout its list's) for the next look
-- (see the header); returns the score.
local function arm_waitpoint(id, t, timeout, now)
  local at = waitpoint_deadline(t, timeout)
  if not at then
    at = now + timeout
    if t.state ~= 'pending' then at = now + math.max(timeout, WAITPOINT_RECHECK_MS) end
  end
  redis.call('ZADD', k.deadlines, itoa(at), waitpoint_member(id))
  return at
end

-- expire.lua reached the waitpoint member of id at now: time it out when its deadline
-- passed, and score the member again (or remove it: no waitpoint of that id any more).
-- Returns true when it timed one out.
local function check_waitpoint(c, id, now)
  local t = not id_problem(id) and load_task(id)
  local timeout = t and waitpoint_timeout(decode_deps(redis.call('HGET', k.deps, id)))
  if not timeout then
    redis.call('ZREM', k.deadlines, waitpoint_member(id))
    return false
  end
  local at = waitpoint_deadline(t, timeout)
  local timed_out = at ~= nil and at <= now
  if timed_out then time_out_waitpoint(c, id, t, now) end
  arm_waitpoint(id, t, timeout, now)
  return timed_out
end
