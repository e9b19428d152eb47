"""OpenTelemetry: the producer's trace context travels in the payload, and the worker's
``TracingHooks`` opens a span per run as its child (checked with the SDK's in-memory
exporter, against real workers)."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

from distsched import Scheduler, TaskSpec, Worker
from distsched.aio import AsyncScheduler
from distsched.errors import TaskFailed
from distsched.otel import TracingHooks, current_trace
from distsched.wire import payload
from tests.conftest import CLI_COMMAND, require_extra, running, stored_payload, subprocess_env

require_extra("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    yield exported
    exported.clear()


# The provider of the current test, for the spans the task functions open.
PROVIDERS: list[TracerProvider] = []


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    PROVIDERS.append(tracer_provider)
    yield tracer_provider
    PROVIDERS.remove(tracer_provider)


def app_tracer() -> trace.Tracer:
    return PROVIDERS[-1].get_tracer("app")


def inner_work(x: int) -> int:
    # A span the function opens is a child of the run's span.
    with app_tracer().start_as_current_span("inner"):
        return x + 1


async def inner_work_async(x: int) -> int:
    with app_tracer().start_as_current_span("inner"):
        return x + 2


def broken() -> None:
    raise KeyError("missing row")


FUNCS: dict[str, Callable[..., Any]] = {
    "work": inner_work,
    "work_async": inner_work_async,
    "broken": broken,
}


def payload_map(client: redis.Redis, s: Scheduler, task_id: str) -> dict[str, Any]:
    raw = stored_payload(client, s.keys, task_id)
    assert isinstance(raw, bytes)
    data: dict[str, Any] = msgpack.unpackb(raw, raw=False)
    return data


def run_spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def test_a_producer_span_travels_in_the_payload_as_w3c_trace_context(
    scheduler: Scheduler, redis_client: redis.Redis, provider: TracerProvider
) -> None:
    with provider.get_tracer("producer").start_as_current_span("enqueue") as span:
        scheduler.schedule("a", fn="work", args=[1])
        expected = current_trace()
    context = span.get_span_context()
    carried = payload_map(redis_client, scheduler, "a")["trace"]
    assert carried == expected
    assert carried["traceparent"] == (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    )


def test_without_an_active_span_the_payload_is_unchanged(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    scheduler.schedule("a", fn="work", args=[1])
    assert current_trace() is None
    assert stored_payload(redis_client, scheduler.keys, "a") == payload.encode_payload(
        "work", [1], {}
    )


def test_the_worker_span_is_a_child_of_the_producer_span_with_the_run_attributes(
    scheduler: Scheduler, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    with provider.get_tracer("producer").start_as_current_span("enqueue") as producer:
        scheduler.schedule("a", fn="work", args=[1])
    worker = Worker(scheduler, FUNCS, hooks=[TracingHooks(tracer_provider=provider)])
    with running(worker):
        assert scheduler.result("a", timeout=10) == 2
    (span,) = run_spans(exporter, "distsched.run work")
    assert span.parent is not None
    assert span.parent.span_id == producer.get_span_context().span_id
    assert span.context.trace_id == producer.get_span_context().trace_id
    assert span.kind is SpanKind.CONSUMER
    assert dict(span.attributes or {}) == {
        "distsched.task_id": "a",
        "distsched.fn": "work",
        "distsched.version": scheduler.status("a").version,
        "distsched.attempt": 1,
        "distsched.outcome": "succeeded",
    }
    # The function's own span is the run span's child.
    (inner,) = run_spans(exporter, "inner")
    assert inner.parent is not None and inner.parent.span_id == span.context.span_id


def test_an_async_function_runs_inside_its_span_too(
    scheduler: Scheduler, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    scheduler.schedule("a", fn="work_async", args=[1])
    with running(Worker(scheduler, FUNCS, hooks=[TracingHooks(tracer_provider=provider)])):
        assert scheduler.result("a", timeout=10) == 3
    (span,) = run_spans(exporter, "distsched.run work_async")
    (inner,) = run_spans(exporter, "inner")
    assert inner.parent is not None and inner.parent.span_id == span.context.span_id
    # No producer context: the run's span is a root.
    assert span.parent is None


def test_a_failed_run_records_its_exception_and_an_error_status(
    scheduler: Scheduler, provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    scheduler.schedule("a", fn="broken", max_attempts=2, backoff=0)
    with (
        running(Worker(scheduler, FUNCS, hooks=[TracingHooks(tracer_provider=provider)])),
        pytest.raises(TaskFailed),
    ):
        scheduler.result("a", timeout=10)
    spans = run_spans(exporter, "distsched.run broken")
    assert [(s.attributes or {})["distsched.attempt"] for s in spans] == [1, 2]
    for span in spans:
        assert (span.attributes or {})["distsched.outcome"] == "failed"
        assert span.status.status_code is StatusCode.ERROR
        (event,) = span.events
        assert event.name == "exception"
        assert (event.attributes or {})["exception.type"] == "KeyError"


def test_a_trace_field_that_is_not_a_map_of_strings_is_ignored() -> None:
    raw = msgpack.packb({"fn": "f", "trace": {"traceparent": 5}})
    assert payload.decode_payload_trace(raw) == ("f", (), {}, None)
    raw = msgpack.packb({"fn": "f", "trace": {"traceparent": "00-ab-cd-01"}})
    assert payload.decode_payload_trace(raw)[3] == {"traceparent": "00-ab-cd-01"}


def test_distsched_worker_otel_traces_runs_to_the_configured_provider(
    redis_server: Any,
    namespace: str,
    scheduler: Scheduler,
    provider: TracerProvider,
    tmp_path: Path,
) -> None:
    spans = tmp_path / "spans.txt"
    with provider.get_tracer("producer").start_as_current_span("enqueue") as producer:
        scheduler.schedule("a", fn="seen")
    env = subprocess_env(DISTSCHED_TEST_SPANS_FILE=str(spans))
    proc = subprocess.Popen(
        [
            *CLI_COMMAND, "--redis", redis_server.url, "--namespace", namespace, "worker",
            "tests.hooks_app:FUNCS", "--hooks", "tests.hooks_app:ExportSpansToFile", "--otel",
        ],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        scheduler.wait("a", timeout=30)
    finally:
        proc.terminate()
        proc.wait(30)
    assert spans.read_text().splitlines() == [
        f"distsched.run seen {producer.get_span_context().span_id:016x}"
    ]


def test_an_asyncio_producer_sends_the_span_of_its_own_task(
    redis_server: Any, namespace: str, redis_client: redis.Redis, provider: TracerProvider
) -> None:
    async def story() -> tuple[int, int]:
        async with AsyncScheduler.from_url(redis_server.url, namespace=namespace) as a:
            with provider.get_tracer("producer").start_as_current_span("enqueue") as span:
                await a.submit_graph([TaskSpec("a", "f"), TaskSpec("b", "f", deps=["a"])])
            await a.schedule("untraced", fn="f")
            return span.get_span_context().span_id, span.get_span_context().trace_id

    span_id, trace_id = asyncio.run(story())
    s = Scheduler(redis_client, namespace=namespace)
    for task_id in ("a", "b"):
        parent = payload_map(redis_client, s, task_id)["trace"]["traceparent"]
        assert parent.split("-")[1:3] == [f"{trace_id:032x}", f"{span_id:016x}"]
    assert "trace" not in payload_map(redis_client, s, "untraced")
