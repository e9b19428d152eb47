-- fail.lua: report a batch of claims whose function raised.
--
-- running -> ready (a new attempt, due after backoff * 2^(attempt-1), capped
-- at one hour) while attempts remain and no cancellation was requested;
-- running -> failed otherwise. Fenced by the token exactly as complete.lua.
--
-- KEYS[1] tasks     hash: id -> task record
-- KEYS[2] queue     sorted set: the ready queue
-- KEYS[3] leases    sorted set: id -> lease deadline
-- KEYS[4] results   hash: id -> 'E' .. error text
-- KEYS[5] done      hash: id -> recently applied tokens
-- KEYS[6] finished  sorted set: terminal ids by time
-- KEYS[7] meta      hash: per-state counts, max_running
-- KEYS[8] wake      pub/sub channel
--
-- ARGV[1] n; then 4 values per report: id, version, attempt, error text
--
-- Reply: array of n strings: 'applied', 'duplicate' or 'stale'.
-- Publishes on KEYS[7] when a retry became the queue head or a capacity slot freed.
-- Cost: O(n log N).

local k = { tasks = KEYS[1], queue = KEYS[2], leases = KEYS[3], results = KEYS[4],
            done = KEYS[5], finished = KEYS[6], meta = KEYS[7], wake = KEYS[8] }
local n, err = to_int(ARGV[1], 'n'); if not n then return err end
if #ARGV ~= 1 + 4 * n then return redis.error_reply('BADARG ARGV expected 4 values per report') end

local now = now_ms()
local reply = {}
for i = 1, n do
  local base = 1 + 4 * (i - 1)
  local id = ARGV[base + 1]
  local version, attempt = tonumber(ARGV[base + 2]), tonumber(ARGV[base + 3])
  local t = load_task(k.tasks, id)
  if t and t.err then return t end
  local outcome = token_outcome(t, k.done, id, version, attempt)
  if outcome == 'applied' then
    remember_token(k.done, id, version, attempt)
    end_attempt_failed(k, id, t, now, ARGV[base + 4])
  end
  reply[i] = outcome
end
return reply
