-- lib/payload.lua: the checks of what a producer sends for a task (numbers and payload).
--
--- @include record
--
-- Shared by schedule.lua and fire.lua (which creates the tasks of a schedule's slots),
-- so that no script stores a task a worker cannot read.

-- The ranges the Python client checks (distsched/validate.py), so that a producer in any
-- language cannot write what a worker cannot read.
local MAX_MS = 9007199254740991      -- 2^53 - 1: an absolute time
local MAX_DELAY_MS = 4503599627370496 -- 2^52: the server adds its clock to a delay
local MAX_ATTEMPTS = 1000000

local function bounded(text, field, lo, hi)
  local n = #text <= 17 and tonumber(text)
  if not n or n < lo or n > hi then
    -- The ranges are in the header above.
    error({ err = string.format('BADARG %s out of range', field) })
  end
  return n
end

-- msgpack, read only as far as needed to check a payload's shape (Redis's cmsgpack does
-- not know the bin and ext types). head(p, pos) -> kind, count or length, first byte
-- after the header; kind is 'map', 'array', 'str' or 'other'; nil when truncated or
-- invalid.
local FIXED = { [192] = 0, [194] = 0, [195] = 0, [202] = 4, [203] = 8, [204] = 1, [205] = 2,
                [206] = 4, [207] = 8, [208] = 1, [209] = 2, [210] = 4, [211] = 8, [212] = 2,
                [213] = 3, [214] = 5, [215] = 9, [216] = 17 }

local function be_uint(p, pos, size)
  if pos + size - 1 > #p then return nil end
  local n = 0
  for i = pos, pos + size - 1 do n = n * 256 + string.byte(p, i) end
  return n
end

local SIZED = { [196] = { 'other', 1 }, [197] = { 'other', 2 }, [198] = { 'other', 4 },
                [199] = { 'ext', 1 }, [200] = { 'ext', 2 }, [201] = { 'ext', 4 },
                [217] = { 'str', 1 }, [218] = { 'str', 2 }, [219] = { 'str', 4 },
                [220] = { 'array', 2 }, [221] = { 'array', 4 },
                [222] = { 'map', 2 }, [223] = { 'map', 4 } }

local function head(p, pos)
  local b = string.byte(p, pos)
  if not b then return nil end
  if b < 128 or b >= 224 then return 'other', 0, pos + 1 end
  if b < 144 then return 'map', b - 128, pos + 1 end
  if b < 160 then return 'array', b - 144, pos + 1 end
  if b < 192 then return 'str', b - 160, pos + 1 end
  if FIXED[b] then return 'other', FIXED[b], pos + 1 end
  local entry = SIZED[b]
  if not entry then return nil end
  local n = be_uint(p, pos + 1, entry[2])
  if not n then return nil end
  if entry[1] == 'ext' then return 'other', n + 1, pos + 1 + entry[2] end
  return entry[1], n, pos + 1 + entry[2]
end

-- The position after the value at pos (every string in it valid UTF-8), or nil; nil,
-- 'deep' when arrays and maps in it nest deeper than MAX_PAYLOAD_DEPTH (lib/limits.lua),
-- the value at pos being at depth `depth` (the payload itself: 1; 1 when left out).
-- Readers (msgpack decoders, the CLI, the dashboard) recurse per level: past that depth
-- they fail or cannot render what a script stored.
-- w is the state of one walk over a payload (new_walk): w.left, the values it may still
-- read, and in its array part skip's stack (one table per walk: a table per skip cost
-- more than reading a small value). Every value read counts against w.left: past it,
-- nil, 'many' (a check's cost is per value, so the values of a payload and of a call are
-- capped: MAX_PAYLOAD_VALUES); other walks (recur.lua) are bounded by bytes.
local function new_walk(most)
  return { left = most }
end

-- Whether p[first..last] is valid UTF-8. Each character outside ASCII counts against
-- w.left as a value does (lib/record.lua's valid_utf8; false once past it, w.left then
-- below 0): an ASCII run takes one search, whatever its length.
local function text_fine(w, p, first, last)
  local wide, why = valid_utf8(p, first, last, w.left)
  if not wide then
    if why == 'many' then w.left = -1 end
    return false
  end
  w.left = w.left - wide
  return true
end

-- The position after a string of n bytes at `at` (its header read), counted as one value
-- of walk w; nil when it is cut short, not valid UTF-8 or past w's values.
local function str_after(w, p, at, n)
  w.left = w.left - 1
  local after = at + n
  if w.left < 0 or after - 1 > #p then return nil end
  local wide = string.find(p, '[\128-\255]', at)
  if wide and wide < after and not text_fine(w, p, wide, after - 1) then return nil end
  return after
end

local function skip(w, p, pos, depth)
  -- left[level]: the values still to read in each open array or map (level 1: the value
  -- at pos itself); a value read at level L is at depth base + L.
  local base = (depth or 1) - 1
  local left, level = w, 1
  left[1] = 1
  while level > 0 do
    if left[level] == 0 then
      level = level - 1
    else
      left[level] = left[level] - 1
      w.left = w.left - 1
      if w.left < 0 then return nil, 'many' end
      local kind, n, at = head(p, pos)
      if not kind then return nil end
      if kind == 'map' or kind == 'array' then
        if base + level > LIMITS.MAX_PAYLOAD_DEPTH then return nil, 'deep' end
        -- An empty one opens no level.
        if n > 0 then
          level = level + 1
          left[level] = kind == 'map' and 2 * n or n
        end
        pos = at
      else
        if at + n - 1 > #p then return nil end
        if kind == 'str' then
          -- An ASCII string (the most common) takes one search.
          local wide = string.find(p, '[\128-\255]', at)
          if wide and wide < at + n and not text_fine(w, p, wide, at + n - 1) then
            return nil, w.left < 0 and 'many' or nil
          end
        end
        pos = at + n
      end
    end
  end
  return pos
end

-- Whether the value at pos is nil or an integer in [1, MAX_TIMEOUT_MS] (the optional
-- timeout key: the task's time limit in ms), in any msgpack integer encoding.
-- MAX_TIMEOUT_MS is 2592000000 (30 days), written as a literal below: the library
-- parts' top-level names are few (lua/README.md, "As Redis Functions").
local function timeout_fine(p, pos)
  local b, n = string.byte(p, pos), nil
  if b == 192 or (b >= 1 and b < 128) then return true end
  if b >= 204 and b <= 207 then
    n = be_uint(p, pos + 1, 2 ^ (b - 204))
  elseif b >= 208 and b <= 211 and (string.byte(p, pos + 1) or 128) < 128 then
    n = be_uint(p, pos + 1, 2 ^ (b - 208))
  end
  return n ~= nil and n >= 1 and n <= 2592000000
end

-- The namespace's payload limit: its stored setting (meta payload_max, written by
-- an admin; DEFAULT_MAX_PAYLOAD_BYTES while none is stored or it is not a count),
-- never above PAYLOAD_CEILING_BYTES; asked, a caller's own limit (optional), only lowers it.
-- stored_text: the meta field when the caller has read it already (false: not set).
local function payload_limit(asked, stored_text)
  if stored_text == nil then stored_text = redis.call('HGET', k.meta, 'payload_max') end
  local stored = tonumber(stored_text)
  local limit = LIMITS.DEFAULT_MAX_PAYLOAD_BYTES
  if stored and stored >= 1 and stored == math.floor(stored) then limit = stored end
  if limit > LIMITS.PAYLOAD_CEILING_BYTES then limit = LIMITS.PAYLOAD_CEILING_BYTES end
  if asked and asked < limit then limit = asked end
  return limit
end

-- Why a payload is not one a worker can run, or nil: one msgpack map with a non-empty
-- UTF-8 string fn, args an array and kwargs a map with string keys (each may be left
-- out or nil, which is how JavaScript encoders send undefined).
-- One pass over a payload, reading each value once and at most `most` of them: true and
-- the number of values (the map itself, every key and every value inside it) only when
-- payload_problem finds nothing; else false and, when known, why ('many' past `most`,
-- 'deep'). Anything but true goes to payload_problem's slower walk, which names it.
local function payload_fine(p, most)
  local w = new_walk(most - 1)
  if w.left < 0 then return false, 'many' end
  local kind, n, pos = head(p, 1)
  if kind ~= 'map' then return false end
  local fn = false
  for _ = 1, n do
    local key_kind, key_len, key_at = head(p, pos)
    if not key_kind then return false end
    local value_at, why, key = nil, nil, nil
    if key_kind == 'str' then
      -- A string key (the usual kind) is read here rather than by skip: one value.
      value_at = str_after(w, p, key_at, key_len)
      if not value_at then return false, w.left < 0 and 'many' or nil end
      key = string.sub(p, key_at, value_at - 1)
    else
      value_at, why = skip(w, p, pos, 2)
      if not value_at then return false, why end
    end
    local vkind, vn, vat = head(p, value_at)
    if not vkind then return false end
    local is_nil = string.byte(p, value_at) == 192
    local after = nil
    if key == 'fn' then
      if vkind ~= 'str' or vn == 0 then return false end
      fn = true
      after = str_after(w, p, vat, vn)
      if not after then return false, w.left < 0 and 'many' or nil end
    elseif key == 'args' and not is_nil and vkind ~= 'array' then
      return false
    elseif key == 'timeout' and not timeout_fine(p, value_at) then
      return false
    elseif key == 'kwargs' and not is_nil then
      if vkind ~= 'map' then return false end
      -- The map itself, then each key and value once.
      w.left = w.left - 1
      if w.left < 0 then return false, 'many' end
      after = vat
      for _ = 1, vn do
        -- The key read here: a string, nothing to open.
        local kkind, kn, kat = head(p, after)
        w.left = w.left - 1
        if kkind ~= 'str' or kat + kn - 1 > #p then return false end
        if w.left < 0 or not text_fine(w, p, kat, kat + kn - 1) then
          return false, w.left < 0 and 'many' or nil
        end
        after, why = skip(w, p, kat + kn, 3)
        if not after then return false, why end
      end
    end
    if not after then
      after, why = skip(w, p, value_at, 2)
      if not after then return false, why end
    end
    pos = after
  end
  if fn and pos == #p + 1 then return true, most - w.left end
  return false
end

-- Why a payload is refused (the text after 'payload of <id> '), or nil and the number of
-- values it holds. `most` (optional) is what is left of the call's MAX_PAYLOAD_VALUES_PER_CALL:
-- past it the walk stops and replies nil, most + 1 (the caller names the call's cap).
local function payload_problem(p, limit, most)
  if #p > limit then return string.format('is %d bytes, limit %d (payload_max)', #p, limit) end
  local cap = LIMITS.MAX_PAYLOAD_VALUES
  if most and most < cap then cap = most end
  local fine, got = payload_fine(p, cap)
  if fine then return nil, got end
  local after, why = nil, got
  if why ~= 'many' and why ~= 'deep' then
    after, why = skip(new_walk(cap), p, 1)
  end
  if why == 'many' then
    if cap < LIMITS.MAX_PAYLOAD_VALUES then return nil, cap + 1 end
    return 'has more than ' .. LIMITS.MAX_PAYLOAD_VALUES .. ' values (MAX_PAYLOAD_VALUES)'
  end
  if why == 'deep' then
    return 'nests arrays and maps more than ' .. LIMITS.MAX_PAYLOAD_DEPTH .. ' deep (MAX_PAYLOAD_DEPTH)'
  end
  if after ~= #p + 1 then return 'must be one valid msgpack value' end
  -- A valid value of at most cap values: the walks below end.
  local w = new_walk(math.huge)
  local kind, n, pos = head(p, 1)
  if kind ~= 'map' then return 'must be a msgpack map' end
  local fn = nil
  for _ = 1, n do
    local key_kind, key_len, key_at = head(p, pos)
    local key = key_kind == 'str' and string.sub(p, key_at, key_at + key_len - 1)
    local value_at = skip(w, p, pos)
    local vkind, vn, vat = head(p, value_at)
    local is_nil = string.byte(p, value_at) == 192
    if key == 'fn' then
      if vkind ~= 'str' or vn == 0 then return 'field fn must be a non-empty string' end
      fn = string.sub(p, vat, vat + vn - 1)
    elseif key == 'args' and not is_nil and vkind ~= 'array' then
      return 'field args must be an array'
    elseif key == 'timeout' and not timeout_fine(p, value_at) then
      return 'field timeout must be an integer number of milliseconds in [1, 2592000000]'
    elseif key == 'kwargs' and not is_nil then
      if vkind ~= 'map' then return 'field kwargs must be a map' end
      local at = vat
      for _ = 1, vn do
        if head(p, at) ~= 'str' then return 'field kwargs must be a map with string keys' end
        at = skip(w, p, skip(w, p, at))
      end
    end
    pos = skip(w, p, value_at)
  end
  if not fn then return 'field fn must be a non-empty string' end
  return nil
end

-- Refuse a call whose payloads (specs[i].payload, each for specs[i].id) break `limit` or
-- hold more than MAX_PAYLOAD_VALUES_PER_CALL values together: checking a payload costs
-- time by the value, so the call's values are capped too.
local function check_call_payloads(specs, limit)
  local values_left = LIMITS.MAX_PAYLOAD_VALUES_PER_CALL
  for _, s in ipairs(specs) do
    local problem, values = payload_problem(s.payload, limit, values_left)
    if problem then error({ err = 'BADARG payload of ' .. s.id .. ' ' .. problem }) end
    values_left = values_left - values
    if values_left < 0 then
      error({ err = 'BADARG payload at most ' .. LIMITS.MAX_PAYLOAD_VALUES_PER_CALL
        .. ' values of payloads per call (MAX_PAYLOAD_VALUES_PER_CALL)' })
    end
  end
end
