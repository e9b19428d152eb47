-- lib/record.lua: task records and queue members.
--
--- @include run
--- @include limits
--
-- Task record (field <task id> of the tasks hash): twelve msgpack values one after the
-- other (no array header), the state as a one-letter string (p pending, r ready,
-- x running, s succeeded, f failed, c cancelled, b blocked), ten integers, the worker
-- as a string:
--   state version attempt max_attempts backoff_ms run_at_ms priority
--   cancel_requested updated_delta_ms remaining optional_remaining worker
-- cmsgpack reads it in one C call, where a text record cost a twelve-capture pattern
-- match and ten tonumber calls per read (most of the time of claim, complete and
-- heartbeat), and it is smaller. Records written as text by earlier versions,
-- the same fields joined by '|' (worker last, may itself contain '|'), are still
-- read; a script that saves one writes it as msgpack.
-- updated_delta_ms is the time of the last transition minus run_at: 0 for a task
-- submitted due now, which keeps a queued record within a smaller allocation.
-- remaining counts the required dependencies not yet succeeded, optional_remaining
-- the optional ones not yet terminal.
--
-- Per-state index (the states sorted set, every score 0): one member per pending or
-- terminal task, <state letter> .. 14 hex digits of (2^53 - 1 - updated ms) .. <task id>,
-- so that ZRANGEBYLEX over one letter lists that state newest first. Ready tasks are
-- listed from the queue and running ones from the leases: they have no member.
-- read_task notes in the record table the member of the record as read (t.indexed), and
-- save_task moves it when the state or the time changes, so no transition can forget it.
-- A record a script builds for an id that has one keeps the member of the one it read.
--
-- Queue member: 8 hex digits of (2147483647 - priority), 14 hex digits of the
-- version (the namespace sequence at submission), then the task id. The score
-- is run_at in ms, so ZRANGE order is exactly (run_at, -priority, sequence).

local RECORD_PATTERN =
  '^(%a+)|(%d+)|(%d+)|(%d+)|(%d+)|(-?%d+)|(-?%d+)|(%d)|(-?%d+)|(%d+)|(%d+)|(.*)$'

local TERMINAL = { succeeded = true, failed = true, cancelled = true, blocked = true }

-- States are stored as one letter (a queued record then fits a smaller allocation).
local STATE_CODE = {
  pending = 'p', ready = 'r', running = 'x', succeeded = 's', failed = 'f', cancelled = 'c',
  blocked = 'b',
}
local STATE_NAME = {
  p = 'pending', r = 'ready', x = 'running', s = 'succeeded', f = 'failed', c = 'cancelled',
  b = 'blocked',
}

-- What any script accepts as a task id: valid UTF-8 (no surrogates, nothing above
-- U+10FFFF, no overlong form), 1..MAX_ID_BYTES bytes; the Python client checks the same.
local MAX_ID_BYTES = 512

-- Is s (or its bytes first..last) valid UTF-8? The number of characters outside ASCII
-- when it is, else false; with `most`, false and 'many' once more than most of them are
-- read (a payload's check counts each as a value: they cost about as much to check).
local function valid_utf8(s, first, last, most)
  local n = last or #s
  local wide = 0
  -- Runs of ASCII are skipped with one search each: a large ASCII text costs one scan.
  local i = string.find(s, '[\128-\255]', first or 1)
  while i and i <= n do
    local c = string.byte(s, i)
    local len, lo, hi = 0, 128, 191
    if c >= 194 and c <= 223 then
      len = 2
    elseif c >= 224 and c <= 239 then
      len = 3
      if c == 224 then lo = 160 elseif c == 237 then hi = 159 end
    elseif c >= 240 and c <= 244 then
      len = 4
      if c == 240 then lo = 144 elseif c == 244 then hi = 143 end
    else
      return false
    end
    wide = wide + 1
    if most and wide > most then return false, 'many' end
    if i + len - 1 > n then return false end
    local b = string.byte(s, i + 1)
    if b < lo or b > hi then return false end
    for j = 2, len - 1 do
      b = string.byte(s, i + j)
      if b < 128 or b > 191 then return false end
    end
    i = string.find(s, '[\128-\255]', i + len)
  end
  return wide
end

-- Why id is not a valid task id, or nil when it is.
local function id_problem(id)
  if not id or id == '' then return 'must not be empty' end
  if #id > MAX_ID_BYTES then return 'must be at most ' .. MAX_ID_BYTES .. ' bytes in UTF-8' end
  if not valid_utf8(id) then return 'must be valid UTF-8' end
  return nil
end

local function check_id(id, field)
  local problem = id_problem(id)
  if problem then error({ err = 'BADARG ' .. field .. ' ' .. problem }) end
  return id
end

-- Integers a record holds are exact in a Lua number (below 2^53) and small enough to
-- write back with %d; anything else is junk.
local MAX_EXACT = 9007199254740991

-- n when it is an integer within [lo, hi], else nil.
local function int_field(n, lo, hi)
  if type(n) ~= 'number' or n < lo or n > hi or n % 1 ~= 0 then return nil end
  return n
end

-- A text record's integer: plain decimal of at most 17 characters (else nil).
local function text_int(text)
  return #text <= 17 and tonumber(text) or nil
end

-- The record table of values read, each integer nil when it is out of its range (the
-- caller names the first such field), and updated - run_at (nil when out of range: a
-- run_at far in the past or future makes it up to 2^53 + now).
local function checked_record(s, v, a, ma, bo, ra, pr, cr, ut, rem, orem, w)
  return {
    state = STATE_NAME[s], version = int_field(v, 0, MAX_EXACT),
    attempt = int_field(a, 0, MAX_EXACT), max_attempts = int_field(ma, 1, MAX_EXACT),
    backoff_ms = int_field(bo, 0, MAX_EXACT), run_at = int_field(ra, -MAX_EXACT, MAX_EXACT),
    priority = int_field(pr, -2147483648, 2147483647), cancel = int_field(cr, 0, 1),
    remaining = int_field(rem, 0, MAX_EXACT), optional = int_field(orem, 0, MAX_EXACT),
    worker = w,
  }, int_field(ut, -2 * MAX_EXACT, 2 * MAX_EXACT)
end

-- The first byte of a msgpack record: the state letter as a one-byte string (fixstr 1).
local PACKED = 161

-- Every Redis and Valkey has cmsgpack; a Lua without it (the in-process fakeredis server of
-- the embedded default) writes records in the text layout, which every reader also takes.
-- Found out at the first call: a library may use no global while it loads.
local has_cmsgpack = nil

local function packs()
  if has_cmsgpack == nil then
    has_cmsgpack = pcall(function() return cmsgpack.unpack_limit end)
  end
  return has_cmsgpack
end

-- The twelve values of a msgpack record, after where its payload starts (0-based, -1
-- when it has none); nil when it does not start with twelve values, a known state
-- first and a string last.
local function unpack_record(raw)
  local ok, left, s, v, a, ma, bo, ra, pr, cr, ut, rem, orem, w = pcall(cmsgpack.unpack_limit, raw, 12)
  if not ok or type(w) ~= 'string' or not STATE_NAME[s] then return nil end
  return left, s, v, a, ma, bo, ra, pr, cr, ut, rem, orem, w
end

-- Whether the ten integers of a msgpack record are within their ranges, in one chain of
-- comparisons rather than a call per field. A value that is not a number makes a
-- comparison raise: the caller's pcall counts that as not fine.
local function packed_ints_fine(v, a, ma, bo, ra, pr, cr, ut, rem, orem)
  return v >= 0 and v <= MAX_EXACT and v % 1 == 0 and a >= 0 and a <= MAX_EXACT and a % 1 == 0
    and ma >= 1 and ma <= MAX_EXACT and ma % 1 == 0 and bo >= 0 and bo <= MAX_EXACT
    and bo % 1 == 0 and ra >= -MAX_EXACT and ra <= MAX_EXACT and ra % 1 == 0
    and pr >= -2147483648 and pr <= 2147483647 and pr % 1 == 0 and (cr == 0 or cr == 1)
    and ut >= -2 * MAX_EXACT and ut <= 2 * MAX_EXACT and ut % 1 == 0
    and rem >= 0 and rem <= MAX_EXACT and rem % 1 == 0
    and orem >= 0 and orem <= MAX_EXACT and orem % 1 == 0
end

-- A version's payload is stored in its record, after the twelve values, when the record
-- is msgpack and the payload is at most this many bytes: one hash entry per task instead
-- of two (the payloads hash costs some 75 bytes of Redis memory per task). A larger one
-- goes to the payloads hash, so that saving the record, at every transition, never
-- copies it.
local INLINE_PAYLOAD_MAX = 512

local function payload_inline(payload)
  return #payload <= INLINE_PAYLOAD_MAX and packs()
end

-- The payload a record holds (t.payload for one a script builds; read_task notes where a
-- stored one starts); nil when the payload is in the payloads hash.
local function task_payload(t)
  if t.payload then return t.payload end
  if t.payload_at then return string.sub(t.raw, t.payload_at) end
  return nil
end

local INDEXED = { p = true, s = true, f = true, c = true, b = true }

-- The integer fields of a record, in the order their range errors are reported.
local RECORD_INTS = { 'version', 'attempt', 'max_attempts', 'backoff_ms', 'run_at', 'priority',
                      'cancel', 'remaining', 'optional' }

local function index_member(t, id)
  local code = STATE_CODE[t.state]
  if not INDEXED[code] then return false end
  local at = t.updated
  if at < 0 then at = 0 elseif at > MAX_EXACT then at = MAX_EXACT end
  return code .. string.format('%014x', MAX_EXACT - at) .. id
end

-- The end of read_task, for a record whose numbers are in range: the worker's text,
-- the time of the last transition, and its index member.
local function finish_read(id, t, delta)
  local w = t.worker
  if w ~= '' and not valid_utf8(w) then return nil, 'worker is not valid UTF-8' end
  t.updated = t.run_at + delta
  t.indexed = index_member(t, id)
  return t
end

-- Parse a stored record. Returns the record table; nil for an unknown id; or nil and
-- why, for a record that cannot be read (junk written by hand or by a broken client).
-- raw: the stored record when the caller already read it.
local function read_task(id, raw)
  raw = raw or redis.call('HGET', k.tasks, id)
  if not raw then return nil end
  local t, delta
  if string.byte(raw, 1) == PACKED then
    local left, s, v, a, ma, bo, ra, pr, cr, ut, rem, orem, w = unpack_record(raw)
    if not left then return nil, 'does not parse' end
    local checked, fine = pcall(packed_ints_fine, v, a, ma, bo, ra, pr, cr, ut, rem, orem)
    if checked and fine then
      t = {
        state = STATE_NAME[s], version = v, attempt = a, max_attempts = ma, backoff_ms = bo,
        run_at = ra, priority = pr, cancel = cr, remaining = rem, optional = orem, worker = w,
      }
      if left ~= -1 then t.raw, t.payload_at = raw, left + 1 end
      return finish_read(id, t, ut)
    end
    -- Something is out of range: field by field, to say which.
    t, delta = checked_record(s, v, a, ma, bo, ra, pr, cr, ut, rem, orem, w)
    if left ~= -1 then t.raw, t.payload_at = raw, left + 1 end
  else
    local s, v, a, ma, bo, ra, pr, cr, ut, rem, orem, w = string.match(raw, RECORD_PATTERN)
    if not s or not STATE_NAME[s] then return nil, 'does not parse' end
    t, delta = checked_record(s, text_int(v), text_int(a), text_int(ma), text_int(bo),
      text_int(ra), text_int(pr), text_int(cr), text_int(ut), text_int(rem), text_int(orem), w)
  end
  if not (t.version and t.attempt and t.max_attempts and t.backoff_ms and t.run_at and t.priority
          and t.cancel and t.remaining and t.optional) then
    for _, field in ipairs(RECORD_INTS) do
      if not t[field] then return nil, field .. ' out of range' end
    end
  end
  if not delta then return nil, 'updated out of range' end
  return finish_read(id, t, delta)
end

local function corrupt_error(id, why)
  return { err = 'CORRUPT task record of ' .. id .. ' ' .. why }
end

-- The record of an id a caller named (a producer's task or dependency): raises
-- CORRUPT naming it when the record cannot be read; nil for an unknown id.
local function load_given(id, raw)
  local t, why = read_task(id, raw)
  if why then error(corrupt_error(id, why)) end
  return t
end

-- The record of an id met on the way (a dependent, a lease, a queue entry, a report):
-- one that cannot be read counts as absent, so that one bad record never stops the
-- calls that pass by it; it stays as it is, and status shows it as corrupt.
local function load_task(id, raw)
  local t, why = read_task(id, raw)
  if why then
    redis.log(redis.LOG_WARNING, 'distsched: skipped the corrupt task record of ' .. id .. ': ' .. why)
  end
  return t
end

local function encode_task(t)
  if not packs() then
    return string.format('%s|%d|%d|%d|%d|%d|%d|%d|%d|%d|%d|%s', STATE_CODE[t.state], t.version,
      t.attempt, t.max_attempts, t.backoff_ms, t.run_at, t.priority, t.cancel,
      t.updated - t.run_at, t.remaining, t.optional, t.worker)
  end
  local packed = cmsgpack.pack(STATE_CODE[t.state], t.version, t.attempt, t.max_attempts,
    t.backoff_ms, t.run_at, t.priority, t.cancel, t.updated - t.run_at, t.remaining, t.optional,
    t.worker)
  local payload = task_payload(t)
  if payload then return packed .. payload end
  return packed
end

-- encode_task of a new version that is ready at its first attempt, from its values
-- rather than a record table (enqueue.lua writes one per task).
local function encode_ready(version, max_attempts, backoff_ms, run_at, priority, now, payload)
  if not packs() then
    return encode_task({ state = 'ready', version = version, attempt = 0, max_attempts = max_attempts,
      backoff_ms = backoff_ms, run_at = run_at, priority = priority, cancel = 0, updated = now,
      remaining = 0, optional = 0, worker = '', payload = payload })
  end
  local packed = cmsgpack.pack(STATE_CODE.ready, version, 0, max_attempts, backoff_ms, run_at, priority,
    0, now - run_at, 0, 0, '')
  if payload then return packed .. payload end
  return packed
end

-- Write record t of id, and move its member of the per-state index (t.indexed: the
-- member it had when read, false for none) when the state or the time changed.
local function save_task(id, t)
  redis.call('HSET', k.tasks, id, encode_task(t))
  local old, member = t.indexed or false, index_member(t, id)
  if old ~= member then
    if old then redis.call('ZREM', k.states, old) end
    if member then redis.call('ZADD', k.states, '0', member) end
    t.indexed = member
  end
end

-- Remove the record of id (t: as read, nil when it cannot be read) and its index member.
local function forget_task(id, t)
  redis.call('HDEL', k.tasks, id)
  if t and t.indexed then redis.call('ZREM', k.states, t.indexed) end
end

-- Send one command with many trailing arguments (field/value or score/member pairs),
-- in slices that stay within Lua's argument limit.
local function call_many(command, key, args)
  for i = 1, #args, 1000 do
    redis.call(command, key, unpack(args, i, math.min(i + 999, #args)))
  end
end

local function queue_member(t, id, version)
  return string.format('%08x%014x', 2147483647 - t.priority, version or t.version) .. id
end

-- Split a queue member back into (version, id); (nil, id) when its head is not the
-- 22 hex digits of a member (junk: the caller drops it).
local function parse_member(member)
  local head = string.sub(member, 1, 22)
  if not string.match(head, '^%x+$') or #head ~= 22 then return nil, string.sub(member, 23) end
  return tonumber(string.sub(member, 9, 22), 16), string.sub(member, 23)
end
