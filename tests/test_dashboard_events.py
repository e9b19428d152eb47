"""The task page hears of progress and of the task's end from a stream of server-sent
events, pushed from the wait subscription rather than read from Redis on a timer."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from distsched import Scheduler
from distsched.model import Claim
from tests.conftest import require_extra

require_extra("starlette")
require_extra("jinja2")

from starlette.testclient import TestClient  # noqa: E402

from distsched.dashboard import create_app  # noqa: E402

# Far longer than a push takes, far shorter than a renewed wait (30 s).
NOTICE_S = 10.0


def running(scheduler: Scheduler, task_id: str) -> Claim:
    scheduler.schedule(task_id, fn="f")
    claims, _ = scheduler.claim(1, "w1")
    assert [c.task_id for c in claims] == [task_id]
    return claims[0]


@contextmanager
def events_of(client: TestClient, task_id: str) -> Iterator[queue.Queue[str]]:
    """The stream's event names as they arrive ("closed" when it ends)."""
    got: queue.Queue[str] = queue.Queue()
    with client.stream("GET", "/api/task/events", params={"id": task_id}) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")

        def read() -> None:
            for line in reply.iter_lines():
                if line.startswith("event: "):
                    got.put(line[len("event: ") :])
                elif line.startswith("retry: "):
                    got.put("open")
            got.put("closed")

        reader = threading.Thread(target=read)
        reader.start()
        try:
            assert got.get(timeout=NOTICE_S) == "open"
            yield got
        finally:
            reader.join(NOTICE_S)


def test_the_stream_says_progress_at_each_report_and_ended_once_the_task_ends(
    scheduler: Scheduler,
) -> None:
    claim = running(scheduler, "encode")
    with TestClient(create_app(scheduler)) as client, events_of(client, "encode") as got:
        scheduler.report_progress(claim, 0.25, "a quarter")
        assert got.get(timeout=NOTICE_S) == "progress"
        # The watch is registered by now: this report arrives as a notice, within seconds.
        scheduler.report_progress(claim, 0.5, "half")
        assert got.get(timeout=NOTICE_S) == "progress"
        scheduler.complete(claim, "done")
        assert got.get(timeout=NOTICE_S) == "ended"
        assert got.get(timeout=NOTICE_S) == "closed"
        fields = client.get("/api/task", params={"id": "encode"}).json()["fields"]
        assert fields["state"] == "succeeded"


def test_a_stream_of_an_unknown_or_impossible_id_is_refused_before_it_opens(
    scheduler: Scheduler,
) -> None:
    with TestClient(create_app(scheduler)) as client:
        assert client.get("/api/task/events", params={"id": "nobody"}).status_code == 404
        assert client.get("/api/task/events", params={"id": ""}).status_code == 400


def test_streams_beyond_the_bound_are_refused_and_the_page_keeps_its_timed_refresh(
    scheduler: Scheduler,
) -> None:
    claim = running(scheduler, "long")
    app = create_app(scheduler)
    app.state.dashboard.notices.max_streams = 1
    with TestClient(app) as client, events_of(client, "long") as got:
        refused = client.get("/api/task/events", params={"id": "long"})
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "30"
        scheduler.complete(claim, None)
        assert got.get(timeout=NOTICE_S) == "ended"
    # The closed stream gave its place back.
    assert app.state.dashboard.notices.open_streams == 0


def test_only_the_page_of_a_task_not_ended_listens_for_notices(scheduler: Scheduler) -> None:
    claim = running(scheduler, "live")
    scheduler.schedule("later", fn="f", delay=3600)
    with TestClient(create_app(scheduler)) as client:
        for task_id in ("live", "later"):
            page = client.get("/task", params={"id": task_id}).text
            assert f'data-events="/api/task/events?id={task_id}"' in page
        scheduler.complete(claim, None)
        assert "data-events" not in client.get("/task", params={"id": "live"}).text
        scheduler.cancel("later")
