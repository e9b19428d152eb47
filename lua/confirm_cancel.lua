-- confirm_cancel.lua: the holder's function stopped because cancellation was requested.
--
-- running (cancel_requested) -> cancelled, fenced by the token as complete.lua.
--
-- KEYS[1] tasks     hash: id -> task record
-- KEYS[2] leases    sorted set: id -> lease deadline
-- KEYS[3] done      hash: id -> recently applied tokens
-- KEYS[4] finished  sorted set: terminal ids by time
-- KEYS[5] meta      hash: per-state counts, max_running
-- KEYS[6] wake      pub/sub channel
--
-- ARGV[1] id, ARGV[2] version, ARGV[3] attempt
--
-- Reply: 'applied', 'duplicate' or 'stale'.
-- Errors: CONFLICT not_requested <id>  the token is current but no cancel was requested.

local k = { tasks = KEYS[1], leases = KEYS[2], done = KEYS[3], finished = KEYS[4],
            meta = KEYS[5], wake = KEYS[6] }
local id = ARGV[1]
local version, attempt = tonumber(ARGV[2]), tonumber(ARGV[3])
local t = load_task(k.tasks, id)
if t and t.err then return t end
local outcome = token_outcome(t, k.done, id, version, attempt)
if outcome ~= 'applied' then return outcome end
if t.cancel ~= 1 then return redis.error_reply('CONFLICT not_requested ' .. id) end

local now = now_ms()
local running_before = running_count(k.meta)
redis.call('ZREM', k.leases, id)
count_move(k.meta, 'running', 'cancelled')
t.state = 'cancelled'
t.worker = ''
t.updated = now
save_task(k.tasks, id, t)
remember_token(k.done, id, version, attempt)
redis.call('ZADD', k.finished, now, id)
capacity_freed(k.meta, k.wake, running_before)
return outcome
