"""A program the waitpoint race test runs as separate processes.

``python tests/waitpoint_procs.py MODE URL NAMESPACE TASK_ID ROUNDS``
    Connects, prints ``ready``, waits for a start line (so that every process starts at
    once), then completes waitpoints ``TASK_ID-0`` .. ``TASK_ID-<ROUNDS - 1>``, one call
    each, and prints the outcomes as one JSON line. MODE ``python`` calls
    ``Scheduler.complete_waitpoint``; MODE ``wire`` does what a producer in another
    language would: a bare Redis client sending the assembled ``waitpoint.lua`` with EVALSHA
    (lua/README.md), its keys and arguments written out by hand.
"""

from __future__ import annotations

import json
import os
import sys

import msgpack
import redis

from distsched import Scheduler
from distsched.scripts import source

# The script's keys, in the order of its @keys lines (lua/waitpoint.lua).
WAITPOINT_KEYS = [
    "tasks",
    "results",
    "queue",
    "finished",
    "meta",
    "idle",
    "edges",
    "deps",
    "blocked",
    "blockedby",
    "propagating",
    "states",
    "history",
    "ranked",
    "waits",
    "ended",
    "deadlines",
    "fair",
    "fairq",
    "fairready",
    "fairwait",
    "fairfull",
    "fairkeys",
    "fairrun",
    "parents",
    "window",
    "windows",
    "wake",
    "joins",
]


def main(mode: str, url: str, namespace: str, task_id: str, rounds: int) -> int:
    outcomes: list[str] = []
    me = f"proc-{os.getpid()}"
    if mode == "python":
        s = Scheduler.from_url(url, namespace=namespace)
        try:
            s.server_time()
            print("ready", flush=True)
            sys.stdin.readline()
            for i in range(rounds):
                outcomes.append(s.complete_waitpoint(f"{task_id}-{i}", {"by": me}, by=me).value)
        finally:
            s.close()
    else:
        client = redis.Redis.from_url(url)
        try:
            sha = client.script_load(source("waitpoint"))
            keys = [f"ds:{{{namespace}}}:{name}" for name in WAITPOINT_KEYS]
            payload = msgpack.packb({"by": me})
            print("ready", flush=True)
            sys.stdin.readline()
            for i in range(rounds):
                reply = client.evalsha(
                    sha, len(keys), *keys, 250, "complete", f"{task_id}-{i}", "", payload, me
                )
                # No dependents here: nothing is left to settle (reply[0] is 0).
                outcomes.append(reply[1].decode())
        finally:
            client.close()
    print(json.dumps(outcomes), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
