"""``distsched worker --processes N``: a supervisor keeps N worker processes running,
replaces one that dies, forwards SIGTERM for the ordered shutdown, and gives up on a
process that cannot start. Real processes, real redis-server."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from distsched import Scheduler, State, TaskSpec
from distsched.cli.worker import Processes
from distsched.errors import InvalidArgument
from distsched.worker.supervisor import EXIT_CRASHING
from tests.conftest import CliProcess, RedisServer
from tests.test_worker import wait_until
from tests.test_worker_shutdown import COMMAND

LEASE_S = 1.0


class Supervised(CliProcess):
    """``distsched worker APP --processes N`` with its stderr in a file."""

    def __init__(
        self, server: RedisServer, namespace: str, tmp: Path, app: str, processes: int,
        *extra: str,
    ) -> None:  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISTSCHED_")}
        super().__init__(
            tmp / f"supervisor-{time.monotonic_ns()}.err",
            [*COMMAND, "--redis", server.url, "--namespace", namespace, "worker", app,
             "--processes", str(processes), "--lease", str(LEASE_S), *extra],
            env,
        )  # fmt: skip


@pytest.fixture
def supervised(
    redis_server: RedisServer, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., Supervised]]:
    made: list[Supervised] = []

    def make(app: str, processes: int, *extra: str) -> Supervised:
        made.append(Supervised(redis_server, namespace, tmp_path, app, processes, *extra))
        return made[-1]

    yield make
    for sup in made:
        sup.close()


@pytest.fixture
def fast(scheduler: Scheduler) -> Iterator[Scheduler]:
    s = Scheduler(scheduler.client, namespace=scheduler.namespace, lease_s=LEASE_S)
    yield s
    s.close()


def worker_pids(s: Scheduler) -> set[int]:
    return {w.pid for w in s.workers()}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by the supervisor) counts as gone.
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] != "Z"


def test_a_worker_process_killed_under_load_is_replaced_and_no_task_is_lost(
    fast: Scheduler, supervised: Callable[..., Supervised]
) -> None:
    # Runs of 0.2 s keep each process's 4 slots busy whatever the machine's load: the
    # claim between two runs takes milliseconds, so the victim dies holding claims.
    ids = [f"job{i}" for i in range(150)]
    fast.schedule_many([TaskSpec(i, "work", args=[0.2], max_attempts=5) for i in ids])
    sup = supervised("tests.procs_app:FUNCS", 2, "--concurrency", "4", "--grace", "5")
    wait_until(lambda: len(worker_pids(fast)) == 2, 30, "two registered worker processes")
    first = worker_pids(fast)
    wait_until(lambda: fast.stats()["counts"]["succeeded"] >= 24, 30, "some tasks done")
    victim = min(first)
    os.kill(victim, signal.SIGKILL)

    # A new process takes the place of the killed one (a pid never seen before).
    wait_until(lambda: worker_pids(fast) - first, 30, f"a replacement in {sup.stderr()}")
    assert "killed by SIGKILL" in sup.stderr()
    wait_until(lambda: fast.stats()["counts"]["succeeded"] == len(ids), 60, "every task succeeded")
    # Exactly one acknowledged completion per task: the runs the killed process had
    # started ran again (their leases expired), and only one of each was recorded.
    lost = 0
    for task_id in ids:
        info = fast.status(task_id)
        assert info.state is State.SUCCEEDED
        outcomes = [a.outcome for a in info.attempts]
        assert outcomes.count("succeeded") == 1, (task_id, outcomes)
        lost += outcomes.count("lost")
    # The killed process held claims (4 slots, always busy): their leases expired.
    assert lost >= 1

    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0, sup.stderr()
    assert "every worker process stopped cleanly" in sup.stderr()
    assert not any(alive(pid) for pid in first | worker_pids(fast))


def test_sigterm_finishes_or_hands_back_every_task_and_the_supervisor_exits_0(
    fast: Scheduler, supervised: Callable[..., Supervised]
) -> None:
    long = [f"long{i}" for i in range(4)]
    quick = [f"quick{i}" for i in range(20)]
    fast.schedule_many([TaskSpec(i, "nap", args=[60]) for i in long])
    sup = supervised("tests.procs_app:FUNCS", 2, "--concurrency", "3", "--grace", "0.3")
    wait_until(
        lambda: fast.stats()["counts"]["running"] == 4, 30, f"4 long tasks in {sup.stderr()}"
    )
    fast.schedule_many([TaskSpec(i, "work", args=[0.01]) for i in quick])
    wait_until(lambda: fast.stats()["counts"]["succeeded"] == len(quick), 30, "quick tasks")
    pids = worker_pids(fast)
    assert len(pids) == 2

    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0, sup.stderr()
    err = sup.stderr()
    assert "SIGTERM: stopping 2 worker processes" in err
    # Each process heard the signal once (from the supervisor) and stopped in order.
    assert err.count("SIGTERM: stopping; no new tasks are claimed") == 2, err
    for task_id in long:
        info = fast.status(task_id)
        assert (info.state, info.attempt, info.lease_deadline) == (State.READY, 0, None)
    assert all(fast.status(i).state is State.SUCCEEDED for i in quick)
    # Each process knows its index among the supervisor's processes.
    results = [fast.status(i).result for i in quick]
    assert {index for _, index in results} <= {"0", "1"}
    assert {pid for pid, _ in results} <= pids
    assert fast.leases() == []
    assert fast.workers() == []  # each process left the worker registry
    assert not any(alive(pid) for pid in pids)


def test_a_worker_process_that_keeps_dying_at_start_is_restarted_with_backoff_then_given_up(
    supervised: Callable[..., Supervised],
) -> None:
    sup = supervised("tests.crash_app:FUNCS", 2)
    assert sup.proc.wait(60) == EXIT_CRASHING, sup.stderr()
    err = sup.stderr()
    # The pauses double between deaths in a row: 0.5, 1, 2, 4 s, then it gives up.
    for pause in ("0.5s", "1.0s", "2.0s", "4.0s"):
        assert f"starting another in {pause}" in err
    assert "exited with status 3 after" in err
    assert "5 quick deaths in a row, giving up" in err


def test_processes_is_a_count_or_auto() -> None:
    p = Processes()
    assert p.convert("3", None, None) == 3
    assert p.convert("auto", None, None) == (os.cpu_count() or 1)
    for bad in ("0", "-2", "many"):
        with pytest.raises(InvalidArgument, match="processes"):
            p.convert(bad, None, None)


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_the_worker_processes_stop_in_order_when_the_supervisor_is_killed(
    fast: Scheduler, supervised: Callable[..., Supervised]
) -> None:
    sup = supervised("tests.procs_app:FUNCS", 2, "--grace", "1")
    wait_until(lambda: len(worker_pids(fast)) == 2, 30, "two registered worker processes")
    pids = worker_pids(fast)
    sup.proc.kill()
    sup.proc.wait()
    # Each got SIGTERM: a clean stop, which takes it out of the worker registry.
    wait_until(lambda: fast.workers() == [], 30, "the processes' clean stops")
    wait_until(lambda: not any(alive(pid) for pid in pids), 30, "the processes' exits")


def test_a_second_sigint_makes_the_worker_processes_exit_at_once(
    fast: Scheduler, supervised: Callable[..., Supervised]
) -> None:
    sup = supervised("tests.procs_app:FUNCS", 2, "--grace", "30")
    fast.schedule("long", fn="nap", args=[60])
    wait_until(lambda: fast.progress("long") is not None, 30, "the long task's function running")
    pids = worker_pids(fast)
    sup.proc.send_signal(signal.SIGINT)
    wait_until(lambda: "SIGINT: stopping 2 worker processes" in sup.stderr(), 10, "the stop")
    assert sup.proc.poll() is None  # a process waits for its running task: grace 30 s
    sup.proc.send_signal(signal.SIGINT)
    assert sup.proc.wait(15) == 130, sup.stderr()
    assert "second SIGINT" in sup.stderr()
    # The running task is left to its lease, as if its worker had vanished.
    assert fast.status("long").state is State.RUNNING
    wait_until(lambda: not any(alive(pid) for pid in pids), 10, "the processes' exits")


def test_worker_processes_serve_every_namespace_given_with_serve_and_register_it(
    supervised: Callable[..., Supervised], fast: Scheduler
) -> None:
    other = Scheduler(fast.client, namespace=f"{fast.namespace}-reports", lease_s=LEASE_S)
    sup = supervised(
        "tests.procs_app:FUNCS", 2, "--serve", f"{fast.namespace}:3",
        "--serve", f"{other.namespace}:1",
    )  # fmt: skip
    try:
        for s in (fast, other):
            s.schedule_many([TaskSpec(f"t{i}", "work", args=[0.01]) for i in range(20)])
        for s in (fast, other):
            for i in range(20):
                assert s.wait(f"t{i}", timeout=30).state is State.SUCCEEDED
        entries = [w for s in (fast, other) for w in s.workers()]
        assert len(entries) == 4  # two processes, each in both namespaces
        assert {w.serves for w in entries} == {(f"{fast.namespace}:3", f"{other.namespace}:1")}
        assert len({w.worker_id for w in entries}) == 2
        sup.proc.send_signal(signal.SIGTERM)
        assert sup.proc.wait(30) == 0, sup.stderr()
    finally:
        other.close()


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--serve", "a:0"], "serve"),
        (["--serve", "a:x"], "serve"),
        (["--serve", "a b"], "namespace"),
        (["--strict"], "strict"),
    ],
)
def test_a_bad_serve_option_is_a_one_line_error_naming_it(
    redis_server: RedisServer, args: list[str], field: str
) -> None:
    from click.testing import CliRunner

    from distsched.cli import cli

    result = CliRunner().invoke(
        cli, ["--redis", redis_server.url, "worker", "tests.procs_app:FUNCS", *args]
    )
    assert result.exit_code != 0
    assert field in result.output and "Traceback" not in result.output, result.output
