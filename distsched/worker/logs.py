"""What the worker logs, and formatters for people and for log pipelines.

Every line about one task is logged on ``distsched.worker.tasks`` with the same
structured fields, given through ``extra=`` and so readable by any handler as
attributes of the :class:`logging.LogRecord`: ``task_id``, ``fn``, ``version``,
``attempt``, ``duration`` (seconds the function ran, or None), ``outcome`` (a
:class:`TaskOutcome` value) and ``error`` (the ``Type: message`` line, or None).
Levels: a failed attempt that ends the task at ERROR with its traceback, one that
will run again and a lost lease at WARNING, a success at DEBUG.
"""

from __future__ import annotations

import datetime
import enum
import json
import logging
import sys
from collections.abc import Mapping
from typing import IO, Any

from distsched.core import Claim
from distsched.text import redact

__all__ = [
    "TASK_FIELDS",
    "JsonFormatter",
    "LogFormat",
    "TaskOutcome",
    "TextFormatter",
    "configure",
    "redis_location",
    "task_fields",
]

# The logger of the lines about single tasks (one per attempt and event).
tasks_log = logging.getLogger("distsched.worker.tasks")

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


def configure(
    level: int | str = logging.INFO,
    fmt: LogFormat | str = LogFormat.TEXT,
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Send the process's log to ``stream`` (default: stderr) in ``fmt``, from ``level`` up.

    Meant for a worker process of its own (the ``distsched worker`` command): it
    replaces the handlers of the root logger, so that the task functions' own
    logging comes out the same way. The signal messages (how to stop, how to exit
    at once) stay visible whatever the level.
    """
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if LogFormat(fmt) is LogFormat.JSON else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    signals = logging.getLogger("distsched.worker.signals")
    if signals.getEffectiveLevel() > logging.WARNING:
        signals.setLevel(logging.WARNING)
    return handler
