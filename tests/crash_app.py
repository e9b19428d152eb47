"""An application that imports fine in the supervisor but kills every worker process it
starts (``DISTSCHED_WORKER_PROCESS`` is set in them): a worker that cannot start."""

from __future__ import annotations

import os

if os.environ.get("DISTSCHED_WORKER_PROCESS") is not None:
    raise SystemExit(3)


def noop() -> None:
    return None


FUNCS = {"noop": noop}
