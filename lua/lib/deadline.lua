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

local EXPIRED_TEXT = 'expired: not started by its deadline'

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
