"""A worker's work in flight is bounded: a finished task whose outcome is not sent yet
keeps its lease, and past ``max_unsent`` of them the worker stops claiming, so a stalled
reporter or log sink never lets it hoard the namespace; logging never blocks it."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import redis

from distsched import Claim, Outcome, Scheduler, State, TaskSpec, Worker, current_task
from distsched.worker.link import WorkerLink
from distsched.worker.logs import LOG_QUEUE_MAX, NonBlockingHandler
from tests.conftest import CLI_COMMAND, REPO_ROOT, RedisServer, running, subprocess_env

# Every tenth task fails its first attempt (and succeeds on its retry).
FAIL_EVERY = 10
# A long error: every failure writes a few kB to the log, which fills a pipe quickly.
ERROR_PAD = "x" * 4000


def work(i: int, runs_file: str | None = None) -> int:
    """A task of the steady load: the first attempt of every tenth one raises."""
    ctx = current_task()
    if runs_file is not None:
        with open(runs_file, "a") as runs:
            runs.write(f"{ctx.task_id}\n")
    if i % FAIL_EVERY == 0 and ctx.attempt == 1:
        raise RuntimeError(f"first attempt of {i} fails {ERROR_PAD}")
    return i


# The app of the worker command (``distsched worker tests.test_inflight_bound:FUNCS``).
FUNCS = {"work": work}


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.02)


class Load:
    """A producer thread scheduling ``per_batch`` tasks every ``every`` seconds."""

    def __init__(
        self, url: str, namespace: str, per_batch: int = 10, every: float = 0.05,
        runs_file: str | None = None,
    ) -> None:  # fmt: skip
        self.scheduler = Scheduler.from_url(url, namespace=namespace)
        self.per_batch = per_batch
        self.every = every
        self.runs_file = runs_file
        self.ids: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-load", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = len(self.ids)
            batch = [
                TaskSpec(f"t{i}", fn="work", args=[i, self.runs_file], max_attempts=2, backoff=0)
                for i in range(start, start + self.per_batch)
            ]
            self.scheduler.schedule_many(batch)
            self.ids.extend(spec.task_id for spec in batch)
            self._stop.wait(self.every)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.scheduler.close()

    def all_succeeded(self) -> bool:
        return self.scheduler.stats()["counts"]["succeeded"] == len(self.ids)

    def check_each_ran_as_often_as_it_should(self, runs: Counter[str]) -> None:
        """Every task succeeded; one that failed its first attempt ran twice, every other
        once: nothing was run again because a lease lapsed while its report waited."""
        expected = {t: 2 if int(t[1:]) % FAIL_EVERY == 0 else 1 for t in self.ids}
        infos = {t: self.scheduler.status(t) for t in self.ids}
        assert {t: info.state for t, info in infos.items()} == dict.fromkeys(
            self.ids, State.SUCCEEDED
        )
        assert {t: info.attempt for t, info in infos.items()} == expected
        assert dict(runs) == expected


class Gate(logging.Handler):
    """A log sink that blocks every WARNING-or-worse record until it is opened."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.opened = threading.Event()
        self.blocking = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if not self.opened.is_set():
            self.blocking.set()
            self.opened.wait(60)


@pytest.fixture
def gate() -> Iterator[Gate]:
    """A blocking sink on the worker's logger, as a library user may have configured."""
    logger = logging.getLogger("distsched.worker")
    handler = Gate()
    level = logger.level
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    yield handler
    handler.opened.set()
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_a_reporter_stalled_by_its_log_sink_holds_no_more_leases_than_the_bound_and_loses_nothing(
    redis_server: RedisServer, namespace: str, gate: Gate
) -> None:
    concurrency, max_unsent = 4, 6
    s = Scheduler.from_url(redis_server.url, namespace=namespace, lease_s=2.0)
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    def counted(i: int, runs_file: str | None = None) -> int:
        with lock:
            runs[current_task().task_id] += 1
        return work(i)

    worker = Worker(s, {"work": counted}, concurrency=concurrency, max_unsent=max_unsent)
    leases = redis.Redis.from_url(redis_server.url)
    try:
        with running(worker), Load(redis_server.url, namespace) as load:
            # The first failure's line blocks the reporter in the sink.
            wait_until(gate.blocking.is_set, 20, "the reporter to block on a log line")
            peak_leases = peak_held = 0
            # Over two leases long: a lease not extended meanwhile would lapse (and its
            # task run again), and the load keeps coming all along.
            stalled_until = time.monotonic() + 5.0
            while time.monotonic() < stalled_until:
                peak_leases = max(peak_leases, leases.zcard(s.keys.leases))
                pool = worker.snapshot()
                held = pool["executing"] + pool["unstarted"] + pool["reporting"]
                peak_held = max(peak_held, held)
                time.sleep(0.01)
            assert peak_leases <= concurrency + max_unsent
            assert peak_held <= concurrency + max_unsent
            # Not for want of work: many more tasks are due than the worker holds.
            queued = len(load.ids) - sum(runs.values())
            assert queued > 10 * (concurrency + max_unsent)
            assert worker.snapshot()["reporting"] >= max_unsent  # it stopped at the bound
            gate.opened.set()
            load.stop()
            wait_until(load.all_succeeded, 60, "every task to succeed once the sink drains")
            load.check_each_ran_as_often_as_it_should(runs)
            n, failed_first = len(load.ids), len(load.ids[::FAIL_EVERY])
        counts = worker.counts
        assert (counts["succeeded"], counts["failed"]) == (n, failed_first)
        assert (counts["stale"], counts["duplicate"]) == (0, 0)
    finally:
        leases.close()
        s.close()


class FailingReports(Scheduler):
    """Claims and heartbeats go through; every report call fails while ``down`` is set."""

    down = threading.Event()

    def fail_many(self, reports: Sequence[tuple[Claim, object]]) -> list[Outcome]:
        if self.down.is_set():
            raise redis.ConnectionError("reports cut off")
        return super().fail_many(reports)


class FailingCompletions(WorkerLink):
    """Completions fail with the other reports of a ``FailingReports`` scheduler."""

    def complete_encoded(self, reports: Sequence[tuple[Claim, bytes]]) -> list[Outcome]:
        s = self.scheduler
        if isinstance(s, FailingReports) and s.down.is_set():
            raise redis.ConnectionError("reports cut off")
        return super().complete_encoded(reports)


class FailingReportsWorker(Worker):
    link_class = FailingCompletions


def test_report_calls_that_keep_failing_while_claims_succeed_hold_no_more_than_the_bound(
    redis_server: RedisServer, namespace: str
) -> None:
    concurrency, max_unsent = 4, 6
    s = FailingReports(redis.Redis.from_url(redis_server.url), namespace=namespace, lease_s=2.0)
    s.down = threading.Event()
    s.down.set()
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    def counted(i: int, runs_file: str | None = None) -> int:
        with lock:
            runs[current_task().task_id] += 1
        return work(i)

    worker = FailingReportsWorker(
        s, {"work": counted}, concurrency=concurrency, max_unsent=max_unsent
    )
    try:
        with running(worker), Load(redis_server.url, namespace) as load:
            peak_leases = 0
            until = time.monotonic() + 5.0  # over two leases long
            while time.monotonic() < until:
                peak_leases = max(peak_leases, s.client.zcard(s.keys.leases))
                time.sleep(0.01)
            assert peak_leases <= concurrency + max_unsent
            assert sum(runs.values()) <= concurrency + max_unsent
            assert len(load.ids) > 10 * (concurrency + max_unsent)
            s.down.clear()
            load.stop()
            wait_until(load.all_succeeded, 60, "every task to succeed once reports go through")
            load.check_each_ran_as_often_as_it_should(runs)
        assert (worker.counts["stale"], worker.counts["duplicate"]) == (0, 0)
    finally:
        s.close()
        s.client.close()  # given to the scheduler, so not closed by it


def test_a_worker_whose_stderr_nobody_reads_keeps_draining_within_the_bound_and_counts_drops(
    own_redis: RedisServer, namespace: str, tmp_path: Path
) -> None:
    """The fault as it happened: ``distsched worker`` with its stderr a pipe nobody
    reads, a steady load, one first attempt in ten failing with a long error."""
    concurrency, max_unsent = 8, 16
    runs_file = tmp_path / "runs"
    runs_file.touch()
    env = subprocess_env(DISTSCHED_REDIS_URL=own_redis.url, DISTSCHED_NAMESPACE=namespace)
    proc = subprocess.Popen(
        [*CLI_COMMAND, "worker", "tests.test_inflight_bound:FUNCS", "--concurrency",
         str(concurrency), "--max-unsent", str(max_unsent), "--lease", "2s", "--grace", "2s",
         "--log-level", "DEBUG"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    s = Scheduler.from_url(own_redis.url, namespace=namespace)
    try:
        with Load(own_redis.url, namespace, per_batch=25, runs_file=str(runs_file)) as load:
            peak_leases = 0
            # A pipe holds 64 kB: a few hundred failures of a few kB each fill it many
            # times over, and a line per success (DEBUG) the log queue; the worker must
            # keep going all the same.
            until = time.monotonic() + 8.0
            while time.monotonic() < until:
                peak_leases = max(peak_leases, s.client.zcard(s.keys.leases))
                time.sleep(0.01)
            load.stop()
            assert len(load.ids[::FAIL_EVERY]) * len(ERROR_PAD) > 4 * 65536  # a 64 kB pipe
            assert len(load.ids) > 2 * LOG_QUEUE_MAX  # a DEBUG line each
            wait_until(load.all_succeeded, 60, "every task to succeed with stderr unread")
            assert peak_leases <= concurrency + max_unsent
            runs = Counter(runs_file.read_text().split())
            load.check_each_ran_as_often_as_it_should(runs)
        assert proc.stderr is not None
        proc.terminate()
        err = proc.stderr.read().decode()  # the sink drains at last
        assert proc.wait(30) == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
        s.close()
    drops = [line for line in err.splitlines() if "log records were dropped" in line]
    assert drops, err[-2000:]
    assert "WARNING distsched.worker.logs" in drops[0]
    # The stop summary is written; a last count of drops may follow it as the sink drains.
    assert [line for line in err.splitlines() if " stopped (" in line], err[-2000:]


class Blocked(logging.Handler):
    """A sink that takes records only once ``opened`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.entered.set()
        self.opened.wait(30)
        self.records.append(record)


def test_a_full_log_queue_drops_records_without_waiting_and_then_says_how_many() -> None:
    sink = Blocked()
    handler = NonBlockingHandler(sink, capacity=10)
    logger = logging.getLogger("distsched.test.inflight")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.warning("first %d", 0)
        wait_until(sink.entered.is_set, 10, "the sink to block on the first record")
        done = threading.Event()

        def flood() -> None:
            for i in range(1, 26):  # 10 fit in the queue, 15 do not
                logger.warning("record %d", i)
            done.set()

        threading.Thread(target=flood, daemon=True).start()
        # Logging returns while the sink stays blocked: nothing waits for it.
        assert done.wait(10), "logging blocked on a stalled sink"
        assert handler.dropped == 15
        sink.opened.set()
        handler.flush()
        messages = [r.getMessage() for r in sink.records]
        assert messages[:11] == ["first 0", *(f"record {i}" for i in range(1, 11))]
        assert messages[11:] == [
            "15 log records were dropped: the log output did not keep up "
            "(15 dropped since the start; at most 10 wait to be written)"
        ]
        assert sink.records[11].levelno == logging.WARNING
        assert sink.records[11].name == "distsched.worker.logs"
    finally:
        sink.opened.set()
        logger.removeHandler(handler)
        logger.propagate = True
        handler.close()


def test_a_record_keeps_its_task_fields_and_traceback_through_the_queue() -> None:
    sink = Blocked()
    sink.opened.set()
    handler = NonBlockingHandler(sink)
    logger = logging.getLogger("distsched.test.inflight.fields")
    logger.propagate = False
    logger.addHandler(handler)
    try:
        items = ["a"]
        try:
            raise ValueError("bad row 7")
        except ValueError:
            logger.exception("task %r failed", items, extra={"task_id": "t", "attempt": 2})
        items.append("changed later")  # the message was made when it was logged
        handler.flush()
        (record,) = sink.records
        assert record.getMessage() == "task ['a'] failed"
        assert (record.task_id, record.attempt) == ("t", 2)  # type: ignore[attr-defined]
        assert record.exc_info is None and record.exc_text is not None
        assert record.exc_text.startswith("Traceback")
        assert "ValueError: bad row 7" in record.exc_text
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        handler.close()


def test_max_unsent_must_be_an_int_of_at_least_zero(scheduler: Scheduler) -> None:
    from distsched.errors import InvalidArgument

    for bad in (-1, 1.5, True, "8"):
        with pytest.raises(InvalidArgument, match="max_unsent"):
            Worker(scheduler, {"work": work}, max_unsent=bad)  # type: ignore[arg-type]
    assert Worker(scheduler, {"work": work}, concurrency=3).max_unsent == 6
    assert Worker(scheduler, {"work": work}, max_unsent=0).max_unsent == 0
