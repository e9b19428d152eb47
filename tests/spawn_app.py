"""Task functions of the spawn tests, run in real worker processes
(``distsched worker tests.spawn_app:FUNCS``).

Each function keeps its marks in Redis outside the namespace's keys (``test:<ns>:...``),
read by the test: how often the fan-out ran, which children ran in which order, and the
most children that ran at once.
"""

from __future__ import annotations

import time

import redis

from distsched import JoinRule, Spawn, TaskSpec, current_task

# The most children of one parent running at once, kept with their count by one script.
_PEAK = """
local live = redis.call('INCR', KEYS[1])
if live > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], live) end
return live
"""


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def fan(url: str, ns: str, n: int, window: int | None = None, hang_first: bool = False) -> Spawn:
    """Spawn ``n`` children ``<id>:<i>`` and a join ``<id>:join``. With ``hang_first``, the
    first run marks that it is inside and hangs (the test kills its process)."""
    ctx = current_task()
    with _client(url) as r:
        runs = int(r.incr(f"test:{ns}:fan-runs"))
        if hang_first and runs == 1:
            r.set(f"test:{ns}:inside", "1")
            time.sleep(60)
    children = [TaskSpec(f"{ctx.task_id}:{i}", "child", args=[url, ns, i]) for i in range(n)]
    join = TaskSpec(f"{ctx.task_id}:join", "gather", args=[url, ns])
    return Spawn(children, join=join, rule=JoinRule.ALL, window=window, result=n)


def child(url: str, ns: str, i: int, seconds: float = 0.05) -> int:
    """Note its start (order and count), and how many children run with it."""
    with _client(url) as r:
        r.rpush(f"test:{ns}:started", i)
        r.eval(_PEAK, 2, f"test:{ns}:live", f"test:{ns}:peak")
        try:
            time.sleep(seconds)
        finally:
            r.decr(f"test:{ns}:live")
    return i


def gather(url: str, ns: str) -> str:
    with _client(url) as r:
        r.incr(f"test:{ns}:joined")
    return "joined"


FUNCS = {"fan": fan, "child": child, "gather": gather}
