"""One pool of slots serving several namespaces, by weight or in strict order."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

from distsched import validate
from distsched.client import Scheduler
from distsched.errors import InvalidArgument
from distsched.tasks import TaskHandle, Tasks
from distsched.worker import Worker, default_worker_id
from distsched.worker.share import PoolShare
from distsched.worker.signals import SignalHandlers

log = logging.getLogger("distsched.worker")

# How long stop() waits for each namespace's worker to return, beyond its grace.
JOIN_MARGIN_S = 30.0

Functions = Mapping[str, Callable[..., Any]] | Tasks | ModuleType | Sequence[TaskHandle[Any, Any]]


def _served(namespaces: object) -> list[tuple[Scheduler, float]]:
    """``namespaces`` as (scheduler, weight) pairs, checked."""
    if not isinstance(namespaces, Sequence) or isinstance(namespaces, str) or not namespaces:
        raise InvalidArgument("namespaces", "must be a non-empty list of schedulers")
    pairs: list[tuple[Scheduler, float]] = []
    for item in namespaces:
        scheduler, weight = item if isinstance(item, tuple) else (item, 1.0)
        if not isinstance(scheduler, Scheduler):
            raise InvalidArgument(
                "namespaces", f"expected a Scheduler or (Scheduler, weight), got {item!r}"
            )
        if not validate._is_number(weight) or not 0 < weight < math.inf:
            raise InvalidArgument("namespaces", f"weight of {scheduler.namespace!r} must be > 0")
        pairs.append((scheduler, float(weight)))
    names = [s.namespace for s, _ in pairs]
    if len(set(names)) != len(names):
        raise InvalidArgument("namespaces", f"a namespace is listed twice: {names}")
    return pairs


class WorkerPool:
    """Run registered functions for the tasks of several namespaces from one pool of
    ``concurrency`` slots.

    ``namespaces`` lists schedulers (one per namespace), each alone (weight 1) or as
    ``(scheduler, weight)``. When slots come free and several namespaces have due tasks,
    the pool hands them out by weight: under load, each namespace holds slots in
    proportion to its weight (``[(emails, 3), (reports, 1)]``: three quarters to
    ``emails``). With ``strict=True`` the order of the list decides instead: a namespace
    gets only the slots those before it leave. A namespace with nothing due leaves its
    share to the others, and gets it back as soon as it has work.

    Each namespace keeps everything a single worker has: its own claims, wake-ups
    (one idle subscription per namespace), fair keys and ``max_running``, leases,
    heartbeats and reports; a pool listed idle in a namespace whose share is taken
    leaves the idle set and passes its wake-up on, so a task is not left waiting for
    slots that other namespaces hold. Every other keyword argument is
    :class:`~distsched.worker.Worker`'s, for each namespace's worker; they share one
    ``worker_id``, and each registry entry lists what the pool serves
    (``WorkerInfo.serves``).
    """

    def __init__(
        self,
        namespaces: Sequence[Scheduler | tuple[Scheduler, float]],
        functions: Functions,
        concurrency: int = 8,
        strict: bool = False,
        worker_id: str | None = None,
        **worker_options: Any,
    ) -> None:
        pairs = _served(namespaces)
        if not isinstance(strict, bool):
            raise InvalidArgument("strict", "must be a bool")
        if worker_id is not None:
            validate.validate_worker_id(worker_id)
        self.worker_id = worker_id or default_worker_id()
        self.strict = strict
        self.share = PoolShare(concurrency if validate._is_int(concurrency) else 0, strict)
        serves = tuple(
            s.namespace if strict else f"{s.namespace}:{weight:g}" for s, weight in pairs
        )
        self.workers = [
            Worker(
                scheduler,
                functions,
                concurrency=concurrency,
                worker_id=self.worker_id,
                share=self.share,
                weight=weight,
                serves=serves,
                **worker_options,
            )
            for scheduler, weight in pairs
        ]
        for worker in self.workers[1:]:
            # One set of namespace gauges per metrics object: the first namespace's (the
            # counters add up every namespace's claims; `distsched exporter` gives the
            # depth of each namespace).
            worker._heartbeat.observed = False
        self._stopped = threading.Event()
        self._ran = False
        first = self.workers[0]
        self._signals = SignalHandlers(
            self.worker_id, self.stop, first._grace_now, lambda: sum(self.held().values())
        )

    @property
    def namespaces(self) -> list[str]:
        return [w.scheduler.namespace for w in self.workers]

    def run(self) -> None:
        """Serve every namespace until :meth:`stop` or SIGTERM/SIGINT, then shut each
        namespace's worker down as :meth:`Worker.run` does. Call it once."""
        if self._ran:
            raise RuntimeError("a WorkerPool runs once: make a new one to run again")
        self._ran = True
        restore = self._signals.install()
        threads = [
            threading.Thread(target=w.run, name=f"distsched-pool-{w.scheduler.namespace}")
            for w in self.workers
        ]
        try:
            log.info(
                "worker pool %s: %d slots over %s (%s)",
                self.worker_id,
                self.share.concurrency,
                ", ".join(self.namespaces),
                "strict order" if self.strict else "by weight",
            )
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    # Short joins: the main thread stays free for the signal handlers.
                    thread.join(0.2)
                    if any(w.wait_stopped(0) for w in self.workers):
                        # One namespace's worker ended (it was stopped, or outlived a
                        # function's time limit): the pool ends with it.
                        self.stop()
        finally:
            self.stop()
            for thread in threads:
                thread.join()
            restore()
            self._stopped.set()

    def stop(self, grace: float | None = None) -> None:
        """Ask every namespace's worker to shut down (see :meth:`Worker.stop`)."""
        for worker in self.workers:
            worker.stop(grace)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        """Block until :meth:`run` has returned; True if it did within ``timeout``."""
        return self._stopped.wait(timeout)

    @property
    def ended_by_overrun(self) -> bool:
        """True when one namespace's worker stopped the pool for a function that outlived
        its time limit (see :attr:`Worker.ended_by_overrun`)."""
        return any(w.ended_by_overrun for w in self.workers)

    def counts(self) -> dict[str, dict[str, int]]:
        """Each namespace's claim counters (see :attr:`Worker.counts`)."""
        return {w.scheduler.namespace: dict(w.counts) for w in self.workers}

    def held(self) -> dict[str, int]:
        """Each namespace's slots taken now (claimed, running, ...)."""
        return {w.scheduler.namespace: w._slots.busy() for w in self.workers}
