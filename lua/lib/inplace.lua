-- lib/inplace.lua: changing a queued task where it is (amend.lua, pause.lua).
--
--- @include queue
--
-- A ready task's live entry is its queue member (lib/record.lua) in one of: queue (the
-- default order, or the delayed set of the priority order), ranked (the ready set of
-- the priority order), or, for a task of a fairness key other than the default one,
-- fairq in its key's delayed or ranked section (lib/ranked.lua, lib/fair.lua). Each
-- place's member is computed from the record (due time, priority, version, id, and
-- the key), so the entry is found without a walk. Taking it out and putting it back
-- with the same version (enqueue) gives it back its place: among entries of equal due
-- time and priority, the version orders them.
--
-- Paused tasks (hash paused: task id -> '<version> <paused at ms>'). The entry counts
-- only while its version is the task's current one and the task is queued (ready or
-- pending); any other entry is left over (a new version, a cancel, an expiry) and means
-- nothing: resume removes it, purge and forget remove it with the task. A paused ready
-- task has no queue entry at all, so no claim can reach it. A paused pending task
-- carries the pause as one more required dependency in its record's remaining count
-- (as the hold of a task placed in parts does), so settling its dependencies cannot
-- make it ready: resume takes that one away again.

-- Remove the live entry of ready task id (t: its record as read). Returns how many
-- members were removed (0 when the entry was missing).
local function unqueue(c, t, id)
  local member = queue_member(t, id)
  local removed = redis.call('ZREM', k.queue, member) + redis.call('ZREM', k.ranked, member)
  if fair_on(c) then
    local key = fair_key_of(id)
    if key ~= '' then
      local prefix, due = fair_prefix(key), fair_due(t.run_at)
      removed = removed + redis.call('ZREM', k.fairq, fairq_delayed_member(prefix, due, member))
      local aging = order_aging(c)
      if aging then
        removed = removed + redis.call('ZREM', k.fairq, fairq_ranked_member(prefix, due, member, aging))
      end
    end
  end
  return removed
end

-- The version id's paused entry names, or nil when it has none (or junk).
local function paused_version(id)
  local entry = redis.call('HGET', k.paused, id)
  if not entry then return nil end
  return tonumber(string.match(entry, '^(%d+) '))
end

-- Whether task id (t: its record) is paused: queued, and its entry names this version.
local function is_paused(id, t)
  if t.state ~= 'ready' and t.state ~= 'pending' then return false end
  return paused_version(id) == t.version
end
