"""What the worker logs, and formatters for people and for log pipelines.

Every line about one task is logged on ``distsched.worker.tasks`` with the same
structured fields, given through ``extra=`` and so readable by any handler as
attributes of the :class:`logging.LogRecord`: ``task_id``, ``fn``, ``version``,
``attempt``, ``duration`` (seconds the function ran, or None), ``outcome`` (a
:class:`TaskOutcome` value) and ``error`` (the ``Type: message`` line, or None).
Levels: a failed attempt that ends the task at ERROR with its traceback, one that
will run again and a lost lease at WARNING, a success at DEBUG.

A log sink that blocks (a pipe nobody reads, a stalled collector) must not stall the
worker: :class:`NonBlockingHandler` hands records to a bounded queue that a thread of
its own writes out, dropping (and counting) what does not fit; ``configure`` uses it.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import enum
import json
import logging
import queue
import sys
import threading
from collections.abc import Mapping
from typing import IO, Any

from distsched.model import Claim
from distsched.text import redact

__all__ = [
    "LOG_QUEUE_MAX",
    "TASK_FIELDS",
    "JsonFormatter",
    "LogFormat",
    "NonBlockingHandler",
    "TaskOutcome",
    "TextFormatter",
    "configure",
    "redis_location",
    "task_fields",
]

# The logger of the lines about single tasks (one per attempt and event).
tasks_log = logging.getLogger("distsched.worker.tasks")
# The logger of the line that counts the records a NonBlockingHandler dropped.
drops_log = logging.getLogger("distsched.worker.logs")

# Records a NonBlockingHandler holds while its sink is slow: about ten seconds of a
# worker logging a hundred failures a second; a record holds at most a traceback of
# a few kB, so the queue stays within a few MB.
LOG_QUEUE_MAX = 1000
# How long a flush or close waits for the queued records to be written.
LOG_FLUSH_S = 2.0

TASK_FIELDS = ("task_id", "fn", "version", "attempt", "duration", "outcome", "error")
# Other structured fields the worker's own lines carry (start-up and shutdown).
WORKER_FIELDS = ("worker_id", "namespace", "redis", "concurrency", "functions", "counts")


class TaskOutcome(str, enum.Enum):
    """The ``outcome`` field of a task line."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # the attempt failed and the task ended failed
    RETRIED = "retried"  # the attempt failed and the task will run again
    CANCELLED = "cancelled"
    RELEASED = "released"  # handed back by the shutdown, no attempt spent
    HANDED_BACK = "handed_back"  # not served here, handed back unstarted
    UNSERVED = "unserved"  # no live worker served the function in time
    LEASE_LOST = "lease_lost"  # another run now owns the task; this one is not recorded
    DUPLICATE = "duplicate"  # the same report was already applied
    UNREPORTED = "unreported"  # the shutdown ended before the outcome was reported

    def __str__(self) -> str:
        return self.value


class LogFormat(str, enum.Enum):
    """How the ``distsched worker`` command writes its log."""

    TEXT = "text"
    JSON = "json"

    def __str__(self) -> str:
        return self.value


def task_fields(
    claim: Claim,
    outcome: TaskOutcome,
    duration: float | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """The ``extra=`` of a task line: every field of ``TASK_FIELDS``, None when unknown."""
    return {
        "task_id": claim.task_id,
        "fn": claim.fn,
        "version": claim.version,
        "attempt": claim.attempt,
        "duration": None if duration is None else round(duration, 6),
        "outcome": outcome.value,
        "error": error,
    }


def error_line(error: BaseException | str | None) -> str | None:
    """The ``Type: message`` summary of an error, on one line (None for None)."""
    if error is None:
        return None
    if isinstance(error, BaseException):
        try:
            message = str(error)
        except Exception:
            message = "<exception str() failed>"
        text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    else:
        # Stored text: a traceback ends with its type/message line.
        lines = [ln for ln in error.splitlines() if ln.strip()]
        text = lines[-1] if lines else error
    return " ".join(text.split())[:1000]


def redis_location(client: Any) -> str:
    """Where ``client`` connects, as a URL with no password in it."""
    try:
        nodes = getattr(client, "nodes_manager", None)
        if nodes is not None:
            node = client.get_default_node()
            tls = bool(nodes.connection_kwargs.get("ssl"))
            kwargs: Mapping[str, Any] = nodes.connection_kwargs
            where = f"{'rediss' if tls else 'redis'}+cluster://{node.host}:{node.port}"
        else:
            pool = client.connection_pool
            kwargs = pool.connection_kwargs
            if kwargs.get("path"):
                where = f"unix://{kwargs['path']}"
            else:
                tls = "SSL" in pool.connection_class.__name__
                host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
                where = f"{'rediss' if tls else 'redis'}://{host}:{port}/{kwargs.get('db', 0)}"
        user = kwargs.get("username")
        if kwargs.get("password") is not None:
            scheme, rest = where.split("://", 1)
            where = f"{scheme}://{user or ''}:***@{rest}"
        elif user:
            scheme, rest = where.split("://", 1)
            where = f"{scheme}://{user}@{rest}"
        return redact(where)
    except Exception:
        # Only a description for the log: an unusual client must not stop the worker.
        return type(client).__name__


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``, then the traceback when there is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the structured fields the record carries, and ``traceback`` when
    it has one. Newlines inside values are escaped, so a record is always one line."""

    def format(self, record: logging.LogRecord) -> str:
        created = datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
        line: dict[str, Any] = {
            "time": created.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in (*TASK_FIELDS, *WORKER_FIELDS):
            if name in record.__dict__:
                line[name] = record.__dict__[name]
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["traceback"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # ASCII: a lone surrogate in an error must not make the line unwritable.
        return json.dumps(line, default=str)


# Renders tracebacks where a record is queued (the default rendering of every formatter).
_TRACEBACKS = logging.Formatter()
_STOP = object()


class NonBlockingHandler(logging.Handler):
    """Hand records to the ``targets`` handlers through a bounded queue and a thread of
    its own, so that logging never waits for a slow sink.

    A record is queued as it is logged: its message is rendered then (and its
    traceback into ``exc_text``), every other attribute (the task fields) kept.
    When ``capacity`` records wait, a new one is dropped and counted in
    ``dropped``; once the queue has drained, one WARNING line on
    ``distsched.worker.logs`` says how many were dropped since the last such line.
    ``flush`` and ``close`` wait at most ``LOG_FLUSH_S`` for the queue to drain.
    """

    def __init__(self, *targets: logging.Handler, capacity: int = LOG_QUEUE_MAX) -> None:
        super().__init__()
        self.targets = targets
        self.capacity = capacity
        self.dropped = 0  # every record dropped so far
        self._unreported = 0  # dropped since the last line that said so
        # Reentrant, as the queue's put: a signal handler that logs may interrupt a
        # thread in the middle of logging (a plain lock would deadlock it).
        self._count_lock = threading.RLock()
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._write, name="distsched-log", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            prepared = self.prepare(record)
        except Exception:
            self.handleError(record)
            return
        # The bound may be passed by as many records as threads log at once: no lock is
        # taken around the check and the put, so that no thread ever waits here.
        if self._queue.qsize() >= self.capacity:
            with self._count_lock:
                self.dropped += 1
                self._unreported += 1
            return
        self._queue.put(prepared)

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """A copy of ``record`` that another thread may write later: the arguments may
        change meanwhile, and a live traceback would keep all its frames in memory."""
        record = copy.copy(record)
        record.message = record.getMessage()
        record.msg, record.args = record.message, None
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = _TRACEBACKS.formatException(record.exc_info)
            record.exc_info = None
        return record

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            # A target that raises (handlers report their own faults) must not end the
            # thread: the queue would then fill for good.
            with contextlib.suppress(Exception):
                if isinstance(item, logging.LogRecord):
                    self._handle(item)
                if self._queue.empty():
                    self._report_drops()
            if isinstance(item, threading.Event):  # a flush: all before it is written
                item.set()

    def _handle(self, record: logging.LogRecord) -> None:
        for handler in self.targets:
            if record.levelno >= handler.level:
                handler.handle(record)

    def _report_drops(self) -> None:
        with self._count_lock:
            dropped, self._unreported = self._unreported, 0
        if dropped:
            record = drops_log.makeRecord(
                drops_log.name,
                logging.WARNING,
                __file__,
                0,
                "%d log records were dropped: the log output did not keep up (%d dropped "
                "since the start; at most %d wait to be written)",
                (dropped, self.dropped, self.capacity),
                None,
            )
            self._handle(self.prepare(record))

    def flush(self) -> None:
        """Wait (at most ``LOG_FLUSH_S``) for the records queued so far to be written."""
        if not self._thread.is_alive():
            return
        written = threading.Event()
        self._queue.put(written)
        if written.wait(LOG_FLUSH_S):
            # Not while the thread is stuck in a write: flushing would wait with it.
            for handler in self.targets:
                handler.flush()

    def close(self) -> None:
        """Write what is queued (waiting at most ``LOG_FLUSH_S``), then stop the thread."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            # A thread stuck in a write stays with it: a daemon, it ends with the process.
            self._thread.join(LOG_FLUSH_S)
        super().close()


def flush_handlers(logger: logging.Logger) -> None:
    """Flush every handler a record of ``logger`` reaches (before ``os._exit``, which
    would lose what a :class:`NonBlockingHandler` still holds)."""
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            # Exiting anyway: a handler's fault must not stop it.
            with contextlib.suppress(Exception):
                handler.flush()
        current = current.parent if current.propagate else None


def configure(
    level: int | str = logging.INFO,
    fmt: LogFormat | str = LogFormat.TEXT,
    stream: IO[str] | None = None,
) -> NonBlockingHandler:
    """Send the process's log to ``stream`` (default: stderr) in ``fmt``, from ``level`` up.

    Meant for a worker process of its own (the ``distsched worker`` command): it
    replaces the handlers of the root logger, so that the task functions' own
    logging comes out the same way. The signal messages (how to stop, how to exit
    at once) stay visible whatever the level. The stream is written by a
    :class:`NonBlockingHandler`: when it blocks, records are dropped and counted,
    never waited for.
    """
    stream_handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    stream_handler.setFormatter(
        JsonFormatter() if LogFormat(fmt) is LogFormat.JSON else TextFormatter()
    )
    handler = NonBlockingHandler(stream_handler)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, NonBlockingHandler):
            old.close()  # configured again: the earlier queue's thread ends
    root.addHandler(handler)
    root.setLevel(level)
    signals = logging.getLogger("distsched.worker.signals")
    if signals.getEffectiveLevel() > logging.WARNING:
        signals.setLevel(logging.WARNING)
    return handler
