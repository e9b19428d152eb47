-- lib/kept.lua: a claim call's tokens, kept by its request id (claim.lua ARGV[7]).
--
--- @include record
--
-- Field <worker id> of the claims hash: the request id, '\n', then for each task claimed
-- 'version attempt #id id'. A call sent again with the same request id (a client that
-- retried after a timeout) gets the same tasks again instead of claiming more; a worker
-- whose reply was lost hands the kept tokens back with release.lua.

local function kept_tokens(raw, from)
  local tokens, pos = {}, from
  while pos <= #raw do
    local version, attempt, len, start = string.match(raw, '^(%d+) (%d+) (%d+) ()', pos)
    if not start then break end
    len = tonumber(len)
    tokens[#tokens + 1] = { string.sub(raw, start, start + len - 1), tonumber(version), tonumber(attempt) }
    pos = start + len
  end
  return tokens
end

-- The payload of each of ids, in order: inline[i] when the task's record holds it
-- (task_payload, lib/record.lua), else the payloads hash's, all of those in one HMGET.
local function payloads_of(ids, inline)
  local payloads, missing, at = {}, {}, {}
  for i, id in ipairs(ids) do
    payloads[i] = inline[i]
    if not payloads[i] then
      missing[#missing + 1] = id
      at[#at + 1] = i
    end
  end
  if #missing > 0 then
    local stored = redis.call('HMGET', k.payloads, unpack(missing))
    for j, i in ipairs(at) do payloads[i] = stored[j] end
  end
  return payloads
end

-- The reply the claim call `request` of `worker` had, with the tasks it still holds;
-- nil when no such call ran.
local function kept_reply(worker, request)
  if request == '' then return nil end
  local raw = redis.call('HGET', k.claims, worker)
  if not raw or string.sub(raw, 1, #request + 1) ~= request .. '\n' then return nil end
  local held, ids, inline = {}, {}, {}
  for _, token in ipairs(kept_tokens(raw, #request + 2)) do
    local t = load_task(token[1])
    if t and t.state == 'running' and t.version == token[2] and t.attempt == token[3]
        and t.worker == worker then
      held[#held + 1] = { token[1], t.version, t.attempt, t.priority, t.run_at }
      ids[#held] = token[1]
      inline[#held] = task_payload(t)
    end
  end
  local payloads = payloads_of(ids, inline)
  local reply = { 0, #held, '', -1 }
  for i, c in ipairs(held) do
    for _, value in ipairs(c) do reply[#reply + 1] = value end
    reply[#reply + 1] = payloads[i] or ''
  end
  return reply
end

-- Keep what the call `request` claimed (out: { id, version, attempt, ... } each).
local function keep_claim(worker, request, out)
  if request == '' then return end
  if #out == 0 then
    redis.call('HDEL', k.claims, worker)
    return
  end
  local kept = { request, '\n' }
  for _, c in ipairs(out) do
    kept[#kept + 1] = string.format('%d %d %d ', c[2], c[3], #c[1]) .. c[1]
  end
  redis.call('HSET', k.claims, worker, table.concat(kept))
end
