"""Listing tasks by state (``Scheduler.tasks``) against a real redis-server.

Pending and terminal tasks are listed from the per-state index, newest first; ready
tasks from the queue in due order; running ones from the leases. A listing never scans
the namespace, pages with an opaque cursor, and an ``fn`` filter examines a bounded
number of entries per call.
"""

from __future__ import annotations

import time

import pytest
import redis

from distsched import Scheduler, State, TaskInfo, TaskSpec
from distsched.errors import InvalidArgument
from distsched.model import Claim


def ids(page_items: tuple[object, ...]) -> list[str]:
    return [item.task_id for item in page_items]  # type: ignore[attr-defined]


def every_page(api: Scheduler, state: str, limit: int, fn: str | None = None) -> list[str]:
    """Every task id of a listing, page by page."""
    out: list[str] = []
    cursor: str | None = None
    for _ in range(1000):
        page = api.tasks(state, fn=fn, limit=limit, cursor=cursor)
        out += ids(page.items)
        cursor = page.cursor
        if cursor is None:
            return out
    raise AssertionError("the listing never ended")


def listing_matches(s: Scheduler, expected: dict[State, set[str]]) -> None:
    """Every state's listing, read two at a time, holds exactly the ``expected`` ids
    (once each); pending and terminal ones newest first (ties by id), running ones by
    lease deadline. Shared with the state machines."""
    for state in State:
        items: list[TaskInfo] = []
        cursor: str | None = None
        while True:
            page = s.tasks(state, limit=2, cursor=cursor)
            items += page.items
            cursor = page.cursor
            if cursor is None:
                break
        listed = [info.task_id for info in items]
        assert len(listed) == len(set(listed)), (state, listed)
        assert set(listed) == expected.get(state, set()), state
        assert all(info.state is state for info in items)
        if state not in (State.READY, State.RUNNING):
            keys = [(-round(info.updated_at * 1000), info.task_id) for info in items]
            assert keys == sorted(keys), state
        if state is State.RUNNING:
            deadlines = [info.lease_deadline or 0.0 for info in items]
            assert deadlines == sorted(deadlines)


def claim_all(api: Scheduler, n: int) -> list[Claim]:
    return api.ready(n, "w1")


def test_failed_tasks_are_listed_newest_first_with_their_details(api: Scheduler) -> None:
    for i in range(3):
        api.schedule(f"t{i}", fn="boom", args=[i])
        (claim,) = claim_all(api, 1)
        api.fail(claim, RuntimeError(f"bad {i}"))
        time.sleep(0.003)
    page = api.tasks("failed")
    assert ids(page.items) == ["t2", "t1", "t0"]
    assert page.cursor is None
    first = page.items[0]
    assert first.state is State.FAILED
    assert first.fn == "boom" and first.args == (2,)
    assert first.error is not None and "bad 2" in first.error


def test_each_state_lists_exactly_its_tasks(api: Scheduler) -> None:
    api.schedule("dep", fn="f", delay=3600)
    api.schedule("waiting", fn="f", deps=["dep"])
    api.schedule("r1", fn="f")
    api.schedule("r2", fn="f")
    api.schedule("c", fn="f", delay=3600)
    api.cancel("c")
    (claim,) = claim_all(api, 1)
    assert claim.task_id == "r1"
    assert ids(api.tasks(State.PENDING).items) == ["waiting"]
    assert ids(api.tasks("ready").items) == ["r2", "dep"]
    assert ids(api.tasks("running").items) == ["r1"]
    assert api.tasks("running").items[0].lease_deadline is not None
    assert ids(api.tasks("cancelled").items) == ["c"]
    api.complete(claim, 5)
    assert ids(api.tasks("succeeded").items) == ["r1"]
    assert api.tasks("succeeded").items[0].result == 5
    assert ids(api.tasks("running").items) == []
    api.cancel("dep")
    api.settle()
    assert ids(api.tasks("blocked").items) == ["waiting"]
    assert ids(api.tasks("pending").items) == []
    assert sorted(ids(api.tasks("cancelled").items)) == ["c", "dep"]


def test_a_retried_task_leaves_the_failed_listing(api: Scheduler) -> None:
    api.schedule("t", fn="f")
    (claim,) = claim_all(api, 1)
    api.fail(claim, "no")
    assert ids(api.tasks("failed").items) == ["t"]
    api.retry("t")
    assert ids(api.tasks("failed").items) == []
    assert ids(api.tasks("ready").items) == ["t"]


def test_a_purged_task_leaves_the_index(api: Scheduler) -> None:
    api.schedule("t", fn="f")
    api.cancel("t")
    api.set_retention(0)
    api.purge()
    assert ids(api.tasks("cancelled").items) == []


@pytest.mark.parametrize("state", ["cancelled", "ready"])
def test_paging_returns_each_task_once(api: Scheduler, state: str) -> None:
    for i in range(23):
        api.schedule(f"t{i:02}", fn="f", delay=i)
        if state == "cancelled":
            api.cancel(f"t{i:02}")
    listed = every_page(api, state, limit=5)
    assert sorted(listed) == [f"t{i:02}" for i in range(23)]
    assert len(listed) == 23
    if state == "ready":
        assert listed == [f"t{i:02}" for i in range(23)]


def test_a_ready_listing_skips_stale_queue_entries(api: Scheduler) -> None:
    for i in range(5):
        api.schedule(f"t{i}", fn="f", delay=i)
    # A new version leaves the old queue entry behind until a claim drops it.
    api.schedule("t0", fn="f", delay=10)
    listed = every_page(api, "ready", limit=2)
    assert listed == ["t1", "t2", "t3", "t4", "t0"]


def test_running_tasks_page_by_lease_deadline(api: Scheduler) -> None:
    for i in range(7):
        api.schedule(f"t{i}", fn="f")
    claim_all(api, 7)
    listed = every_page(api, "running", limit=3)
    assert sorted(listed) == [f"t{i}" for i in range(7)]
    assert len(listed) == 7


def test_the_fn_filter_examines_a_bounded_number_of_entries(api: Scheduler) -> None:
    for i in range(30):
        api.schedule(f"o{i:02}", fn="other", delay=3600)
        api.cancel(f"o{i:02}")
    api.schedule("wanted", fn="mine", delay=3600)
    api.cancel("wanted")
    for i in range(30):
        api.schedule(f"p{i:02}", fn="other", delay=3600)
        api.cancel(f"p{i:02}")
    # limit 1: at most 10 entries per call; the wanted task sits 31st from the top.
    page = api.tasks("cancelled", fn="mine", limit=1)
    assert page.items == () and page.cursor is not None
    assert every_page(api, "cancelled", limit=1, fn="mine") == ["wanted"]
    assert ids(api.tasks("cancelled", fn="mine", limit=10).items) == ["wanted"]


def test_a_full_page_at_the_end_has_no_cursor_and_a_partial_one_ends(api: Scheduler) -> None:
    for i in range(4):
        api.schedule(f"t{i}", fn="f", delay=3600 + i)
    page = api.tasks("ready", limit=4)
    assert len(page.items) == 4 and page.cursor is None
    page = api.tasks("ready", limit=3)
    assert len(page.items) == 3 and page.cursor is not None
    rest = api.tasks("ready", limit=3, cursor=page.cursor)
    assert ids(rest.items) == ["t3"] and rest.cursor is None


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"state": "sleeping"}, "state"),
        ({"state": 3}, "state"),
        ({"state": "failed", "limit": 0}, "limit"),
        ({"state": "failed", "limit": 1001}, "limit"),
        ({"state": "failed", "limit": True}, "limit"),
        ({"state": "failed", "cursor": "nonsense"}, "cursor"),
        ({"state": "failed", "cursor": "s0000000000000a"}, "cursor"),
        ({"state": "ready", "cursor": "12:abc"}, "cursor"),
        ({"state": "running", "cursor": "x:abc"}, "cursor"),
        ({"state": "failed", "fn": ""}, "fn"),
    ],
)
def test_bad_listing_arguments_are_refused_naming_the_field(
    api: Scheduler, kwargs: dict[str, object], field: str
) -> None:
    rest = dict(kwargs)
    state = rest.pop("state")
    with pytest.raises(InvalidArgument) as caught:
        api.tasks(state, **rest)  # type: ignore[arg-type]
    assert caught.value.field == field


def test_a_ready_listing_goes_on_when_the_cursors_entry_left_the_queue(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    # One batch: every entry has the same due time, so only the member orders them.
    scheduler.schedule_many([TaskSpec(f"t{i:02}", "f") for i in range(40)])
    first = scheduler.tasks("ready", limit=30)
    assert first.cursor is not None
    # The entry under the cursor leaves the queue (as a claim or a compaction does),
    # while the 29 entries before it stay.
    _, member = first.cursor.split(":", 1)
    assert redis_client.zrem(scheduler.keys.queue, member.encode()) == 1
    page = scheduler.tasks("ready", limit=4, cursor=first.cursor)
    assert ids(page.items) == ["t30", "t31", "t32", "t33"]
    rest = ids(page.items)
    while page.cursor is not None:
        page = scheduler.tasks("ready", limit=4, cursor=page.cursor)
        rest += ids(page.items)
    assert rest == [f"t{i}" for i in range(30, 40)]
