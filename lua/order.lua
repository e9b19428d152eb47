-- order.lua: choose the order in which claims take a namespace's due tasks.
--
--- @include ranked
--- @keys queue meta ranked fairq
--
-- The default order is (due time, -priority, sequence); 'priority' ranks each due task
-- by due time - priority * aging_ms, then -priority, then sequence (lib/ranked.lua).
-- The choice is the meta fields order ('priority', absent for the default) and aging_ms.
-- It may change while tasks are queued:
--   default -> priority  every entry of queue counts as not moved yet; claims move the
--                        due ones into ranked (MOVE_MAX per call, in due order)
--   priority -> default  the entries of ranked go back into queue at their due time
--                        (rank + priority * the old aging_ms)
--   a new aging_ms       the entries of ranked are ranked again with it
-- Either of the last two rewrites ranked in this call, so it is refused with
-- CONFLICT queued <entries> while ranked holds more than ARGV[3] entries.
-- In a fair namespace (meta fair, lib/fair.lua) each key other than the default one
-- keeps its entries in fairq, in a delayed section and, in the priority order, a ranked
-- section (lib/ranked.lua): switching to 'priority' moves nothing (claims rank a key's
-- due entries when they visit it); switching back puts every ranked-section entry back
-- into its key's delayed section at its due time, and a new aging_ms ranks them again,
-- both in this call, so fairq's entries count with ranked's against ARGV[3]. The keys'
-- turns (fairready, fairwait, fairfull) stay as they are: a key with a ranked entry has a
-- due head in either order.
--
-- Reads and writes meta (order, aging_ms), queue, ranked, fairq; reads meta (fair).
--
-- Publishes: nothing.
--
-- ARGV[1] 'default' or 'priority'
-- ARGV[2] aging_ms, an integer in [0, 1000000000] (ignored for 'default'; send 0)
-- ARGV[3] the most entries of ranked this call may rewrite (>= 0)
--
-- Reply: { 0, 1 when the order or aging changed, else 0, entries of ranked rewritten, plus
--          in a fair namespace the entries of fairq examined }
-- Errors (nothing written):
--   BADARG order|aging_ms|most ...
--   CONFLICT queued <entries>   ranked is larger than ARGV[3]
-- Cost: O(1), or O((entries of ranked and fairq) * log N) when they are rewritten.

local MAX_AGING_MS = 1000000000

return run(function(c)
  local order = ARGV[1]
  if order ~= 'default' and order ~= 'priority' then
    error({ err = 'BADARG order must be default or priority' })
  end
  local aging = to_int(ARGV[2], 'aging_ms')
  if aging < 0 or aging > MAX_AGING_MS then
    error({ err = 'BADARG aging_ms must be in [0, ' .. MAX_AGING_MS .. ']' })
  end
  local most = to_int(ARGV[3], 'most')
  if most < 0 then error({ err = 'BADARG most must be >= 0' }) end
  if order == 'default' then aging = nil end
  local old = order_aging(c)
  if old == aging then return { 0, 0, 0 } end
  local size = old and redis.call('ZCARD', k.ranked) or 0
  local keyed = (old and c.fair) and redis.call('ZCARD', k.fairq) or 0
  if size + keyed > most then error({ err = 'CONFLICT queued ' .. (size + keyed) }) end
  if keyed > 0 then
    -- Only the ranked sections change; a delayed entry keeps its member.
    local entries = redis.call('ZRANGE', k.fairq, 0, -1)
    local gone, adds = {}, {}
    for _, member in ipairs(entries) do
      local prefix, due, qmember, ranked = fairq_parse(member)
      if ranked then
        gone[#gone + 1] = member
        adds[#adds + 1] = 0
        if aging then
          adds[#adds + 1] = fairq_ranked_member(prefix, due, qmember, aging)
        else
          adds[#adds + 1] = fairq_delayed_member(prefix, due, qmember)
        end
      end
    end
    call_many('ZREM', k.fairq, gone)
    call_many('ZADD', k.fairq, adds)
  end
  if size > 0 then
    local entries = redis.call('ZRANGE', k.ranked, 0, -1, 'WITHSCORES')
    local adds = {}
    for i = 1, #entries, 2 do
      local p = member_priority(entries[i])
      local due = tonumber(entries[i + 1]) + p * old
      adds[#adds + 1] = aging and rank_of(due, p, aging) or due
      adds[#adds + 1] = entries[i]
    end
    if aging then
      call_many('ZADD', k.ranked, adds)
    else
      redis.call('DEL', k.ranked)
      call_many('ZADD', k.queue, adds)
    end
  end
  if aging then
    redis.call('HSET', k.meta, 'order', 'priority', 'aging_ms', aging)
  else
    redis.call('HDEL', k.meta, 'order', 'aging_ms')
  end
  return { 0, 1, size + keyed }
end)
