-- dep_results.lua: read what a task's dependencies ended with, all at once, bounded.
--
--- @include graph
--- @keys tasks results deps
--
-- For a task (the running attempt of a join, an operator's read), the state, version and
-- stored result or error of each of its dependencies, read in one atomic call: either
-- every entry asked for is in the reply, or the call is refused and nothing is read.
-- A task reads only what it depends on: the dependency list of its current version
-- (deps), the hold left out. The result is the dependency's current version's (results
-- holds only that one): a dependency retried to a version that has not ended has none.
--
-- Bounds (lib/limits.lua): at most MAX_DEP_RESULTS (1000) dependencies per call, and
-- their stored results and errors together at most MAX_DEP_RESULT_BYTES (2097152), both
-- counted before anything is read (HSTRLEN), except that one dependency asked alone is
-- always read whole (as a status read would). Beyond either: TOOBIG, nothing read.
--
-- Reads tasks, results, deps; writes nothing.
--
-- Publishes: nothing.
--
-- ARGV[1] task id
-- ARGV[2] version: the task's version the caller runs ('' for whichever is current);
--         another current version is refused (CONFLICT version)
-- ARGV[3] n: 0 for every dependency of the task, in the order they were given; else n
--         (at most MAX_DEP_RESULTS) distinct dependency ids follow
-- ARGV[4..3+n] the dependency ids asked for
--
-- Reply: { 0, the task's version, m, (id, kind, state, version, stored) * m }: kind 'r'
-- required or 'o' optional; state a state name ('succeeded', 'failed', 'cancelled',
-- 'blocked', 'pending', 'ready', 'running'), 'missing' (no record: purged or forgotten)
-- or 'corrupt' (a record that cannot be read); version 0 for those two; stored the
-- results entry as it is ('R' .. msgpack result, 'E' .. error text) or '' for none.
-- Errors: BADARG task_id / version / n / ids ...; NOTFOUND <id>; CONFLICT version <id>;
-- CORRUPT task record of <id> ... (the task's own record); NOTDEP <hex id> <hex dep>
-- (an id asked for is not a dependency of the task's current version); TOOBIG deps
-- <count> <hex id> (the task has more dependencies than one call reads); TOOBIG bytes
-- <total> <hex id> (the results asked for hold more bytes than one call reads).
-- Cost: O(deps of the task + m) commands, m <= 1000; the reply at most about 2 MiB of
-- results plus the ids.

return run(function(c)
  local id = check_id(ARGV[1], 'task_id')
  local version = nil
  if ARGV[2] == nil then error({ err = 'BADARG ARGV expected task id, version, n' }) end
  if ARGV[2] ~= '' then
    version = to_int(ARGV[2], 'version')
    if version < 1 or version > 9007199254740991 then error({ err = 'BADARG version out of range' }) end
  end
  local n = to_int(ARGV[3], 'n')
  if n < 0 or n > LIMITS.MAX_DEP_RESULTS then
    error({ err = 'BADARG n must be in [0, ' .. LIMITS.MAX_DEP_RESULTS .. '] (MAX_DEP_RESULTS)' })
  end
  if #ARGV ~= 3 + n then error({ err = 'BADARG ARGV expected n dependency ids' }) end
  local asked = {}
  for i = 4, 3 + n do
    local dep = check_id(ARGV[i], 'ids')
    if asked[dep] then error({ err = 'BADARG ids ' .. dep .. ' is asked for twice' }) end
    asked[dep] = true
  end
  local t = load_given(id)
  if not t then error({ err = 'NOTFOUND ' .. id }) end
  if version and t.version ~= version then error({ err = 'CONFLICT version ' .. id }) end
  local kinds, all = {}, {}
  for _, d in ipairs(decode_deps(redis.call('HGET', k.deps, id))) do
    if d.kind ~= 'h' then
      kinds[d.id] = d.kind
      all[#all + 1] = d.id
    end
  end
  local ids = all
  if n == 0 then
    if #all > LIMITS.MAX_DEP_RESULTS then
      error({ err = 'TOOBIG deps ' .. #all .. ' ' .. hex_id(id) })
    end
  else
    ids = {}
    for i = 4, 3 + n do
      local dep = ARGV[i]
      if not kinds[dep] then error({ err = 'NOTDEP ' .. hex_id(id) .. ' ' .. hex_id(dep) }) end
      ids[#ids + 1] = dep
    end
  end
  if #ids > 1 then
    local total = 0
    for _, dep in ipairs(ids) do total = total + redis.call('HSTRLEN', k.results, dep) end
    if total > LIMITS.MAX_DEP_RESULT_BYTES then
      error({ err = 'TOOBIG bytes ' .. total .. ' ' .. hex_id(id) })
    end
  end
  local reply = { 0, t.version, #ids }
  if #ids == 0 then return reply end
  -- One HMGET per hash for the whole list: a redis.call per id costs more than the read.
  local records = redis.call('HMGET', k.tasks, unpack(ids))
  local stored = redis.call('HMGET', k.results, unpack(ids))
  for i, dep in ipairs(ids) do
    local state, dv = 'missing', 0
    if records[i] then
      local d, why = read_task(dep, records[i])
      if why then state = 'corrupt' else state, dv = d.state, d.version end
    end
    local at = #reply
    reply[at + 1] = dep
    reply[at + 2] = kinds[dep]
    reply[at + 3] = state
    reply[at + 4] = dv
    reply[at + 5] = stored[i] or ''
  end
  return reply
end)
