-- waitpoint.lua: complete or fail a waitpoint from any service, or arm its timer.
--
--- @include settle
--- @include deadline
--- @include tokens
--- @include payload
--- @keys tasks results queue finished meta idle
--- @keys edges deps blocked blockedby propagating states history ranked
--- @keys waits ended deadlines
--- @keys fair fairq fairready fairwait fairfull fairkeys fairrun
--- @keys parents window windows
--- @keys wake joins
--
-- A waitpoint is a task scheduled with the option wait=<timeout ms> (schedule.lua,
-- lib/admit.lua): its dependency list is led by the wait (lib/graph.lua), which counts
-- as one dependency nothing settles, so it stays pending and no claim ever sees it. Its
-- own dependencies (if any) settle as any task's; once it awaits nothing else it waits
-- for this script:
--   complete: pending -> succeeded; the value (one msgpack value, or '' for none) is
--             stored as its result, which its dependents read as any dependency's result
--   fail:     pending -> failed, the value its error text
-- Each applies once per version: the version ends as by a worker's report, its
-- dependents are released (complete) or blocked (fail) within the propagation budget,
-- the rest by propagate.lua, and its history gets the version's one attempt (attempt
-- 1, the worker field the caller's `by`), by which a second call is told 'duplicate'.
-- A call for a version other than the current one gets 'stale' (or 'duplicate' when
-- that version was completed or failed by a call); so does a call for a current version
-- that ended otherwise (timed out, cancelled, blocked). A call that comes when the
-- version's timeout has passed (lib/deadline.lua: its last transition plus the timeout)
-- times it out, as expire.lua would, and gets 'stale'.
--   arm:      score the waitpoint's timer for its current version now (lib/deadline.lua);
--             Scheduler.retry sends it after retry.lua, so that a retried waitpoint's
--             timeout is kept exactly. Changes no task.
--
-- Writes tasks, results, history, finished, meta, deadlines, and for dependents edges,
-- blocked, blockedby, queue, propagating. Also writes states (the per-state index, for
-- the records it writes).
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua), one per dependent
-- that settling makes claimable; '<state> <id>' on ended for each task it ends that a
-- client waits for, whose waits entry it removes (lib/ended.lua): the waitpoint, a
-- dependent blocked by it.
-- 'cancel <version> <id>' on wake for each running child of a first-n join it makes ready
-- (lib/settle.lua).
--
-- ARGV[1] propagation budget: the most edges to settle in this call (>= 1; a larger
--         one than MAX_PROPAGATE_BUDGET, 250, counts as that)
-- ARGV[2] action: 'complete', 'fail' or 'arm'
-- ARGV[3] task id (valid UTF-8, 1..512 bytes)
-- for complete and fail only (arm takes no more):
-- ARGV[4] version: '' for the current one, else the version the caller means (an
--         integer >= 1, at most 16 digits)
-- ARGV[5] complete: the payload, one msgpack value ('' for none; at most the namespace's
--         payload limit, 1048576 bytes unless an admin set less, MAX_PAYLOAD_VALUES
--         values, MAX_PAYLOAD_DEPTH deep, every string valid UTF-8);
--         fail: the error text (valid UTF-8, 1..MAX_ERROR_BYTES, 4096, bytes)
-- ARGV[6] by: who completes it, kept in the history's worker field ('' or valid UTF-8
--         of at most MAX_WORKER_ID_BYTES, 256, bytes)
--
-- Reply: complete, fail: { propagating jobs left, 'applied', 'duplicate' or 'stale' };
--   arm: { 0, 1 when the task is a waitpoint (its timer scored), else 0 }.
-- Errors (nothing written): BADARG action|task_id|version|payload|error|by|budget|ARGV
--   ...; NOTFOUND <id>; CONFLICT waitpoint <id> (the current version is no waitpoint);
--   CONFLICT dependencies <id> (it still awaits its own dependencies); CONFLICT state
--   <state> <id> (a waitpoint record that is ready or running: written by other means);
--   CORRUPT task record of <id> <why>.
-- Cost: O(log N) plus the payload check, plus the dependents settled within the
-- propagation budget.

return run(function(c)
  repair_meta(c)
  local budget = budget_arg(ARGV[1])
  local action = ARGV[2]
  if action ~= 'complete' and action ~= 'fail' and action ~= 'arm' then
    error({ err = 'BADARG action must be complete, fail or arm' })
  end
  local id = check_id(ARGV[3], 'task_id')
  local version, value, by = nil, nil, ''
  if action == 'arm' then
    if #ARGV ~= 3 then error({ err = 'BADARG ARGV expected 3 values for arm: budget action task_id' }) end
  else
    if #ARGV ~= 6 then
      error({ err = 'BADARG ARGV expected 6 values: budget action task_id version value by' })
    end
    if ARGV[4] ~= '' then
      version = #ARGV[4] <= 16 and string.match(ARGV[4], '^%d+$') and tonumber(ARGV[4])
      if not version or version < 1 then
        error({ err = 'BADARG version must be empty or an integer >= 1' })
      end
    end
    value = ARGV[5]
    if action == 'complete' then
      local limit = payload_limit(nil)
      if #value > limit then
        error({ err = string.format('BADARG payload is %d bytes, limit %d', #value, limit) })
      end
      if value ~= '' then
        local stop, why = skip(new_walk(LIMITS.MAX_PAYLOAD_VALUES), value, 1)
        if stop ~= #value + 1 then
          local reason = 'must be one msgpack value, every string valid UTF-8'
          if why == 'many' then reason = 'has more than ' .. LIMITS.MAX_PAYLOAD_VALUES .. ' values (MAX_PAYLOAD_VALUES)' end
          if why == 'deep' then reason = 'nests deeper than ' .. LIMITS.MAX_PAYLOAD_DEPTH .. ' levels (MAX_PAYLOAD_DEPTH)' end
          error({ err = 'BADARG payload ' .. reason })
        end
      end
    else
      if value == '' then error({ err = 'BADARG error must not be empty' }) end
      if #value > LIMITS.MAX_ERROR_BYTES then
        error({ err = string.format('BADARG error is %d bytes, limit %d (MAX_ERROR_BYTES)', #value, LIMITS.MAX_ERROR_BYTES) })
      end
      if not valid_utf8(value) then error({ err = 'BADARG error must be valid UTF-8' }) end
    end
    by = ARGV[6]
    if #by > LIMITS.MAX_WORKER_ID_BYTES or not valid_utf8(by) then
      error({ err = 'BADARG by must be valid UTF-8 of at most ' .. LIMITS.MAX_WORKER_ID_BYTES .. ' bytes' })
    end
  end
  local t = load_given(id)
  if not t then error({ err = 'NOTFOUND ' .. id }) end
  local now = now_ms(c)
  local timeout = waitpoint_timeout(decode_deps(redis.call('HGET', k.deps, id)))
  if action == 'arm' then
    local armed = 0
    if timeout then
      arm_waitpoint(id, t, timeout, now)
      armed = 1
    end
    end_call(c)
    return { 0, armed }
  end
  local outcome, ended = nil, {}
  if version and version ~= t.version then
    outcome = token_applied(id, version, 1) and 'duplicate' or 'stale'
  elseif not timeout then
    error({ err = 'CONFLICT waitpoint ' .. id })
  elseif TERMINAL[t.state] then
    outcome = token_applied(id, t.version, 1) and 'duplicate' or 'stale'
  elseif t.state ~= 'pending' then
    error({ err = 'CONFLICT state ' .. t.state .. ' ' .. id })
  elseif t.remaining > 1 or t.optional > 0 then
    error({ err = 'CONFLICT dependencies ' .. id })
  elseif waitpoint_deadline(t, timeout) <= now then
    -- Its timeout passed before the housekeeping reached it: it ends as expire.lua
    -- would have ended it, and the late call changes nothing else.
    time_out_waitpoint(c, id, t, now)
    arm_waitpoint(id, t, timeout, now)
    outcome = 'stale'
  else
    local state = action == 'complete' and 'succeeded' or 'failed'
    -- The version's one attempt: from when it started waiting (its last transition) to
    -- now, by the caller.
    t.attempt = 1
    t.worker = by
    record_attempt(id, t, now, state, action == 'fail' and error_summary(value) or nil)
    t.worker = ''
    end_task(c, id, t, state, now)
    if action == 'fail' then
      redis.call('HSET', k.results, id, 'E' .. value)
    elseif value ~= '' then
      redis.call('HSET', k.results, id, 'R' .. value)
    else
      redis.call('HDEL', k.results, id)
    end
    ended[1] = id
    outcome = 'applied'
  end
  local left = settle_after_terminal(c, ended, now, budget)
  end_call(c)
  return { left, outcome }
end)
