-- forget.lua: remove given terminal tasks now, whatever their age.
--
--- @include forget
--- @keys tasks payloads results done finished meta
--- @keys edges deps blocked blockedby propagating states history
--- @keys debounce progress checkpoints
--- @keys idle fair fairready fairfull fairkeys fairrun paused costs
--- @keys parents spawned
--
-- succeeded / failed / cancelled / blocked -> (gone), exactly as purge.lua removes a
-- task past the retention (the record, payload, result, applied tokens, history,
-- dependency list, block cause and every edge to or from it), for the ids given. An id
-- that is not terminal (or whose record cannot be read), or that is still telling its
-- dependents that it ended, is refused: left as it is and counted. An unknown id (for
-- example one removed already) is skipped, so the same call may be sent again.
--
-- Reads propagating; writes tasks, payloads, results, done, debounce, paused, finished,
-- meta (count:<state>), edges, deps, blocked, blockedby, states, history, fairkeys,
-- progress, checkpoints, costs. It receives idle, fair, fairready, fairfull and fairrun
-- and touches none of them (a terminal task holds no slot of its fairness key).
--
-- Publishes: nothing.
--
-- ARGV[1] n, the number of ids (0 to 1000); then n task ids
--
-- Reply: { 0, tasks removed, tasks refused }.
-- Errors: BADARG n ...; BADARG task_id ... (an id that is no valid task id).
-- Cost: O(m (deps + dependents + log N)) for m removed tasks.

return run(function(c)
  repair_meta(c)
  local n = to_int(ARGV[1], 'n')
  if n < 0 or n > 1000 then error({ err = 'BADARG n must be in [0, 1000]' }) end
  if #ARGV ~= 1 + n then error({ err = 'BADARG ARGV expected n task ids' }) end
  for i = 2, n + 1 do check_id(ARGV[i], 'task_id') end
  local removed, refused = 0, 0
  for i = 2, n + 1 do
    local id = ARGV[i]
    local t, why = read_task(id)
    if t or why then
      if why or not TERMINAL[t.state] or redis.call('ZSCORE', k.propagating, 'p' .. id) then
        refused = refused + 1
      else
        remove_task(c, id, t)
        removed = removed + 1
      end
    end
  end
  write_counts(c)
  return { 0, removed, refused }
end)
