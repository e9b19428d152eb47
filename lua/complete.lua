-- complete.lua: report a batch of claims as succeeded.
--
-- running -> succeeded, fenced by the token (id, version, attempt): only the
-- current running attempt is applied. A token already applied before gets
-- 'duplicate'; any other token gets 'stale'. Neither changes anything. A
-- cancellation request made while it ran stays on the record.
--
-- KEYS[1] tasks     hash: id -> task record
-- KEYS[2] leases    sorted set: id -> lease deadline
-- KEYS[3] results   hash: id -> 'R' .. msgpack result (removed for no result)
-- KEYS[4] done      hash: id -> recently applied tokens
-- KEYS[5] finished  sorted set: terminal ids by time
-- KEYS[6] meta      hash: per-state counts, max_running
-- KEYS[7] wake      pub/sub channel
--
-- ARGV[1] n; then 4 values per report: id, version, attempt, result bytes ('' for none)
--
-- Reply: array of n strings: 'applied', 'duplicate' or 'stale'.
-- Publishes 'capacity' on KEYS[7] when max_running was reached and a slot freed.
-- Cost: O(n log N).

local k = { tasks = KEYS[1], leases = KEYS[2], results = KEYS[3], done = KEYS[4],
            finished = KEYS[5], meta = KEYS[6], wake = KEYS[7] }
local n, err = to_int(ARGV[1], 'n'); if not n then return err end
if #ARGV ~= 1 + 4 * n then return redis.error_reply('BADARG ARGV expected 4 values per report') end

local now = now_ms()
local running_before = running_count(k.meta)
local reply = {}
for i = 1, n do
  local base = 1 + 4 * (i - 1)
  local id = ARGV[base + 1]
  local version, attempt = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  local t = load_task(k.tasks, id)
  if t and t.err then return t end
  local outcome = token_outcome(t, k.done, id, version, attempt)
  if outcome == 'applied' then
    redis.call('ZREM', k.leases, id)
    count_move(k.meta, 'running', 'succeeded')
    t.state = 'succeeded'
    t.worker = ''
    t.updated = now
    save_task(k.tasks, id, t)
    if ARGV[base + 4] ~= '' then
      redis.call('HSET', k.results, id, 'R' .. ARGV[base + 4])
    else
      -- An earlier attempt's error must not show on a task that succeeded.
      redis.call('HDEL', k.results, id)
    end
    remember_token(k.done, id, version, attempt)
    redis.call('ZADD', k.finished, now, id)
  end
  reply[i] = outcome
end
capacity_freed(k.meta, k.wake, running_before)
return reply
