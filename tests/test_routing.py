"""Each operation declares how it spreads over a striped namespace's stripes."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from distsched.keys import Keys
from distsched.ops import routing as route
from distsched.ops.base import Shortcuts
from distsched.ops.namespace import Ops
from distsched.ops.protocol import Op
from distsched.ops.stripes import StripedOps


def test_every_public_operation_declares_its_route() -> None:
    shortcuts = set(vars(Shortcuts))
    missing = [
        name
        for name, fn in inspect.getmembers(Ops, inspect.isfunction)
        if not name.startswith("_")
        and name not in shortcuts
        and not hasattr(fn, route.ROUTE_ATTRIBUTE)
    ]
    assert missing == []


def test_an_operation_written_across_stripes_is_written_there_and_not_routed() -> None:
    striped = [
        name
        for name, fn in inspect.getmembers(Ops, inspect.isfunction)
        if getattr(fn, route.ROUTE_ATTRIBUTE, None) is not None
        and route.route_of(fn).kind is route.Kind.STRIPED
    ]
    # Each is StripedOps's own (or its share mover's), not the one-stripe shortcut.
    own = [getattr(StripedOps, n, None) not in (None, getattr(Shortcuts, n, None)) for n in striped]
    assert striped and all(own)
    ops = StripedOps(Keys("routing"), 1000, 1 << 20)
    with pytest.raises(TypeError, match="written across stripes"):
        next(ops.call(Ops.claim, 1, "w"))


class _Fake:
    """One stripe that answers with its own index."""

    def __init__(self, index: int) -> None:
        self.index = index


class _Router(route.Router[_Fake]):
    def __init__(self, count: int) -> None:
        self.keys = Keys("routing")
        self.stripes = tuple(_Fake(i) for i in range(count))

    def resolve(self) -> Op[tuple[_Fake, ...]]:
        return self.stripes
        yield  # a generator all the same


def _done(op: Op[Any]) -> Any:
    try:
        next(op)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the operation sent a request")


@route.by_ids("ids", route.in_order)
def _where(stripe: _Fake, ids: list[object]) -> Op[list[int]]:
    return [stripe.index] * len(ids)
    yield  # a generator all the same


@route.every(merge=route.total)
def _count(stripe: _Fake) -> Op[int]:
    return 1
    yield  # a generator all the same


def test_a_batch_goes_to_the_stripe_of_each_id_and_comes_back_in_order() -> None:
    ids = ["{a}1", "{b}2", "{c}3", "{a}4", 5]
    got = _done(_Router(3).call(_where, ids))
    want = [route.stripe_for(i, 3) for i in ids]
    assert got == want and len(set(want)) > 1
    assert _done(_Router(3).call(_count)) == 3
