"""Test your own tasks: an in-process scheduler, a clock you move, and a run until idle.

::

    from distsched.testing import harness

    def test_welcome_is_sent_a_minute_later() -> None:
        with harness(tasks) as h:                       # tasks: your Tasks
            send_welcome.options(delay=60).schedule("welcome:42", 42)
            h.run_until_idle()                          # not due yet: nothing runs
            h.advance(timedelta(minutes=1))
            h.run_until_idle()
            assert send_welcome.result("welcome:42") == "sent to 42"

The scheduler is the real one, Lua scripts included, on an in-process server
(fakeredis with Lua, the ``distsched[embedded]`` extra) unless a client is given; tasks
run through a real :class:`~distsched.Worker`, hooks, retries and time limits included.

The clock is the namespace's: :meth:`Harness.advance` moves it forward for every
script of the namespace (due times, deadlines, leases, recurring slots) and for
``Scheduler.server_time()``. It does not move a key's time to live in Redis itself
(kept results and history expire on the server's own clock).
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import math
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import redis

from distsched.client import Scheduler
from distsched.errors import InvalidArgument, MissingExtraError
from distsched.ops.namespace import Ops
from distsched.tasks import TaskHandle, Tasks, served_functions
from distsched.worker import Worker

__all__ = ["Harness", "harness"]

Functions = Mapping[str, Callable[..., Any]] | Tasks | ModuleType | Sequence[TaskHandle[Any, Any]]


class Harness:
    """A scheduler for tests, the functions it runs, and its clock."""

    def __init__(self, scheduler: Scheduler, functions: Functions, concurrency: int = 1) -> None:
        self.scheduler = scheduler
        self.functions = served_functions(functions)
        self.concurrency = concurrency

    def run_until_idle(self) -> dict[str, int]:
        """Run every due task, and those that become due meanwhile (retries within the
        clock, dependents, fired schedules), until none is due and none runs. Returns
        the worker's counts (``succeeded``, ``failed``...). Tasks due later wait for
        :meth:`advance`."""
        worker = Worker(self.scheduler, self.functions, concurrency=self.concurrency)
        worker.run_until_idle()
        return {name: n for name, n in worker.counts.items() if n}

    def advance(self, by: float | _dt.timedelta) -> None:
        """Move the namespace's clock forward ``by`` seconds (or a ``timedelta``)."""
        seconds = by.total_seconds() if isinstance(by, _dt.timedelta) else by
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise InvalidArgument("by", f"must be seconds or a timedelta, got {by!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise InvalidArgument("by", f"must move the clock forward, got {seconds!r} s")
        s = self.scheduler
        s._drive(s._ops.call(Ops.advance_clock, round(seconds * 1000)))

    def now(self) -> _dt.datetime:
        """The namespace's clock, as an aware UTC datetime."""
        return _dt.datetime.fromtimestamp(self.scheduler.server_time(), _dt.timezone.utc)


def _in_process_client() -> redis.Redis:
    try:
        import fakeredis
    except ImportError:
        raise MissingExtraError(
            "the in-process test server needs fakeredis with Lua: "
            "pip install 'distsched[embedded]' (or give harness() a client)"
        ) from None
    if importlib.util.find_spec("lupa") is None:  # fakeredis runs the Lua scripts with it
        raise MissingExtraError(
            "the in-process test server runs Lua through lupa: pip install 'distsched[embedded]'"
        )
    client: redis.Redis = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    return client


@contextmanager
def harness(
    functions: Functions,
    *,
    client: redis.Redis | None = None,
    namespace: str | None = None,
    concurrency: int = 1,
    **scheduler_options: Any,
) -> Iterator[Harness]:
    """A :class:`Harness` for the ``with`` block: a fresh namespace on an in-process
    server (or on ``client``, a real Redis, left open), the scheduler bound to
    ``functions`` when it is a :class:`~distsched.tasks.Tasks` (unbound afterwards).

    ``scheduler_options`` go to :class:`~distsched.Scheduler` (``lease_s``...).
    """
    owned = client is None
    conn = _in_process_client() if client is None else client
    scheduler = Scheduler(
        conn, namespace=namespace or f"test-{uuid.uuid4().hex[:12]}", **scheduler_options
    )
    tasks = functions if isinstance(functions, Tasks) else None
    try:
        h = Harness(scheduler, functions, concurrency)
        if tasks is not None:
            tasks.bind(scheduler)
        yield h
    finally:
        if tasks is not None:
            tasks.bind(None)
        scheduler.close()
        if owned:
            conn.close()
            # fakeredis hands its client a pool of its own making, which close() leaves.
            conn.connection_pool.disconnect()
