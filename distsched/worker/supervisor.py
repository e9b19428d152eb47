"""Several worker processes on one machine, kept running by one supervisor process.

``distsched worker --processes N`` runs a :class:`Supervisor`: it starts N child
processes, each an ordinary one-process worker (the same command with
``--processes 1``), restarts a child that dies, forwards SIGTERM and SIGINT to every
child for the ordered shutdown, and exits 0 only when every child stopped cleanly.

The restart policy: a child that dies is started again after a pause that doubles
with each death in a row (``RESTART_FIRST_S`` to ``RESTART_CAP_S``). A death counts
as "in a row" when the child ran less than ``STABLE_S``; a child that ran longer
starts the count anew. After ``CRASH_LIMIT`` quick deaths in a row of one child (it
cannot even start: a broken import, a bad setting) the supervisor gives up: it stops
the other children as on SIGTERM and exits ``EXIT_CRASHING``.

A child that exits ``EXIT_REPLACE`` did so on purpose: a ``def`` task function ran past
its time limit and its grace, and only the end of its process could stop it (the
child reported the attempt failed first). It is started again at once, and this is
not a death: it neither pauses nor counts towards ``CRASH_LIMIT``.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger("distsched.worker.supervisor")

# The environment variable that tells a child which process of the supervisor it is
# (0 to N-1); the same index survives restarts.
PROCESS_ENV = "DISTSCHED_WORKER_PROCESS"
RESTART_FIRST_S = 0.5
RESTART_CAP_S = 30.0
STABLE_S = 10.0
CRASH_LIMIT = 5
# The supervisor's exit statuses besides 0 (every child stopped cleanly).
EXIT_UNCLEAN = 1  # a child did not stop cleanly (its status was not 0), or was killed
EXIT_CRASHING = 3  # a child kept dying at start: given up
EXIT_AT_ONCE = 130  # a second Ctrl-C: the children were told to exit at once
# After a second Ctrl-C, how often the children still running are told again.
RESEND_S = 0.5
# A child's exit status asking for its replacement at once: it ended itself to stop a
# function that outlived its time limit (``Worker(stop_on_overrun=True)``).
EXIT_REPLACE = 4
# How often the supervisor looks at its children (a child's death is seen this late).
POLL_S = 0.05
# Linux: a child gets SIGTERM when the supervisor itself dies (even by SIGKILL).
_PR_SET_PDEATHSIG = 1


class ChildState(enum.Enum):
    RUNNING = "running"
    WAITING = "waiting"  # dead, to be started again at ``restart_at``
    STOPPED = "stopped"  # exited during the shutdown (or never restarted)


@dataclass(eq=False)
class Child:
    """One slot of the supervisor: the process now running in it, and its deaths."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    state: ChildState = ChildState.WAITING
    started: float = 0.0
    restart_at: float = 0.0
    # Quick deaths in a row (each within STABLE_S of its start).
    crashes: int = 0
    restarts: int = 0
    pids: list[int] = field(default_factory=list)
    exit_code: int | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exited with status {code}"


def _parent_death_signal() -> Callable[[], None] | None:
    """What a child runs before exec to get SIGTERM when the supervisor dies (Linux),
    looked up here, in the supervisor: between fork and exec the child only calls it."""
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return set_signal


class Supervisor:
    """Keep ``processes`` children of ``command`` running until SIGTERM/SIGINT or :meth:`stop`.

    ``command`` is the argv of one child; each child gets ``env`` (default: this
    process's environment) plus ``DISTSCHED_WORKER_PROCESS`` set to its index, and
    runs in a process group of its own, so that a Ctrl-C at the terminal reaches the
    children only through the supervisor (once each, as the ordered shutdown wants).

    The first SIGTERM or SIGINT is sent on to every child: each stops claiming, gives
    its running tasks their grace, hands the rest back and exits. A second SIGINT is
    sent on too, which makes the children exit at once. ``stop_timeout`` bounds the
    wait for the children after the first signal: a child still running then is
    killed (its tasks run again when their leases expire) and the exit is unclean.
    """

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        env: Mapping[str, str] | None = None,
        stop_timeout: float = 60.0,
        restart_first_s: float = RESTART_FIRST_S,
        restart_cap_s: float = RESTART_CAP_S,
        stable_s: float = STABLE_S,
        crash_limit: int = CRASH_LIMIT,
        child_args: Callable[[int], Sequence[str]] | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.command = list(command)
        self.processes = processes
        self.env = dict(os.environ if env is None else env)
        self.stop_timeout = stop_timeout
        self.restart_first_s = restart_first_s
        self.restart_cap_s = restart_cap_s
        self.stable_s = stable_s
        self.crash_limit = crash_limit
        self.child_args = child_args
        self.children = [Child(i) for i in range(processes)]
        self._before_exec = _parent_death_signal()
        self._signals: list[int] = []
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._stop_deadline: float | None = None
        self._gave_up = False
        self._at_once = False
        self._resend_at = 0.0

    # ------------------------------------------------------------------ public

    def run(self) -> int:
        """Start the children and supervise them; return the exit status (0: clean)."""
        restore = self._install_signals()
        try:
            log.info(
                "supervisor %d: starting %d worker processes",
                os.getpid(),
                self.processes,
                extra={"processes": self.processes},
            )
            for child in self.children:
                self._start(child)
            return self._loop()
        finally:
            restore()

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Start the ordered shutdown, as the signal ``signum`` would (any thread)."""
        with self._lock:
            self._signals.append(signum)
        self._wake.set()

    @property
    def pids(self) -> list[int]:
        """The pids of the children running now."""
        return [c.pid for c in self.children if c.state is ChildState.RUNNING and c.pid]

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> int:
        while True:
            self._wake.wait(POLL_S)
            self._wake.clear()
            self._handle_signals()
            now = time.monotonic()
            for child in self.children:
                if child.state is ChildState.RUNNING:
                    self._check(child, now)
                elif (
                    child.state is ChildState.WAITING
                    and self._stop_deadline is None
                    and now >= child.restart_at
                ):
                    self._start(child)
            if self._stop_deadline is None:
                continue
            if all(c.state is ChildState.STOPPED for c in self.children):
                return self._exit_status()
            if now >= self._stop_deadline:
                self._kill_late()
                return self._exit_status()
            if self._at_once and now >= self._resend_at:
                # A child runs its handler once for signals that reach it before the
                # handler ran: one that took both SIGINTs for one is told again.
                self._resend_at = now + RESEND_S
                self._send(signal.SIGINT)

    def _check(self, child: Child, now: float) -> None:
        assert child.proc is not None
        code = child.proc.poll()
        if code is None:
            return
        child.exit_code = code
        if self._stop_deadline is not None:
            child.state = ChildState.STOPPED
            level = logging.INFO if code == 0 else logging.WARNING
            log.log(
                level,
                "worker process %d (pid %d) %s",
                child.index,
                child.proc.pid,
                "stopped" if code == 0 else _exit_text(code),
                extra={"worker_process": child.index, "pid": child.proc.pid, "exit_code": code},
            )
            return
        if code == EXIT_REPLACE:
            child.state = ChildState.WAITING
            child.restart_at = now
            log.warning(
                "worker process %d (pid %d) ended itself to stop a task function past its "
                "time limit; starting another",
                child.index,
                child.proc.pid,
                extra={"worker_process": child.index, "pid": child.proc.pid, "exit_code": code},
            )
            return
        ran = now - child.started
        child.crashes = child.crashes + 1 if ran < self.stable_s else 1
        if child.crashes >= self.crash_limit:
            log.error(
                "worker process %d (pid %d) %s after %.1fs: %d quick deaths in a row, giving "
                "up; stopping the other worker processes",
                child.index,
                child.proc.pid,
                _exit_text(code),
                ran,
                child.crashes,
                extra={"worker_process": child.index, "pid": child.proc.pid, "exit_code": code},
            )
            child.state = ChildState.STOPPED
            self._gave_up = True
            self._begin_stop(signal.SIGTERM)
            return
        pause = min(self.restart_cap_s, self.restart_first_s * 2 ** (child.crashes - 1))
        child.state = ChildState.WAITING
        child.restart_at = now + pause
        log.warning(
            "worker process %d (pid %d) %s after %.1fs; starting another in %.1fs",
            child.index,
            child.proc.pid,
            _exit_text(code),
            ran,
            pause,
            extra={"worker_process": child.index, "pid": child.proc.pid, "exit_code": code},
        )

    def _start(self, child: Child) -> None:
        env = dict(self.env)
        env[PROCESS_ENV] = str(child.index)
        argv = self.command + list(self.child_args(child.index) if self.child_args else ())
        try:
            proc = subprocess.Popen(
                argv, env=env, start_new_session=True, preexec_fn=self._before_exec
            )
        except OSError as exc:
            # As a death at start: retried with the same backoff, then given up.
            log.error("worker process %d could not be started: %s", child.index, exc)
            child.crashes += 1
            if child.crashes >= self.crash_limit:
                child.state = ChildState.STOPPED
                self._gave_up = True
                self._begin_stop(signal.SIGTERM)
                return
            child.state = ChildState.WAITING
            child.restart_at = time.monotonic() + min(
                self.restart_cap_s, self.restart_first_s * 2 ** (child.crashes - 1)
            )
            return
        if child.proc is not None:
            child.restarts += 1
        child.proc = proc
        child.exit_code = None
        child.pids.append(proc.pid)
        child.state = ChildState.RUNNING
        child.started = time.monotonic()
        log.info(
            "worker process %d started (pid %d)",
            child.index,
            proc.pid,
            extra={"worker_process": child.index, "pid": proc.pid},
        )

    # ------------------------------------------------------------------ shutdown

    def _handle_signals(self) -> None:
        with self._lock:
            received, self._signals = self._signals, []
        for signum in received:
            if self._stop_deadline is None:
                log.warning(
                    "supervisor %d: %s: stopping %d worker processes (each gives its running "
                    "tasks their grace)",
                    os.getpid(),
                    signal.Signals(signum).name,
                    len(self.pids),
                )
                self._begin_stop(signum)
            elif signum == signal.SIGINT:
                log.warning(
                    "supervisor %d: second SIGINT: the worker processes exit at once", os.getpid()
                )
                self._at_once = True
                self._resend_at = time.monotonic() + RESEND_S
                self._send(signal.SIGINT)

    def _begin_stop(self, signum: int) -> None:
        self._stop_deadline = time.monotonic() + self.stop_timeout
        for child in self.children:
            if child.state is ChildState.WAITING:
                child.state = ChildState.STOPPED
        self._send(signum)

    def _send(self, signum: int) -> None:
        for child in self.children:
            if child.state is ChildState.RUNNING and child.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signum)

    def _kill_late(self) -> None:
        for child in self.children:
            if child.state is ChildState.RUNNING and child.proc is not None:
                log.error(
                    "worker process %d (pid %d) still running %.0fs after the stop: killed; "
                    "its tasks run again when their leases expire",
                    child.index,
                    child.proc.pid,
                    self.stop_timeout,
                )
                child.proc.kill()
                child.proc.wait()
                child.exit_code = -signal.SIGKILL
                child.state = ChildState.STOPPED

    def _exit_status(self) -> int:
        if self._gave_up:
            return EXIT_CRASHING
        if self._at_once:
            return EXIT_AT_ONCE
        if any(c.exit_code != 0 for c in self.children):
            return EXIT_UNCLEAN
        log.info("supervisor %d: every worker process stopped cleanly", os.getpid())
        return 0

    def _install_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stop(signum)

        for s in previous:
            signal.signal(s, on_signal)

        def restore() -> None:
            for s, handler in previous.items():
                signal.signal(s, handler)

        return restore
