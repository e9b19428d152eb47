-- amend.lua: change the priority, due time or attempt budget of a task in place.
--
--- @include payload
--- @include settle
--- @include inplace
--- @keys tasks queue meta idle states ranked waits ended
--- @keys fair fairq fairready fairwait fairfull fairkeys paused
--
-- No state changes, and no new version. Priority and due time change only for a queued
-- task (ready or pending): the record is rewritten with the new values, and a ready
-- task's entry (lib/inplace.lua: in queue, ranked or fairq) is taken out and put back
-- at its new place with the same version, so among tasks of equal due time and priority
-- it keeps its place (in the priority order its rank follows the new values, as if it
-- had been scheduled with them). A paused task (lib/inplace.lua) only has its record
-- rewritten: resume puts it at its new place. max_attempts changes for a ready, pending
-- or running task (the budget the next failure or lost lease checks); it may not go
-- below the attempt that runs now (running) or runs next (attempt + 1). The time of the
-- record's last transition, its deadline, fairness key and dependencies stay as they
-- were. All changes of the call apply together or none does.
--
-- Reads paused, fairkeys, meta (order, aging_ms, fair), fairfull; writes tasks, and for a
-- ready task that is not paused queue, ranked, fairq, fairready, fairwait (lib/queue.lua's
-- enqueue) and idle. It receives states, waits and ended for the end of the call it
-- shares with the scripts that change tasks (end_call), and writes none of them.
--
-- Publishes: nothing on ended (it ends no task: the end of the call it shares with the
-- scripts that do, '<state> <id>' on ended, has nothing to tell); 'ready' on the channel
-- of one idle worker (lib/idle.lua) when the change
-- makes the task due now, or makes it the queue head not due yet.
--
-- ARGV[1] task id
-- ARGV[2] the version the change is for; '' for whatever version is current
-- ARGV[3] priority (integer in [-2^31, 2^31 - 1]); '' to keep it
-- ARGV[4] time mode: 'at' (ARGV[5] is an absolute epoch ms) or 'in' (ms from the
--         server's now); '' to keep the due time (ARGV[5] then '')
-- ARGV[5] time (integer ms, within +-(2^53 - 1) for 'at', +-2^52 for 'in')
-- ARGV[6] max_attempts (integer in [1, 1000000]); '' to keep it
--
-- Reply: { 0, outcome, state, version }: outcome 'applied' (every change given was made),
--   'not_queued' (priority or due time given for a task that is not ready or pending, or
--   max_attempts for one that is not ready, pending or running: nothing changed),
--   'not_found' (no such task; state and version then ''), 'conflict' (ARGV[2] is not
--   the current version: nothing changed); state and version are the task's.
-- Errors (nothing written): BADARG task_id, version, priority, run_at, delay,
--   max_attempts (out of range, or below the attempt that runs now or next:
--   'BADARG max_attempts must be at least <n> ...'), BADARG amend ... (nothing to
--   change); CORRUPT task record of <id> <why>.
-- Cost: O(log N).

local INTEGER = '^-?%d+$'

local function int_arg(text, field, lo, hi)
  if not string.match(text, INTEGER) then
    error({ err = 'BADARG ' .. field .. ' must be an integer' })
  end
  return bounded(text, field, lo, hi)
end

return run(function(c)
  local id = check_id(ARGV[1], 'task_id')
  if #ARGV ~= 6 then error({ err = 'BADARG ARGV expected 6 values' }) end
  local version = nil
  if ARGV[2] ~= '' then version = int_arg(ARGV[2], 'version', 0, MAX_MS) end
  local priority = nil
  if ARGV[3] ~= '' then priority = int_arg(ARGV[3], 'priority', -2147483648, 2147483647) end
  local mode, run_at = ARGV[4], nil
  if mode == 'at' then
    run_at = int_arg(ARGV[5], 'run_at', -MAX_MS, MAX_MS)
  elseif mode == 'in' then
    run_at = now_ms(c) + int_arg(ARGV[5], 'delay', -MAX_DELAY_MS, MAX_DELAY_MS)
  elseif mode ~= '' or ARGV[5] ~= '' then
    error({ err = 'BADARG run_at time mode must be at, in or empty' })
  end
  local max_attempts = nil
  if ARGV[6] ~= '' then max_attempts = int_arg(ARGV[6], 'max_attempts', 1, MAX_ATTEMPTS) end
  if not (priority or run_at or max_attempts) then
    error({ err = 'BADARG amend needs priority, a due time or max_attempts' })
  end

  local t = load_given(id)
  if not t then return { 0, 'not_found', '', '' } end
  local function reply(outcome) return { 0, outcome, t.state, t.version } end
  if version and version ~= t.version then return reply('conflict') end
  local queued = t.state == 'ready' or t.state == 'pending'
  if (priority or run_at) and not queued then return reply('not_queued') end
  if max_attempts then
    if not queued and t.state ~= 'running' then return reply('not_queued') end
    local least = t.attempt + ((t.state == 'running') and 0 or 1)
    if max_attempts < least then
      error({ err = 'BADARG max_attempts must be at least ' .. least
        .. ' (the attempt that runs now or next)' })
    end
    t.max_attempts = max_attempts
  end
  local moves = t.state == 'ready' and (priority or run_at) and not is_paused(id, t)
  if moves then unqueue(c, t, id) end
  if priority then t.priority = priority end
  if run_at then t.run_at = run_at end
  save_task(id, t)
  if moves then enqueue(c, t, id) end
  end_call(c)
  return reply('applied')
end)
