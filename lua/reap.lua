-- reap.lua: handle leases whose deadline (server clock) has passed.
--
-- running -> ready (a new attempt after backoff) while attempts remain and no
-- cancellation was requested, running -> failed with reason 'lease expired'
-- otherwise. The old holder's
-- token is then stale: its late report changes nothing.
--
-- KEYS[1] tasks     hash: id -> task record
-- KEYS[2] queue     sorted set: the ready queue
-- KEYS[3] leases    sorted set: id -> lease deadline
-- KEYS[4] results   hash: id -> 'E' .. error text
-- KEYS[5] finished  sorted set: terminal ids by time
-- KEYS[6] meta      hash: per-state counts, max_running
-- KEYS[7] wake      pub/sub channel
--
-- ARGV[1] the most leases to handle in this call (>= 1)
-- ARGV[2] optional task id: expire this task's lease now, whatever its deadline
--
-- Reply: the number of leases handled.
-- Cost: O(m log N) for m handled leases.

local k = { tasks = KEYS[1], queue = KEYS[2], leases = KEYS[3], results = KEYS[4],
            finished = KEYS[5], meta = KEYS[6], wake = KEYS[7] }
local limit, err = to_int(ARGV[1], 'limit'); if not limit then return err end
if limit < 1 then return redis.error_reply('BADARG limit must be >= 1') end

local now = now_ms()
local ids
if ARGV[2] and ARGV[2] ~= '' then
  ids = {}
  if redis.call('ZSCORE', k.leases, ARGV[2]) then ids[1] = ARGV[2] end
else
  ids = redis.call('ZRANGEBYSCORE', k.leases, '-inf', now, 'LIMIT', 0, limit)
end
local handled = 0
for _, id in ipairs(ids) do
  local t = load_task(k.tasks, id)
  if t and t.err then return t end
  if t and t.state == 'running' then
    end_attempt_failed(k, id, t, now, 'lease expired')
    handled = handled + 1
  else
    -- A lease without a running record cannot be produced by the scripts; drop it.
    redis.call('ZREM', k.leases, id)
  end
end
return handled
