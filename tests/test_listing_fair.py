"""Listing the ready tasks of a fair namespace (``Scheduler.tasks``) against a real
redis-server.

Tasks scheduled with a fairness key other than the default one wait in ``fairq``, not in
the queue: the ready listing goes on there after the ranked set and the queue, so every
ready task ``stats()`` counts is listed, each once, page after page, in either order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
import redis

from distsched import Scheduler, State, TaskSpec
from distsched.errors import InvalidArgument
from distsched.wire import records

ORDERS = ["default", "priority"]
AGING_S = 60.0


def every_page(
    s: Scheduler, limit: int = 2, fn: str | None = None, cursor: str | None = None
) -> list[str]:
    """Every ready task id from ``cursor`` on, page by page."""
    out: list[str] = []
    for _ in range(1000):
        page = s.tasks(State.READY, fn=fn, limit=limit, cursor=cursor)
        assert all(info.state is State.READY for info in page.items)
        out += [info.task_id for info in page.items]
        cursor = page.cursor
        if cursor is None:
            return out
    raise AssertionError("the listing never ended")


def fairq_members(client: redis.Redis, s: Scheduler) -> list[bytes]:
    return cast(list[bytes], client.zrange(s.keys.fairq, 0, -1))


def use_order(s: Scheduler, order: str) -> None:
    if order == "priority":
        s.set_order("priority", AGING_S)


def fill(s: Scheduler) -> set[str]:
    """Ready tasks of the default key and of two other keys, due now and later, of mixed
    priorities; their ids."""
    specs = [TaskSpec(f"d{i}", "f", priority=i % 3) for i in range(3)]
    specs += [TaskSpec(f"dl{i}", "f", delay=3600 + i) for i in range(2)]
    specs += [TaskSpec(f"a{i}", "f", key="a", priority=(i * 7) % 5) for i in range(5)]
    specs += [TaskSpec(f"al{i}", "f", key="a", delay=3600 + i) for i in range(2)]
    specs += [TaskSpec(f"b{i}", "f", key="tenant-b", priority=i) for i in range(3)]
    specs += [TaskSpec(f"bl{i}", "f", key="tenant-b", delay=60 + i) for i in range(3)]
    s.schedule_many(specs)
    return {spec.task_id for spec in specs}


@pytest.fixture
def striped(redis_client: redis.Redis, namespace: str) -> Iterator[Scheduler]:
    s = Scheduler(redis_client, namespace=namespace, stripes=3, lease_s=5.0)
    yield s
    s.close()


@pytest.mark.parametrize("order", ORDERS)
def test_every_ready_task_of_a_fair_namespace_is_listed_once_across_small_pages(
    scheduler: Scheduler, order: str
) -> None:
    use_order(scheduler, order)
    expected = fill(scheduler)
    assert scheduler.stats()["counts"]["ready"] == len(expected)
    listed = every_page(scheduler)
    assert len(listed) == len(set(listed))
    assert set(listed) == expected


def test_keyed_tasks_moved_into_their_ranked_section_are_listed_once(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    # Scheduled in the default order, the keyed tasks sit in their keys' delayed sections;
    # a claim in the priority order moves a visited key's due ones into its ranked section.
    expected = fill(scheduler)
    use_order(scheduler, "priority")
    claimed = {claim.task_id for claim in scheduler.ready(3, "w1")}
    expected -= claimed
    entries = [records.parse_fairq_member(m) for m in fairq_members(redis_client, scheduler)]
    assert any(e is not None and e.ranked for e in entries)
    assert any(e is not None and not e.ranked for e in entries)
    listed = every_page(scheduler)
    assert len(listed) == len(set(listed))
    assert set(listed) == expected


def test_a_keys_ready_tasks_are_listed_in_the_order_claims_take_them(
    scheduler: Scheduler,
) -> None:
    use_order(scheduler, "priority")
    scheduler.schedule_many(
        [TaskSpec(f"a{i}", "f", key="a", priority=(i * 7) % 5) for i in range(8)]
    )
    listed = every_page(scheduler, limit=3)
    claimed = [claim.task_id for claim in scheduler.ready(8, "w1")]
    assert listed == claimed


def test_a_task_with_entries_in_both_sections_of_its_key_is_listed_once(
    scheduler: Scheduler, redis_client: redis.Redis
) -> None:
    use_order(scheduler, "priority")
    scheduler.schedule_many([TaskSpec(f"a{i}", "f", key="a", delay=3600) for i in range(3)])
    # A ranked-section twin of a delayed entry, as a move cut short could leave behind.
    delayed = fairq_members(redis_client, scheduler)
    entry = records.parse_fairq_member(delayed[1])
    assert entry is not None and not entry.ranked
    twin = records.fair_ranked_member("a", entry.due_ms, entry.member, 0, round(AGING_S * 1000))
    redis_client.zadd(scheduler.keys.fairq, {twin: 0})
    assert every_page(scheduler, limit=1) == ["a0", "a1", "a2"]


@pytest.mark.parametrize("order", ORDERS)
def test_tasks_claimed_between_pages_do_not_break_the_cursor(
    scheduler: Scheduler, order: str
) -> None:
    use_order(scheduler, order)
    # Default-key tasks not due, so that claims take key a's tasks, in their order.
    scheduler.schedule_many([TaskSpec(f"d{i}", "f", delay=3600) for i in range(2)])
    scheduler.schedule_many([TaskSpec(f"a{i}", "f", key="a") for i in range(6)])
    scheduler.schedule_many([TaskSpec(f"b{i}", "f", key="b", delay=3600) for i in range(3)])
    first = scheduler.tasks(State.READY, limit=2)
    second = scheduler.tasks(State.READY, limit=2, cursor=first.cursor)
    before = [info.task_id for info in first.items + second.items]
    assert before == ["d0", "d1", "a0", "a1"]
    # The claim takes the entry the cursor stands at, and the one after it.
    claimed = [claim.task_id for claim in scheduler.ready(3, "w1")]
    assert claimed == ["a0", "a1", "a2"]
    after = every_page(scheduler, cursor=second.cursor)
    assert after == ["a3", "a4", "a5", "b0", "b1", "b2"]


def test_a_cancelled_keyed_task_under_the_cursor_does_not_break_it(
    scheduler: Scheduler,
) -> None:
    scheduler.schedule_many([TaskSpec(f"a{i}", "f", key="a", delay=3600) for i in range(5)])
    page = scheduler.tasks(State.READY, limit=2)
    assert [info.task_id for info in page.items] == ["a0", "a1"]
    scheduler.cancel("a1")
    scheduler.cancel("a2")
    assert every_page(scheduler, cursor=page.cursor) == ["a3", "a4"]


@pytest.mark.parametrize("order", ORDERS)
def test_the_fn_filter_keeps_the_keyed_tasks_of_that_function(
    scheduler: Scheduler, order: str
) -> None:
    use_order(scheduler, order)
    specs = [TaskSpec(f"d{i}", "mine" if i % 2 else "other") for i in range(4)]
    specs += [
        TaskSpec(f"{key}{i}", "mine" if i % 3 == 0 else "other", key=key)
        for key in ("a", "b")
        for i in range(9)
    ]
    scheduler.schedule_many(specs)
    mine = {spec.task_id for spec in specs if spec.fn == "mine"}
    listed = every_page(scheduler, fn="mine")
    assert len(listed) == len(set(listed))
    assert set(listed) == mine


@pytest.mark.parametrize("order", ORDERS)
def test_a_striped_fair_namespace_lists_every_ready_task_once(
    striped: Scheduler, order: str
) -> None:
    use_order(striped, order)
    specs = [TaskSpec(f"d{i}", "f", delay=i % 2 * 3600) for i in range(8)]
    specs += [
        TaskSpec(f"{key}{i}", "f", key=key, delay=i % 2 * 3600, priority=i % 4)
        for key in ("a", "b")
        for i in range(10)
    ]
    striped.schedule_many(specs)
    expected = {spec.task_id for spec in specs}
    assert striped.stats()["counts"]["ready"] == len(expected)
    listed = every_page(striped)
    assert len(listed) == len(set(listed))
    assert set(listed) == expected
    assert set(every_page(striped, fn="f", limit=3)) == expected


def test_a_full_last_page_of_keyed_tasks_has_no_cursor(scheduler: Scheduler) -> None:
    scheduler.schedule_many([TaskSpec("d0", "f"), TaskSpec("a0", "f", key="a")])
    page = scheduler.tasks(State.READY, limit=2)
    assert [info.task_id for info in page.items] == ["d0", "a0"]
    assert page.cursor is None
    page = scheduler.tasks(State.READY, limit=1)
    assert [info.task_id for info in page.items] == ["d0"]
    assert page.cursor is not None


@pytest.mark.parametrize("cursor", ["^", "^junk", "^001a0000000000000", "^zzzq"])
def test_a_bad_fairq_cursor_is_refused_naming_the_cursor(scheduler: Scheduler, cursor: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        scheduler.tasks(State.READY, cursor=cursor)
    assert caught.value.field == "cursor"
