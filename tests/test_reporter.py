"""A worker never drops an outcome it has not seen applied or answered stale (§8)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import ClassVar

import pytest
import redis

from distsched import Claim, Outcome, Scheduler, State, Worker
from distsched.errors import ScriptError
from distsched.keys import Keys
from distsched.worker.link import WorkerLink
from tests.cluster_fixtures import wait_until
from tests.conftest import RedisServer, running


def test_an_outcome_redis_refuses_is_sent_again_until_applied_not_dropped(
    own_redis: RedisServer, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis refuses the completion (an ACL that lets the worker claim and heartbeat
    but not complete: not a passing fault of the connection): it is logged, kept and
    sent again until Redis takes it."""
    admin = own_redis.client()
    keys = Keys(namespace)
    claim_keys = [f"~{key}" for key in {*keys.for_script("claim"), *keys.for_script("heartbeat")}]
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "app", "reset", "on", ">pw", *claim_keys, "&*", "+@all"
    )  # fmt: skip
    setup = Scheduler.from_url(own_redis.url, namespace=namespace)
    setup.schedule("job", fn="wait")
    url = own_redis.url.replace("redis://", "redis://app:pw@")
    s = Scheduler.from_url(url, namespace=namespace, lease_s=10.0)
    release = threading.Event()
    worker = Worker(s, {"wait": lambda: release.wait(30)}, concurrency=1)
    try:
        with caplog.at_level(logging.ERROR, "distsched.worker"), running(worker):
            wait_until(lambda: worker.running == 1, 10, "the function to start")
            release.set()
            wait_until(
                lambda: any("refused" in r.getMessage() for r in caplog.records), 10,
                "the refusal to be logged",
            )  # fmt: skip
            time.sleep(1.0)  # a few more refusals
            assert worker.snapshot()["reporting"] == 1
            assert setup.status("job").state is State.RUNNING
            admin.execute_command("ACL", "SETUSER", "app", "allkeys")  # type: ignore[no-untyped-call]
            wait_until(lambda: setup.status("job").state is State.SUCCEEDED, 30, "the completion")
        info = setup.status("job")
        assert (info.state, info.attempt, info.result) == (State.SUCCEEDED, 1, True)
        assert worker.counts["succeeded"] == 1
    finally:
        s.close()
        setup.close()
        admin.close()


class RefusingLink(WorkerLink):
    """Refuses every completion batch that holds a task named in ``refused``."""

    refused: ClassVar[set[str]] = set()

    def complete_encoded(self, reports: Sequence[tuple[Claim, bytes]]) -> list[Outcome]:
        bad = [c.task_id for c, _ in reports if c.task_id in self.refused]
        if bad:
            raise ScriptError(f"CORRUPT task record of {bad[0]}")
        return super().complete_encoded(reports)


class RefusingWorker(Worker):
    link_class = RefusingLink


def test_one_refused_report_does_not_hold_back_the_others_and_is_applied_once_accepted(
    redis_server: RedisServer, namespace: str
) -> None:
    s = Scheduler(redis.Redis.from_url(redis_server.url), namespace=namespace, lease_s=10.0)
    RefusingLink.refused = {"bad"}
    ids = ["bad", *(f"good{i}" for i in range(6))]
    for task_id in ids:
        s.schedule(task_id, fn="f")
    worker = RefusingWorker(s, {"f": lambda: None}, concurrency=len(ids))
    try:
        with running(worker):
            wait_until(
                lambda: all(s.status(i).state is State.SUCCEEDED for i in ids[1:]), 20,
                "the other completions",
            )  # fmt: skip
            assert s.status("bad").state is State.RUNNING
            RefusingLink.refused = set()
            wait_until(lambda: s.status("bad").state is State.SUCCEEDED, 60, "the refused one")
        assert worker.counts["succeeded"] == len(ids)
        assert all(s.status(i).attempt == 1 for i in ids)
    finally:
        RefusingLink.refused = set()
        s.close()
        s.client.close()  # given to the scheduler, so not closed by it


def test_a_shutdown_while_redis_is_away_ends_in_bounded_time_and_logs_the_unsent_outcome(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer()
    s = Scheduler.from_url(server.url, namespace=namespace, lease_s=10.0)
    release = threading.Event()
    s.schedule("job", fn="wait")
    worker = Worker(s, {"wait": lambda: release.wait(30)}, concurrency=1, grace=1, cancel_wait=0)
    thread = threading.Thread(target=worker.run)
    try:
        with caplog.at_level(logging.ERROR, "distsched.worker"):
            thread.start()
            wait_until(lambda: worker.running == 1, 10, "the function to start")
            server.kill()
            release.set()
            wait_until(lambda: worker.snapshot()["reporting"] == 1, 10, "the report to wait")
            worker.stop()
            thread.join(60)
            assert not thread.is_alive(), "the worker did not end while Redis was away"
        assert any("was not reported" in r.getMessage() and "'job'" in r.getMessage()
                   for r in caplog.records)  # fmt: skip
        assert worker.counts["succeeded"] == 0
    finally:
        release.set()
        thread.join(5)
        s.close()
        server.close()
