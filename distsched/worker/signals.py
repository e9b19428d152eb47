"""SIGTERM and SIGINT for a worker running on the main thread."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

from distsched.worker.logs import flush_handlers

# A logger of its own, so that a process can keep these lines on at any level.
log = logging.getLogger("distsched.worker.signals")

# The exit status after a second Ctrl-C, as a shell reports death by SIGINT.
EXIT_AT_ONCE = 130


class SignalHandlers:
    """The first SIGTERM or SIGINT starts the graceful shutdown; a SIGINT after that
    exits the process at once, leaving the held leases to expire (§8).

    ``stop`` starts the shutdown; ``describe_grace`` says how long running
    functions get; ``held`` counts the tasks whose leases this worker holds.
    """

    def __init__(
        self,
        worker_id: str,
        stop: Callable[[], None],
        describe_grace: Callable[[], float],
        held: Callable[[], int],
    ) -> None:
        self.worker_id = worker_id
        self._stop = stop
        self._grace = describe_grace
        self._held = held
        self._signalled = False
        self._previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {}

    def install(self) -> Callable[[], None]:
        """Install the handlers (main thread only); return what restores the old ones."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        for s in (signal.SIGTERM, signal.SIGINT):
            self._previous[s] = signal.getsignal(s)
            signal.signal(s, self._on_signal)

        def restore() -> None:
            for s, handler in self._previous.items():
                signal.signal(s, handler)

        return restore

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._signalled and signum == signal.SIGINT:
            log.warning(
                "worker %s: second %s: exiting now; %d running tasks are left to their "
                "leases (reaped when they expire, as if this worker had vanished)",
                self.worker_id,
                name,
                self._held(),
            )
            flush_handlers(log)  # the line above may still wait in a log queue
            os._exit(EXIT_AT_ONCE)
        if self._signalled:
            log.warning(
                "worker %s: %s: already stopping; press Ctrl-C to exit at once",
                self.worker_id,
                name,
            )
            return
        self._signalled = True
        log.warning(
            "worker %s: %s: stopping; no new tasks are claimed, running tasks get %gs grace "
            "to finish; press Ctrl-C again to exit at once",
            self.worker_id,
            name,
            self._grace(),
        )
        self._stop()
