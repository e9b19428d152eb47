"""Dependencies on the command line (§7, §11, §12): ``submit``, ``graph`` and ``retry``."""

from __future__ import annotations

import json
import re

import pytest
import redis

from distsched import Claim, Scheduler, State, views
from distsched.errors import InvalidArgument
from distsched.model import TaskRow
from tests.conftest import RedisServer, namespace_keys
from tests.test_cli import assert_one_line_error, invoke


def run_all(scheduler: Scheduler, failing: tuple[str, ...] = ()) -> list[str]:
    """Claim every due task in queue order, failing those in ``failing``; the ids run."""
    ran: list[str] = []
    while isinstance(claim := scheduler.next("cli-test-worker"), Claim):
        ran.append(claim.task_id)
        if claim.task_id in failing:
            scheduler.fail(claim, f"{claim.task_id} exploded")
        else:
            scheduler.complete(claim, claim.task_id)
    return ran


def submit_ok(server: RedisServer, namespace: str, *args: str) -> int:
    result = invoke(server, namespace, "submit", *args)
    assert result.exit_code == 0, result.stderr
    return int(result.stdout.strip())


@pytest.fixture
def diamond(redis_server: RedisServer, namespace: str, scheduler: Scheduler) -> Scheduler:
    """a -> b, a -> c, (b, optional c) -> d, d -> e, submitted through the command line."""
    submit_ok(redis_server, namespace, "a", "--fn", "f")
    submit_ok(redis_server, namespace, "b", "--fn", "f", "--dep", "a")
    submit_ok(redis_server, namespace, "c", "--fn", "f", "--dep", "a")
    submit_ok(redis_server, namespace, "d", "--fn", "f", "--dep", "b", "--optional-dep", "c")
    submit_ok(redis_server, namespace, "e", "--fn", "f", "--dep", "d")
    return scheduler


@pytest.fixture
def blocked_branch(diamond: Scheduler) -> Scheduler:
    """The diamond after 'b' failed: 'd' and 'e' are blocked by it."""
    assert run_all(diamond, failing=("b",)) == ["a", "b", "c"]
    return diamond


def graph_json(server: RedisServer, namespace: str, task_id: str, *extra: str) -> dict:  # type: ignore[type-arg]
    result = invoke(server, namespace, "graph", task_id, "--json", *extra)
    assert result.exit_code == 0, result.stderr
    data: dict = json.loads(result.stdout)  # type: ignore[type-arg]
    return data


def edges_of(data: dict) -> set[tuple[str, str, bool]]:  # type: ignore[type-arg]
    return {(e["dependency"], e["dependent"], e["optional"]) for e in data["edges"]}


# --------------------------------------------------------------------------- submit


def test_submit_prints_the_version_and_stores_required_and_optional_deps(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    assert submit_ok(redis_server, namespace, "first", "--fn", "f") == 1
    assert submit_ok(redis_server, namespace, "maybe", "--fn", "f") == 2
    version = submit_ok(
        redis_server, namespace, "after", "--fn", "add", "--args", "[1, 2]",
        "--dep", "first", "--optional-dep", "maybe",
        "--priority", "3", "--max-attempts", "2", "--backoff", "0",
    )  # fmt: skip
    assert version == 3
    info = scheduler.status("after")
    assert (info.state, info.version) == (State.PENDING, 3)
    assert (info.deps, info.optional_deps) == (("first",), ("maybe",))
    assert (info.remaining, info.optional_remaining) == (1, 1)
    assert (info.fn, info.args, info.priority, info.max_attempts, info.backoff) == (
        "add", (1, 2), 3, 2, 0.0,
    )  # fmt: skip
    assert scheduler.status("first").dependents == ("after",)

    assert run_all(scheduler) == ["first", "maybe", "after"]
    assert scheduler.status("after").state is State.SUCCEEDED


def test_submit_after_dependencies_that_succeeded_is_ready_at_once(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    submit_ok(redis_server, namespace, "done", "--fn", "f")
    run_all(scheduler)
    submit_ok(redis_server, namespace, "next", "--fn", "f", "--dep", "done")
    assert scheduler.status("next").state is State.READY


def test_a_refused_cycle_prints_its_path_exits_1_and_writes_nothing(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str, scheduler: Scheduler
) -> None:
    submit_ok(redis_server, namespace, "x", "--fn", "f", "--dep", "z", "--allow-unknown")
    submit_ok(redis_server, namespace, "y", "--fn", "f", "--dep", "x")
    before = namespace_keys(redis_client, namespace)
    result = invoke(redis_server, namespace, "submit", "z", "--fn", "f", "--dep", "y")
    assert_one_line_error(result, "cycle: z -> x -> y -> z")
    assert namespace_keys(redis_client, namespace) == before
    assert scheduler.status("x").state is State.PENDING


def test_an_unknown_dependency_is_one_line_naming_it_and_writes_nothing(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str, scheduler: Scheduler
) -> None:
    submit_ok(redis_server, namespace, "known", "--fn", "f")
    before = namespace_keys(redis_client, namespace)
    result = invoke(
        redis_server, namespace, "submit", "t", "--fn", "f", "--dep", "known", "--dep", "ghost"
    )
    line = assert_one_line_error(result, "'ghost'", "--allow-unknown", namespace)
    assert "'known'" not in line
    assert namespace_keys(redis_client, namespace) == before


def test_allow_unknown_waits_for_a_dependency_submitted_later(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    submit_ok(redis_server, namespace, "t", "--fn", "f", "--dep", "later", "--allow-unknown")
    assert scheduler.status("t").state is State.PENDING
    text = invoke(redis_server, namespace, "graph", "t").stdout
    assert re.search(r"^\s+`-- later: not submitted yet$", text, re.M), text
    assert graph_json(redis_server, namespace, "t")["tasks"]["later"] is None

    submit_ok(redis_server, namespace, "later", "--fn", "f")
    assert run_all(scheduler) == ["later", "t"]


# --------------------------------------------------------------------------- graph


def test_graph_of_a_diamond_shows_ancestors_and_descendants_with_states(
    redis_server: RedisServer, namespace: str, diamond: Scheduler
) -> None:
    result = invoke(redis_server, namespace, "graph", "d")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    head = f"d in namespace '{namespace}', version 4"
    assert lines[0] == f"{head}: pending (waiting on 1 required, 1 optional)"
    up = lines[lines.index("depends on:") + 1 : lines.index("needed by:")]
    down = lines[lines.index("needed by:") + 1 :]
    assert up == [
        "  |-- b: pending (waiting on 1 required)",
        "  |   `-- a: ready",
        "  `-- c [optional]: pending (waiting on 1 required)",
        "      `-- a: ready (see above)",
    ]
    assert down == ["  `-- e: pending (waiting on 1 required)"]

    data = graph_json(redis_server, namespace, "d")
    assert data["task_id"] == "d"
    assert sorted(data["ancestors"]) == ["a", "b", "c"]
    assert data["descendants"] == ["e"]
    assert edges_of(data) == {
        ("a", "b", False), ("a", "c", False), ("b", "d", False), ("c", "d", True),
        ("d", "e", False),
    }  # fmt: skip
    assert data["tasks"]["d"]["state"] == "pending"
    assert data["tasks"]["a"]["state"] == "ready"
    assert data["truncated"] is False

    top = graph_json(redis_server, namespace, "a")
    assert top["ancestors"] == []
    assert sorted(top["descendants"]) == ["b", "c", "d", "e"]


def test_graph_of_a_blocked_branch_names_the_root_cause_and_path(
    redis_server: RedisServer, namespace: str, blocked_branch: Scheduler
) -> None:
    text = invoke(redis_server, namespace, "graph", "e").stdout
    assert text.splitlines()[0].endswith("blocked by b via b -> d -> e")
    assert "  `-- d: blocked by b via b -> d" in text.splitlines()
    assert "      |-- b: failed: b exploded" in text.splitlines()
    assert "      `-- c [optional]: succeeded" in text.splitlines()

    data = graph_json(redis_server, namespace, "e")
    assert data["tasks"]["e"]["blocked_by"] == {"root": "b", "path": ["b", "d", "e"]}
    assert data["tasks"]["d"]["blocked_by"] == {"root": "b", "path": ["b", "d"]}
    assert data["tasks"]["b"]["state"] == "failed"
    assert data["tasks"]["b"]["error"] == "b exploded"
    assert data["tasks"]["c"]["blocked_by"] is None


def test_graph_stops_after_the_limit_and_says_so(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    submit_ok(redis_server, namespace, "hub", "--fn", "f")
    for i in range(6):
        submit_ok(redis_server, namespace, f"leaf-{i}", "--fn", "f", "--dep", "hub")
    data = graph_json(redis_server, namespace, "hub", "--limit", "3")
    assert data["truncated"] is True
    assert len(data["tasks"]) == 3 and len(data["descendants"]) == 2
    text = invoke(redis_server, namespace, "graph", "hub", "--limit", "3").stdout
    assert "(stopped after 3 tasks; raise --limit to see more)" in text
    assert graph_json(redis_server, namespace, "hub")["truncated"] is False


def test_graph_terminates_on_a_loop_through_satisfied_dependencies(
    redis_server: RedisServer, namespace: str, scheduler: Scheduler
) -> None:
    # 'q' depended on 'p' when 'p' had already succeeded, so a new 'p' may depend on 'q':
    # nothing waits in a circle, but the stored lists do loop.
    submit_ok(redis_server, namespace, "p", "--fn", "f")
    run_all(scheduler)
    submit_ok(redis_server, namespace, "q", "--fn", "f", "--dep", "p")
    submit_ok(redis_server, namespace, "p", "--fn", "f", "--dep", "q")
    data = graph_json(redis_server, namespace, "p")
    assert (data["ancestors"], data["descendants"]) == (["q"], ["q"])
    text = invoke(redis_server, namespace, "graph", "p").stdout
    assert text.count("(see above)") == 2


def test_graph_of_an_unknown_id_is_a_one_line_error(
    redis_server: RedisServer, namespace: str
) -> None:
    assert_one_line_error(invoke(redis_server, namespace, "graph", "nobody"), "nobody", namespace)


def test_status_shows_dependencies_and_the_block_cause(
    redis_server: RedisServer, namespace: str, blocked_branch: Scheduler
) -> None:
    text = invoke(redis_server, namespace, "status", "d").stdout
    fields = dict(re.split(r":\s+", line, maxsplit=1) for line in text.splitlines())
    assert (fields["deps"], fields["optional_deps"], fields["dependents"]) == ("b", "c", "e")
    assert fields["blocked_by"] == "b via b -> d"
    data = json.loads(invoke(redis_server, namespace, "status", "e", "--json").stdout)
    assert data["blocked_by"] == {"root": "b", "path": ["b", "d", "e"]}
    assert data["deps"] == ["d"]


# --------------------------------------------------------------------------- retry


def test_retry_prints_the_new_version_and_state_and_cascades_to_what_it_blocked(
    redis_server: RedisServer, namespace: str, blocked_branch: Scheduler
) -> None:
    s = blocked_branch
    old = {t: s.status(t).version for t in ("d", "e")}
    result = invoke(redis_server, namespace, "retry", "b")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    match = re.fullmatch(r"retried 'b': version (\d+), ready", lines[0])
    assert match, lines[0]
    assert int(match.group(1)) == s.status("b").version
    assert lines[1] == "tasks it had blocked, retried with it:"
    assert sorted(lines[2:]) == sorted(
        f"  {t}: version {s.status(t).version}, pending (waiting on 1 required)" for t in ("d", "e")
    )
    for t in ("d", "e"):
        info = s.status(t)
        assert info.state is State.PENDING and info.version > old[t] and info.blocked_by is None
    assert run_all(s) == ["b", "d", "e"]


def test_retry_with_no_cascade_leaves_the_blocked_descendants_blocked(
    redis_server: RedisServer, namespace: str, blocked_branch: Scheduler
) -> None:
    s = blocked_branch
    before = {t: s.status(t) for t in ("d", "e")}
    result = invoke(redis_server, namespace, "retry", "b", "--no-cascade")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.fullmatch(r"retried 'b': version \d+, ready", lines[0]), lines[0]
    assert lines[1] == "tasks it had blocked, left blocked (--no-cascade):"
    assert "  e: version 5, blocked by b via b -> d -> e" in lines
    for t, info in before.items():
        now = s.status(t)
        assert (now.state, now.version, now.blocked_by) == (
            State.BLOCKED, info.version, info.blocked_by,
        )  # fmt: skip
    assert run_all(s) == ["b"]


def test_retry_of_a_task_that_did_not_end_badly_is_a_one_line_error_and_writes_nothing(
    redis_server: RedisServer, redis_client: redis.Redis, namespace: str, diamond: Scheduler
) -> None:
    before = namespace_keys(redis_client, namespace)
    assert_one_line_error(invoke(redis_server, namespace, "retry", "a"), "'a'", "ready")
    assert_one_line_error(invoke(redis_server, namespace, "retry", "d"), "'d'", "pending")
    assert_one_line_error(invoke(redis_server, namespace, "retry", "zz"), "zz", namespace)
    assert namespace_keys(redis_client, namespace) == before


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["submit", "t", "--fn", "f", "--dep", ""], "--dep"),
        (["submit", "t", "--fn", "f", "--dep", "t"], "--dep"),
        (["submit", "t", "--fn", "f", "--dep", "known", "--dep", "known"], "--dep"),
        (["submit", "t", "--fn", "f", "--optional-dep", ""], "--optional-dep"),
        (["submit", "t", "--fn", "f", "--dep", "known", "--optional-dep", "known"],
         "--optional-dep"),
        (["submit", "t", "--fn", "f", "--dep", "known", "--priority", "2147483648"],
         "--priority"),
        (["submit", "t", "--fn", "f", "--dep", "known", "--args", "{}"], "--args"),
        (["submit", "t", "--fn", "f", "--dep", "known", "--max-attempts", "0"], "--max-attempts"),
        (["submit", "t", "--fn", "", "--dep", "known"], "--fn"),
        (["submit", "", "--fn", "f", "--dep", "known"], "ID"),
        (["graph", "known", "--limit", "0"], "--limit"),
        (["graph", ""], "ID"),
        (["retry", ""], "ID"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_naming_the_field_and_writes_nothing(
    redis_server: RedisServer,
    redis_client: redis.Redis,
    namespace: str,
    scheduler: Scheduler,
    args: list[str],
    field: str,
) -> None:
    scheduler.schedule("known", fn="f", delay=60)
    before = namespace_keys(redis_client, namespace)
    assert_one_line_error(invoke(redis_server, namespace, *args), field)
    assert namespace_keys(redis_client, namespace) == before


# --------------------------------------------------------------------------- operator reads

# The scheduler methods that only read a namespace.
READS = {"status", "stats", "overview", "leases", "server_time", "scan_tasks", "exists"}


class Recorder:
    """A scheduler that notes the name of every method called on it."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler
        self.called: set[str] = set()

    def __getattr__(self, name: str) -> object:
        attribute = getattr(self._scheduler, name)
        if callable(attribute):
            self.called.add(name)
        return attribute


def test_the_operator_reads_call_only_scheduler_methods_that_read(
    blocked_branch: Scheduler, redis_client: redis.Redis, namespace: str
) -> None:
    blocked_branch.schedule("held", fn="f")
    assert isinstance(blocked_branch.next("holder"), Claim)
    before = namespace_keys(redis_client, namespace)
    recorder = Recorder(blocked_branch)
    s: Scheduler = recorder  # type: ignore[assignment]
    hood = views.walk(s, "e")
    assert views.render_text(hood) and views.render_json(hood)["tasks"]
    assert views.blocked_by(s, "b") == ["d", "e"]
    assert [info.task_id for info in views.lookup_many(s, ["a", "gone", "b"])] == ["a", "b"]
    assert [lease.task_id for lease in views.leases(s)] == ["held"]
    assert {row.task_id for row in views.tasks(s, count=2)} == {"a", "b", "c", "d", "e", "held"}
    assert recorder.called and recorder.called <= READS, recorder.called
    assert namespace_keys(redis_client, namespace) == before


def test_scan_tasks_lists_every_task_with_state_version_attempt_and_update_time(
    redis_server: RedisServer, namespace: str, blocked_branch: Scheduler
) -> None:
    s = blocked_branch
    now = s.server_time()
    rows: dict[str, TaskRow] = {}
    cursor, pages = 0, 0
    while True:
        cursor, page = s.scan_tasks(cursor, count=1)
        rows.update((row.task_id, row) for row in page)
        pages += 1
        if cursor == 0:
            break
    assert sorted(rows) == ["a", "b", "c", "d", "e"]
    for task_id, row in rows.items():
        info = s.status(task_id)
        assert (row.state, row.version, row.attempt) == (info.state, info.version, info.attempt)
        assert row.updated_at == info.updated_at
        assert now - 60 < row.updated_at <= now + 1
    assert rows["b"].state is State.FAILED and rows["e"].state is State.BLOCKED


@pytest.mark.parametrize(("cursor", "count"), [(-1, 10), (0, 0), (0, 1.5), ("0", 10)])
def test_scan_tasks_refuses_a_bad_cursor_or_count(
    scheduler: Scheduler, cursor: object, count: object
) -> None:
    with pytest.raises(InvalidArgument):
        scheduler.scan_tasks(cursor, count)  # type: ignore[arg-type]
