"""Task functions and hooks for the worker hook tests (``distsched worker --hooks``)."""

from __future__ import annotations

import contextvars
import os
from collections.abc import Callable
from typing import Any

from distsched.context import TaskContext
from distsched.hooks import RunOutcome, WorkerHooks

# Set by the hooks before each run, read by the functions.
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


def seen() -> str:
    """What the function sees of the hooks' context variable."""
    return request_id.get()


async def seen_async() -> str:
    return request_id.get()


FUNCS: dict[str, Callable[..., Any]] = {"seen": seen, "seen_async": seen_async}


class MarkHooks(WorkerHooks):
    """Sets ``request_id`` for the run and appends each call to the file named by
    ``DISTSCHED_TEST_HOOKS_FILE`` (made with no arguments, as ``--hooks`` does)."""

    def __init__(self) -> None:
        self.path = os.environ["DISTSCHED_TEST_HOOKS_FILE"]
        self.tokens: dict[str, contextvars.Token[str]] = {}

    def _write(self, line: str) -> None:
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(line + "\n")

    def before_task(self, ctx: TaskContext) -> None:
        self.tokens[ctx.task_id] = request_id.set(f"req-{ctx.task_id}")
        self._write(f"before {ctx.task_id}")

    def after_task(self, ctx: TaskContext, outcome: RunOutcome, result_or_error: Any) -> None:
        request_id.reset(self.tokens.pop(ctx.task_id))
        self._write(f"after {ctx.task_id} {outcome} {result_or_error}")


class ExportSpansToFile:
    """Sets the global OpenTelemetry tracer provider up to write each span's name and
    parent to the file named by ``DISTSCHED_TEST_SPANS_FILE`` (for ``--otel``)."""

    def __init__(self) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

        def line(span: ReadableSpan) -> str:
            parent = f"{span.parent.span_id:016x}" if span.parent else "-"
            return f"{span.name} {parent}\n"

        out = open(os.environ["DISTSCHED_TEST_SPANS_FILE"], "a", encoding="utf-8")  # noqa: SIM115
        provider = TracerProvider()
        provider.add_span_processor(
            SimpleSpanProcessor(ConsoleSpanExporter(out=out, formatter=line))
        )
        trace.set_tracer_provider(provider)

    def before_task(self, ctx: TaskContext) -> None:
        """Nothing per run: the set-up is all."""
