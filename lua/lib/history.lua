-- lib/history.lua: the attempt history of each task, and the per-minute counters.
--
--- @include record
--
-- History (history hash, field the task id): the task's last HISTORY_KEEP ended
-- attempts, oldest first, across its versions. Each entry is
--   version|attempt|started_ms|ended_ms|outcome|<byte length of worker>|worker|summary
-- followed by '\n'. The worker is read by its length (it may hold '|' or '\n'); the
-- summary holds no '\n'. started_ms is the record's last transition before the attempt
-- ended (its claim), ended_ms the server time it ended. Outcomes: succeeded, failed,
-- lost (lease expired), cancelled, handed_back (given back unstarted).
--
-- Per-minute counters (minutes hash): field '<floor(ms / 60000)>:s' or ':f', the number
-- of attempts that succeeded or failed (also one the task retried after) in that minute.
-- Workers' housekeeping deletes fields older than a day (MINUTES_KEEP, distsched/wire/calls.py).

local HISTORY_KEEP = 10
local SUMMARY_MAX = 200
local HISTORY_HEAD = '^(%d+)|(%d+)|(-?%d+)|(-?%d+)|([%l_]+)|(%d+)|'

-- The last line of an error text that holds more than blanks, at most SUMMARY_MAX bytes
-- (cut where a UTF-8 character starts), without '\r'; nil for none.
local function error_summary(text)
  -- Found by patterns (each one scan in C), not line by line: a text of many short
  -- lines costs what a text of one line does.
  local stop = string.match(text, '^.*()%S')
  if not stop then return nil end
  local start = string.match(string.sub(text, 1, stop), '^.*\n()') or 1
  -- Leading blanks off, cut well past the limit, then trailing blanks off: linear
  -- whatever the length of the line.
  local last = string.match(string.sub(text, start, stop), '^%s*(.*)$')
  last = string.sub(string.gsub(last, '\r', ''), 1, SUMMARY_MAX + 64)
  local stop = #last
  while stop > 0 and string.find(string.sub(last, stop, stop), '%s') do stop = stop - 1 end
  last = string.sub(last, 1, stop)
  if #last > SUMMARY_MAX then
    last = string.sub(last, 1, SUMMARY_MAX)
    local i = #last
    while i > 0 and string.byte(last, i) >= 128 and string.byte(last, i) < 192 do i = i - 1 end
    if i > 0 then
      local c = string.byte(last, i)
      local len = (c >= 240 and 4) or (c >= 224 and 3) or (c >= 192 and 2) or 1
      if i + len - 1 > #last then last = string.sub(last, 1, i - 1) end
    end
  end
  return last
end

-- Where each entry of a stored history starts; a stored history that does not parse
-- (junk written by other means) keeps only the entries before the junk.
local function history_starts(raw)
  local starts, pos = {}, 1
  while pos <= #raw do
    local first, last, _, _, _, _, _, wlen = string.find(raw, HISTORY_HEAD, pos)
    if not first then break end
    local after = last + tonumber(wlen) + 1
    if string.sub(raw, after, after) ~= '|' then break end
    local nl = string.find(raw, '\n', after + 1, true)
    if not nl then break end
    starts[#starts + 1] = pos
    pos = nl + 1
  end
  return starts, pos
end

-- Add an ended attempt of id to its history. t: the record as it was while the attempt
-- ran (version, attempt, worker, updated = when it was claimed).
local function record_attempt(id, t, now, outcome, summary)
  local worker = t.worker or ''
  local entry = string.format('%d|%d|%d|%d|%s|%d|', t.version, t.attempt, t.updated, now,
                              outcome, #worker) .. worker .. '|' .. (summary or '') .. '\n'
  local raw = redis.call('HGET', k.history, id)
  if raw then
    local starts, stop = history_starts(raw)
    local from = 1
    if #starts >= HISTORY_KEEP then from = starts[#starts - HISTORY_KEEP + 2] end
    if #starts > 0 then entry = string.sub(raw, from, stop - 1) .. entry end
  end
  redis.call('HSET', k.history, id, entry)
end

-- Count n attempts that ended with kind ('s' succeeded, 'f' failed) at time now.
local function count_minute(kind, n, now)
  if n > 0 then
    redis.call('HINCRBY', k.minutes, string.format('%d:%s', math.floor(now / 60000), kind), itoa(n))
  end
end
