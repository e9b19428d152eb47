"""Server-side caps: the most work one script call may be asked to do.

Redis runs one script at a time, so a single call that runs long stalls every client
of the server, other namespaces included. Each script therefore bounds its own work
with caps that no argument can raise: a call over a cap is refused with ``BADARG``
naming it, and writes nothing. The same numbers are in ``lua/lib/limits.lua``, which
the scripts include (a test checks that the two agree); the Python client checks them
too, so that a mistake is reported before a round trip.

They are sized so that no single call at these bounds takes more than 50 ms on the
machine the bench runs on (the payload caps: about 30 ms) (``distsched bench``, section ``worst``).
"""

from __future__ import annotations

# Tasks in one ``schedule`` call (``schedule_many`` sends larger batches in parts).
MAX_TASKS_PER_CALL = 500
# Dependency edges in one call: a ``schedule`` batch's dependencies added up, or one
# ``add_deps`` part.
MAX_EDGES_PER_CALL = 1000
# Dependencies of one task in total, over every part that placed them.
MAX_DEPS_PER_TASK = 4000
# Dependents settled by one call (the propagation budget), whatever the caller asks.
MAX_PROPAGATE_BUDGET = 250
# Entries one ``compact`` call examines.
MAX_COMPACT_BUDGET = 2500
# Tasks one ``claim`` call hands out.
MAX_CLAIM = 1000
# The payload bytes one ``claim`` reply carries: past it the call stops early (it
# always hands out at least one task).
MAX_CLAIM_REPLY_BYTES = 2 * 1024 * 1024
# Tasks one report call (complete, fail, heartbeat, release) carries.
MAX_REPORTS_PER_CALL = 128
# An error text stored by ``fail`` (a worker cuts longer ones before sending).
MAX_ERROR_BYTES = 4 * 1024
# A worker id.
MAX_WORKER_ID_BYTES = 256
# A running task's progress note (``progress.lua``), in bytes of UTF-8.
MAX_PROGRESS_NOTE_BYTES = 200
# A running task's checkpoint (``progress.lua``), in bytes as stored (msgpack).
MAX_CHECKPOINT_BYTES = 64 * 1024
# A namespace's payload limit: its stored setting (``payload_max`` in meta, set by an
# admin call), never above the ceiling. The default applies while none is stored.
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20
PAYLOAD_CEILING_BYTES = 1 << 20
# The payload bytes of one ``schedule`` call in total: Redis copies and stores them, and a
# script searches each string for bytes outside ASCII (some 15 ms per MiB).
MAX_PAYLOAD_BYTES_PER_CALL = 1 << 20
# The msgpack values of one payload (the map itself, every key and every value inside
# it; each character outside ASCII in a string counts as one more), and of the payloads
# of one ``schedule`` call together: a script checks every value of every payload it
# stores (to refuse what a worker cannot read), which costs time by the value (some
# 0.3 us each), not by the byte.
MAX_PAYLOAD_VALUES = 32768
MAX_PAYLOAD_VALUES_PER_CALL = 32768
# How deep arrays and maps may nest inside a payload (the top map is depth 1).
MAX_PAYLOAD_DEPTH = 64
# Pending tasks the cycle check may visit for one call; past it the call is refused.
MAX_CYCLE_VISITS = 1000
# Dependencies whose results one ``dep_results`` call reads (a join's whole read), and
# the bytes of their stored results and errors together: past either the call is refused
# and reads nothing (one dependency asked alone is read whatever its size).
MAX_DEP_RESULTS = 1000
MAX_DEP_RESULT_BYTES = 2 * 1024 * 1024
# Children one spawn (a task completing with Spawn) adds in its one call.
MAX_SPAWN_CHILDREN = 1000
