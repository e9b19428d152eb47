-- lib/limits.lua: the server-side caps, the most work one script call may be asked to do.
--
-- Redis runs one script at a time: a call that runs long stalls every client of the
-- server, other namespaces included. No argument can raise these; a call over a cap is
-- refused with BADARG naming it and writes nothing (a budget over its cap counts as the
-- cap). The same numbers are in distsched/limits.py (a test checks that they agree).

-- One table rather than a local each: a script's assembled text must stay under Lua's
-- 200 local variables per function, and every script includes these.
local LIMITS = {
  -- Tasks in one schedule call.
  MAX_TASKS_PER_CALL = 500,
  -- Dependency edges in one call: a schedule batch's dependencies added up, or one
  -- add_deps part.
  MAX_EDGES_PER_CALL = 1000,
  -- Dependencies of one task in total, over every part that placed them.
  MAX_DEPS_PER_TASK = 4000,
  -- The most a propagation budget (ARGV[1] of the scripts that settle) counts for.
  MAX_PROPAGATE_BUDGET = 250,
  -- The most a compact budget (compact.lua ARGV[1]) counts for.
  MAX_COMPACT_BUDGET = 2500,
  -- Tasks one claim call hands out.
  MAX_CLAIM = 1000,
  -- Payload bytes one claim reply carries: past it the call stops early (it always hands
  -- out at least one task).
  MAX_CLAIM_REPLY_BYTES = 2097152,
  -- Tasks one report call (complete, fail, heartbeat, release) carries.
  MAX_REPORTS_PER_CALL = 128,
  -- An error text stored by fail.lua.
  MAX_ERROR_BYTES = 4096,
  -- A running task's progress note (progress.lua), in bytes of UTF-8.
  MAX_PROGRESS_NOTE_BYTES = 200,
  -- A running task's checkpoint (progress.lua), in bytes as stored (msgpack).
  MAX_CHECKPOINT_BYTES = 65536,
  -- A worker id (and a claim's request id and wake channel, stored with it).
  MAX_WORKER_ID_BYTES = 256,
  -- A namespace's payload limit while none is stored (meta payload_max), and the most it
  -- can be.
  DEFAULT_MAX_PAYLOAD_BYTES = 1048576,
  PAYLOAD_CEILING_BYTES = 1048576,
  -- The payload bytes of one schedule call in total (copied, stored, and each string
  -- searched for bytes outside ASCII).
  MAX_PAYLOAD_BYTES_PER_CALL = 1048576,
  -- How deep arrays and maps may nest inside a payload (the top map is depth 1).
  MAX_PAYLOAD_DEPTH = 64,
  -- Pending tasks the cycle check may visit for one call; past it the call is refused.
  MAX_CYCLE_VISITS = 1000,
  -- Children one spawn (spawn.lua) adds in its one call.
  MAX_SPAWN_CHILDREN = 1000,
  -- msgpack values in one payload (the map itself, every key and every value inside it;
  -- each character outside ASCII in a string counts as one more), and in the payloads of
  -- one schedule call together: checking a payload costs time by the value, not the byte.
  MAX_PAYLOAD_VALUES = 32768,
  MAX_PAYLOAD_VALUES_PER_CALL = 32768,
  -- Dependencies whose results one dep_results call reads, and the bytes of their stored
  -- results and errors together (one dependency asked alone is read whatever its size).
  MAX_DEP_RESULTS = 1000,
  MAX_DEP_RESULT_BYTES = 2097152,
}
