"""OpenTelemetry tracing (``pip install 'distsched[otel]'``).

- Producers: when ``opentelemetry-api`` is importable and a span is active where
  ``schedule``/``submit``/``schedule_many``/``submit_graph`` is called, the span's W3C
  trace context (``traceparent``, and ``tracestate`` when set) travels in the task's
  payload (the optional ``trace`` field, ``lua/README.md``). Nothing to switch on;
  without the package, or without an active span, payloads are as before.
- Workers: :class:`TracingHooks` opens one span per run, ``distsched.run <fn>``, as a
  child of the producer's span (a root span when the task carries no context), with the
  attributes ``distsched.task_id``, ``distsched.fn``, ``distsched.version``,
  ``distsched.attempt`` and ``distsched.outcome``; a failed run records its exception
  and sets the span's status to error. It is switched on explicitly:
  ``Worker(..., hooks=[TracingHooks()])`` or ``distsched worker --otel``. The span is
  the current span while the function runs, so spans the function opens are its
  children. Spans go to the tracer provider you configure (the global one by default,
  e.g. set up by ``opentelemetry-instrument`` or in a ``--hooks`` module).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from distsched.context import TaskContext
from distsched.errors import DistschedError
from distsched.hooks import RunOutcome, WorkerHooks
from distsched.version import __version__

INSTALL_HINT = "pip install 'distsched[otel]'"
SPAN_PREFIX = "distsched.run "


class TracingUnavailable(DistschedError):
    """opentelemetry-api is not installed."""


_api: Any = None  # the opentelemetry modules once imported, False when missing


def _opentelemetry() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import context, trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            _api = False
        else:
            _api = (context, trace, TraceContextTextMapPropagator())
    return _api


def current_trace() -> dict[str, str] | None:
    """The W3C trace context of the span active here, or None (no span, or no
    opentelemetry-api)."""
    api = _opentelemetry()
    if not api:
        return None
    _, trace, propagator = api
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    return carrier or None


class TracingHooks(WorkerHooks):
    """A span per run of a task function (see the module's text).

    ``tracer_provider``: where spans go (default: the global provider).
    """

    def __init__(self, tracer_provider: Any = None) -> None:
        api = _opentelemetry()
        if not api:
            raise TracingUnavailable(f"tracing needs the opentelemetry-api package: {INSTALL_HINT}")
        self._context, self._trace, self._propagator = api
        self._tracer = self._trace.get_tracer(
            "distsched", __version__, tracer_provider=tracer_provider
        )
        self._runs: dict[int, tuple[Any, object]] = {}
        self._lock = threading.Lock()

    def before_task(self, ctx: TaskContext) -> None:
        claim = ctx.claim
        parent = self._propagator.extract(dict(claim.trace or {}))
        span = self._tracer.start_span(
            SPAN_PREFIX + claim.fn,
            context=parent,
            kind=self._trace.SpanKind.CONSUMER,
            attributes=run_attributes(ctx),
        )
        # Current while the function runs: on its thread, or in its asyncio task.
        token = self._context.attach(self._trace.set_span_in_context(span))
        with self._lock:
            self._runs[id(ctx)] = (span, token)

    def after_task(self, ctx: TaskContext, outcome: RunOutcome, result_or_error: Any) -> None:
        with self._lock:
            run = self._runs.pop(id(ctx), None)
        if run is None:
            return
        span, token = run
        try:
            span.set_attribute("distsched.outcome", outcome.value)
            if outcome is RunOutcome.FAILED and isinstance(result_or_error, BaseException):
                span.record_exception(result_or_error)
                span.set_status(
                    self._trace.Status(
                        self._trace.StatusCode.ERROR,
                        f"{type(result_or_error).__name__}: {result_or_error}",
                    )
                )
            span.end()
        finally:
            self._context.detach(token)


def run_attributes(ctx: TaskContext) -> Mapping[str, Any]:
    claim = ctx.claim
    return {
        "distsched.task_id": claim.task_id,
        "distsched.fn": claim.fn,
        "distsched.version": claim.version,
        "distsched.attempt": claim.attempt,
    }
