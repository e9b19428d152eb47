-- lib/admit.lua: admission policies of schedule.lua (dedupe, debounce) and deadlines.
--
--- @include deadline
--
-- A task spec may end with option tokens after its eight fields, each ' name=value'
-- (value a decimal integer, ms):
--   dedupe=<window>   keep an existing pending, ready or running version, and a terminal
--                     one that ended less than <window> ms ago (0: only while it is queued
--                     or running); the call then writes nothing for that task and replies
--                     with the existing version
--   debounce=<max>    replace a queued version as usual, but never let the start move
--                     later than <max> ms after the first submission of the burst
--   deadline=<ms>     the new version expires (ends cancelled) if not started by this
--                     epoch ms (lib/deadline.lua)
--   ttl=<ms>          the same, <ms> after the call (server clock); not with deadline
--   key=<hex>         the fairness key (tenant) of the new version, its UTF-8 bytes in hex
--                     (1..256 bytes; lib/fair.lua)
--   cost=<units>      the units of its fairness key's rate the task takes when it starts
--                     (1..1000000000; 1 when not given; lib/fair.lua)
--   hold=1            the new version is held (pending) until add_deps.lua's last part
--                     lifts the hold: its dependencies are placed in parts (lib/graph.lua)
--   wait=<timeout>    the new version is a waitpoint (lib/deadline.lua): pending until
--                     waitpoint.lua completes or fails it, never claimed; it times out
--                     (ends failed) <timeout> ms (1..MAX_WAIT_MS) after it starts waiting
--                     for its completion; not with hold, debounce, deadline or ttl
-- A spec with no option costs one empty-string comparison.
--
-- The burst of a debounced task is kept in the debounce hash (field: task id, value
-- '<version> <first submission ms>'), only for tasks scheduled with debounce. It is
-- fenced by version: an entry whose version is not the current queued one starts a
-- new burst, so an entry left behind (the task ran, was replaced without debounce) is
-- harmless; schedule.lua removes it when it writes a version without debounce, and
-- lib/forget.lua with the task.

local MAX_ADMIT_MS = 9007199254740991
local MAX_KEY_BYTES = 256
local OPTION_FIELD = {
  dedupe = 'dedupe_window', debounce = 'debounce', deadline = 'deadline', ttl = 'ttl', hold = 'hold',
  wait = 'timeout',
  cost = 'cost',
}
-- The most units one task may take of its key's rate (MAX_COST of lib/fair.lua).
local MAX_TASK_COST = 1000000000

-- The options of a spec from the text after its eight fields; nil when there is none.
local function admission_options(rest, id)
  if rest == '' then return nil end
  local opts, pos = {}, 1
  while pos <= #rest do
    local ka, kb, hex = string.find(rest, '^ key=(%x*)', pos)
    if ka then
      -- The fairness key (lib/fair.lua), in hex: any UTF-8 text of 1..MAX_KEY_BYTES bytes.
      if opts.key then error({ err = 'BADARG key of ' .. id .. ' given twice' }) end
      if #hex == 0 or #hex % 2 == 1 or #hex > 2 * MAX_KEY_BYTES then
        error({ err = 'BADARG key of ' .. id .. ' must be 1..' .. MAX_KEY_BYTES .. ' bytes in hex' })
      end
      local key = string.gsub(hex, '%x%x', function(c) return string.char(tonumber(c, 16)) end)
      if not valid_utf8(key) then error({ err = 'BADARG key of ' .. id .. ' must be valid UTF-8' }) end
      opts.key = key
      pos = kb + 1
    end
    if pos > #rest then break end
    local a, b, name, value = string.find(rest, '^ (%l+)=(%d+)', pos)
    if not a then
      error({ err = 'BADARG spec of ' .. id .. ' options must be: dedupe=<window ms>, debounce=<max wait ms>, deadline=<epoch ms>, ttl=<ms>, hold=1, wait=<timeout ms>, cost=<units> or key=<hex>' })
    end
    if not OPTION_FIELD[name] then
      error({ err = 'BADARG spec of ' .. id .. ' unknown option ' .. name })
    end
    if opts[name] then error({ err = 'BADARG ' .. name .. ' of ' .. id .. ' given twice' }) end
    local field = OPTION_FIELD[name]
    if #value > 16 then error({ err = 'BADARG ' .. field .. ' of ' .. id .. ' out of range' }) end
    local ms = tonumber(value)
    if name == 'hold' and ms ~= 1 then error({ err = 'BADARG hold of ' .. id .. ' must be 1' }) end
    if name == 'cost' and (ms < 1 or ms > MAX_TASK_COST) then
      error({ err = 'BADARG cost of ' .. id .. ' must be an integer in [1, ' .. MAX_TASK_COST .. ']' })
    end
    if ms > MAX_ADMIT_MS then error({ err = 'BADARG ' .. field .. ' of ' .. id .. ' out of range' }) end
    if name == 'wait' and (ms < 1 or ms > MAX_WAIT_MS) then
      error({ err = 'BADARG timeout of ' .. id .. ' must be in [1, ' .. MAX_WAIT_MS .. '] ms' })
    end
    opts[name] = ms
    pos = b + 1
  end
  if opts.dedupe and opts.debounce then
    error({ err = 'BADARG debounce of ' .. id .. ' cannot be combined with dedupe' })
  end
  if opts.deadline and opts.ttl then
    error({ err = 'BADARG ttl of ' .. id .. ' cannot be combined with deadline' })
  end
  if opts.wait then
    -- A waitpoint is never queued: no run time to debounce, its timeout is its deadline,
    -- and its dependencies go in one call.
    for _, other in ipairs({ 'hold', 'debounce', 'deadline', 'ttl' }) do
      if opts[other] then
        error({ err = 'BADARG ' .. OPTION_FIELD[other] .. ' of ' .. id .. ' cannot be combined with wait (a waitpoint)' })
      end
    end
  end
  return opts
end

local QUEUED_OR_RUNNING = { pending = true, ready = true, running = true }

-- The deadline (epoch ms) opts give a version written at now, or nil.
local function deadline_of(opts, now)
  if opts.ttl then return now + opts.ttl end
  return opts.deadline
end

-- Does dedupe keep the existing version old (nil: none) of a task at now?
local function dedupe_keeps(window, old, now)
  if not old then return false end
  if QUEUED_OR_RUNNING[old.state] then return true end
  return window > 0 and now - old.updated < window
end

-- The run_at of a debounced version of id (old: its current record or nil), and the
-- first submission of its burst.
local function debounce_run_at(id, max_wait, old, run_at, now)
  local first = now
  if old and (old.state == 'pending' or old.state == 'ready') then
    local entry = redis.call('HGET', k.debounce, id)
    local v, at = string.match(entry or '', '^(%d+) (-?%d+)$')
    if v and tonumber(v) == old.version then first = tonumber(at) end
  end
  local latest = first + max_wait
  if run_at > latest then run_at = latest end
  return run_at, first
end
