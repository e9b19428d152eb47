-- lib/keys.lua: the KEYS layout every distsched script receives.
--
-- Every script is called with the same 14 keys of one namespace, in this order
-- (built by distsched/keys.py, Keys.script_keys()); they all carry the hash tag
-- {namespace}, so a call touches one Redis Cluster slot. Scripts touch no other key.
--
-- KEYS[1]  tasks        hash: id -> task record (lib/record.lua)
-- KEYS[2]  payloads     hash: id -> msgpack payload {"fn", "args", "kwargs"}
-- KEYS[3]  results      hash: id -> 'E' .. error text, or 'R' .. msgpack result
-- KEYS[4]  done         hash: id -> recently applied tokens 'version.attempt'
-- KEYS[5]  queue        sorted set: the ready queue (score run_at ms)
-- KEYS[6]  leases       sorted set: running id -> lease deadline ms
-- KEYS[7]  finished     sorted set: terminal id -> time it became terminal ms
-- KEYS[8]  meta         hash: seq, pseq, max_running, count:<state>
-- KEYS[9]  wake         pub/sub channel for waiting workers
-- KEYS[10] edges        sorted set (all scores 0): dependency edges (lib/graph.lua)
-- KEYS[11] deps         hash: id -> the current version's dependency list
-- KEYS[12] blocked      hash: blocked id -> its first cause (root and parent)
-- KEYS[13] blockedby    sorted set (all scores 0): root -> ids it blocked
-- KEYS[14] propagating  sorted set: terminal ids whose dependents are still to be told

local k = {
  tasks = KEYS[1], payloads = KEYS[2], results = KEYS[3], done = KEYS[4], queue = KEYS[5],
  leases = KEYS[6], finished = KEYS[7], meta = KEYS[8], wake = KEYS[9], edges = KEYS[10],
  deps = KEYS[11], blocked = KEYS[12], blockedby = KEYS[13], propagating = KEYS[14],
}
if #KEYS ~= 14 then return redis.error_reply('BADARG KEYS expected the 14 namespace keys') end
