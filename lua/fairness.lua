-- fairness.lua: set the concurrency cap and weight of a fairness key, or the default cap.
--
--- @include fair
--- @keys queue meta idle
--- @keys fair fairready fairwait fairfull fairkeys fairrun ranked
--
-- Turns the namespace fair (meta fair = '1'; lib/fair.lua) if it is not yet: the default
-- key ('') then takes its turns with the entries of queue (and ranked, in the priority
-- order). Since a cap may have been
-- raised or cleared, every key waiting at its cap (fairfull) goes back to the turns at
-- the current virtual time (a claim moves those still at their cap back, without
-- claiming from them) and one idle worker per key moved is woken.
--
-- Reads and writes meta (fair), fair, fairready, fairfull, idle; reads queue, fairwait,
-- ranked, meta (order, aging_ms).
--
-- Publishes: 'ready' on the channels of idle workers (lib/idle.lua), one per key it moves
-- back from fairfull.
--
-- ARGV[1] 'key': set ARGV[2]'s cap, weight and rate limit; 'default': set the default cap
-- ARGV[2] the key (UTF-8, 0..256 bytes; '' is the default key of tasks given none);
--         ignored for 'default' (send '')
-- ARGV[3] the cap: an integer in [0, 1000000000] (0 holds the key's tasks), or '' for
--         none (for 'key': the default cap applies)
-- ARGV[4] the weight: an integer in [1, 1000000] (ignored for 'default'; send 1)
-- ARGV[5] optional, for 'key': the rate limit, units started per interval (a task takes
--         its cost, costs hash; lib/fair.lua), an integer in [1, 1000000000]; '' or absent
--         for none
-- ARGV[6] with ARGV[5]: the interval in ms, an integer in [1, 86400000]
--
-- Reply: { 0, keys moved back from fairfull }
-- Errors (nothing written):
--   BADARG kind|key|cap|weight|rate|interval_ms ...
-- Cost: O(1 + keys at their cap * log K).

local MAX_CAP = 1000000000
local MAX_WEIGHT = 1000000
local MAX_INTERVAL_MS = 24 * 3600 * 1000

return run(function(c)
  local kind, key, cap_arg, weight_arg = ARGV[1], ARGV[2] or '', ARGV[3] or '', ARGV[4]
  if kind ~= 'key' and kind ~= 'default' then error({ err = 'BADARG kind must be key or default' }) end
  if #key > 256 or not valid_utf8(key) then
    error({ err = 'BADARG key must be valid UTF-8 of at most 256 bytes' })
  end
  local cap = nil
  if cap_arg ~= '' then
    cap = to_int(cap_arg, 'cap')
    if cap < 0 or cap > MAX_CAP then error({ err = 'BADARG cap must be in [0, ' .. MAX_CAP .. ']' }) end
  end
  local weight = to_int(weight_arg, 'weight')
  if weight < 1 or weight > MAX_WEIGHT then
    error({ err = 'BADARG weight must be in [1, ' .. MAX_WEIGHT .. ']' })
  end
  local rate_arg = ARGV[5] or ''
  local rate, interval = nil, nil
  if rate_arg ~= '' then
    rate, interval = to_int(rate_arg, 'rate'), to_int(ARGV[6], 'interval_ms')
    if rate < 1 or rate > MAX_CAP then error({ err = 'BADARG rate must be in [1, ' .. MAX_CAP .. ']' }) end
    if interval < 1 or interval > MAX_INTERVAL_MS then
      error({ err = 'BADARG interval_ms must be in [1, ' .. MAX_INTERVAL_MS .. ']' })
    end
  end
  local now = now_ms(c)
  if not fair_on(c) then fair_turn_on(c, now) end
  local field = kind == 'default' and 'cap' or 'cap:' .. key
  if cap then redis.call('HSET', k.fair, field, cap) else redis.call('HDEL', k.fair, field) end
  if kind == 'key' then
    if rate then
      redis.call('HSET', k.fair, 'rate:' .. key, rate .. ' ' .. interval)
    else
      redis.call('HDEL', k.fair, 'rate:' .. key, 'tb:' .. key)
    end
    -- Waiting for a token under the old rate: it is looked at again at the next claim.
    if redis.call('ZREM', k.fairwait, key) == 1 then
      redis.call('ZADD', k.fairready, fair_vt(), key)
    end
    if weight ~= 1 then
      redis.call('HSET', k.fair, 'w:' .. key, weight)
    else
      redis.call('HDEL', k.fair, 'w:' .. key)
    end
  end
  local full = redis.call('ZRANGE', k.fairfull, 0, -1)
  if #full > 0 then
    local vt, adds = fair_vt(), {}
    for _, name in ipairs(full) do
      adds[#adds + 1] = vt
      adds[#adds + 1] = name
    end
    call_many('ZADD', k.fairready, adds)
    redis.call('DEL', k.fairfull)
    wake_idle(#full, now)
  end
  return { 0, #full }
end)
