-- pause.lua: pause one queued task, or resume it.
--
--- @include settle
--- @include inplace
--- @keys tasks queue meta idle states ranked waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys paused
--
-- pause: a ready or pending task stays in its state but cannot run (lib/inplace.lua): a
-- ready task's entry leaves queue, ranked or fairq (its fairness key's turn is dropped by
-- the next claim that finds it empty), a pending one gets one more awaited dependency in
-- its record, so that its dependencies releasing it leave it pending; paused gets
-- '<version> <now ms>'. The counts of the states do not change: a paused task is still
-- counted ready or pending.
-- resume: the pause is taken away: a ready task's entry is put back with the same member
-- (the same place, or the place an amend gave it), waking an idle worker when it is due;
-- a pending one awaits one dependency less and turns ready when it awaits none.
-- Only the current version is paused: a new version (schedule, retry, a schedule's fire)
-- is not, and cancel, expiry, purge and forget work on a paused task as on any other.
--
-- Reads and writes paused, tasks; reads fairkeys, fairfull, meta (order, aging_ms, fair);
-- writes queue, ranked, fairq, fairready, fairwait, meta (count:pending, count:ready when
-- a resumed pending task turns ready), idle, states (the per-state index, for a pending
-- task that turns ready). It receives waits and ended for the end of the call it shares
-- with the scripts that change tasks (end_call), and writes neither.
--
-- Publishes: nothing on ended (it ends no task: the end of the call it shares with the
-- scripts that do, '<state> <id>' on ended, has nothing to tell); 'ready' on the channel
-- of one idle worker (lib/idle.lua) when resume makes
-- the task claimable now, or makes it the queue head not due yet.
--
-- ARGV[1] 'pause' or 'resume'
-- ARGV[2] task id
-- ARGV[3] the version to pause or resume; '' for whatever version is current
--
-- Reply: { 0, outcome, state, version }: outcome 'applied', 'unchanged' (pause: already
--   paused; resume: not paused), 'not_queued' (not ready or pending: nothing to pause;
--   resume also removes a left-over entry then), 'not_found' (no such task; state and
--   version then ''), 'conflict' (ARGV[3] is not the current version: nothing changed).
-- Errors (nothing written): BADARG action, task_id, version; CORRUPT task record of <id>
--   <why>.
-- Cost: O(log N).

return run(function(c)
  repair_meta(c)
  local action = ARGV[1]
  if action ~= 'pause' and action ~= 'resume' then
    error({ err = 'BADARG action must be pause or resume' })
  end
  local id = check_id(ARGV[2], 'task_id')
  if #ARGV ~= 3 then error({ err = 'BADARG ARGV expected 3 values' }) end
  local version = nil
  if ARGV[3] ~= '' then
    version = string.match(ARGV[3], '^%d+$') and #ARGV[3] <= 16 and tonumber(ARGV[3])
    if not version or version > MAX_EXACT then
      error({ err = 'BADARG version must be an integer in [0, 2^53 - 1]' })
    end
  end
  local t = load_given(id)
  if not t then return { 0, 'not_found', '', '' } end
  local function reply(outcome) return { 0, outcome, t.state, t.version } end
  if version and version ~= t.version then return reply('conflict') end
  local paused = is_paused(id, t)
  local outcome = 'applied'
  if t.state ~= 'ready' and t.state ~= 'pending' then
    if action == 'resume' then redis.call('HDEL', k.paused, id) end
    outcome = 'not_queued'
  elseif action == 'pause' then
    if paused then
      outcome = 'unchanged'
    else
      if t.state == 'ready' then
        unqueue(c, t, id)
      else
        t.remaining = t.remaining + 1
        save_task(id, t)
      end
      redis.call('HSET', k.paused, id, itoa(t.version) .. ' ' .. now_text(c))
    end
  elseif not paused then
    -- A left-over entry of another version is removed.
    redis.call('HDEL', k.paused, id)
    outcome = 'unchanged'
  else
    redis.call('HDEL', k.paused, id)
    if t.state == 'ready' then
      enqueue(c, t, id)
    else
      t.remaining = math.max(0, t.remaining - 1)
      if t.remaining <= 0 and t.optional <= 0 then t.updated = now_ms(c) end
      save_pending(c, id, t)
    end
  end
  end_call(c)
  return reply(outcome)
end)
