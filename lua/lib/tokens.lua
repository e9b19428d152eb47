-- lib/tokens.lua: fencing of reports by their token (id, version, attempt).
--
-- The done hash keeps the most recent applied tokens of an id, 'version.attempt'
-- separated by single spaces, so that a repeated report is told apart from a stale one.

local DONE_KEEP = 8

local function token_applied(id, version, attempt)
  local raw = redis.call('HGET', k.done, id)
  if not raw then return false end
  local needle = ' ' .. string.format('%d.%d', version, attempt) .. ' '
  return string.find(' ' .. raw .. ' ', needle, 1, true) ~= nil
end

local function remember_token(id, version, attempt)
  local raw = redis.call('HGET', k.done, id)
  local tokens = {}
  if raw then
    for tok in string.gmatch(raw, '%S+') do tokens[#tokens + 1] = tok end
  end
  tokens[#tokens + 1] = string.format('%d.%d', version, attempt)
  while #tokens > DONE_KEEP do table.remove(tokens, 1) end
  redis.call('HSET', k.done, id, table.concat(tokens, ' '))
end

-- Classify a report's token against the current record t (nil: no record).
local function token_outcome(t, id, version, attempt)
  if t and t.state == 'running' and t.version == version and t.attempt == attempt then
    return 'applied'
  end
  if token_applied(id, version, attempt) then return 'duplicate' end
  return 'stale'
end
