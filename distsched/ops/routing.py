"""Where an operation goes in a striped namespace, declared on the operation itself.

A namespace spread over several stripes (:mod:`distsched.ops.stripes`) runs each
operation of :class:`~distsched.ops.namespace.Ops` on the stripes its route names:

- ``@by_id("task_id")``: the stripe of the task id given in that argument;
- ``@by_ids("claims", merge=in_order, check=...)``: a batch split by the stripes of
  its ids, each part sent to its stripe and the answers merged; ``check`` refuses a bad
  batch before any part is sent;
- ``@by_name("name")``: the stripe of a schedule, the stripe of its name read as a task
  id (the stripe its slots' tasks go to, :func:`~distsched.schedules.tags_slot_ids`);
- ``@first``: stripe 0, which holds what is namespace-wide (settings, workers);
- ``@every(merge=total)``: every stripe in turn, stripe 0 first, the answers merged;
- ``@striped``: written across stripes in :mod:`distsched.ops.stripes`, not routed.

With one stripe every route is the plain operation of the namespace. :class:`Router`
applies the routes; nothing else needs to know them.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from distsched.keys import Keys, stripe_of
from distsched.ops.protocol import Op

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")
F = TypeVar("F", bound=Callable[..., Any])

# The attribute of an operation's function that holds its route.
ROUTE_ATTRIBUTE = "__route__"


class Kind(enum.Enum):
    BY_ID = "by_id"
    BY_IDS = "by_ids"
    FIRST = "first"
    EVERY = "every"
    STRIPED = "striped"


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Route:
    """How one operation spreads over stripes (see the module's docstring)."""

    kind: Kind
    # BY_ID, BY_IDS: the argument naming the task id(s), its position after ``self``, and
    # how to read a task id from it (or from each of its items).
    param: str = ""
    position: int = -1
    of: Callable[[Any], Any] = _same
    # EVERY: merge(answers, stripe 0's first); BY_IDS: merge([(positions, answer)], size).
    merge: Callable[..., Any] = _same
    check: Callable[..., object] | None = None


def _declare(route: Route) -> Callable[[F], F]:
    def declare(fn: F) -> F:
        if route.param:
            names = list(inspect.signature(fn).parameters)[1:]
            if route.param not in names:
                raise TypeError(f"{fn.__qualname__} has no argument {route.param!r}")
            declared = dataclasses.replace(route, position=names.index(route.param))
        else:
            declared = route
        setattr(fn, ROUTE_ATTRIBUTE, declared)
        return fn

    return declare


def by_id(param: str, of: Callable[[Any], Any] = _same) -> Callable[[F], F]:
    """Run on the stripe of the task id ``of(argument param)``."""
    return _declare(Route(Kind.BY_ID, param, of=of))


def by_ids(
    param: str,
    merge: Callable[[list[tuple[list[int], Any]], int], Any],
    of: Callable[[Any], Any] = _same,
    check: Callable[..., object] | None = None,
) -> Callable[[F], F]:
    """Split the sequence in argument ``param`` by the stripes of its items' ids."""
    return _declare(Route(Kind.BY_IDS, param, of=of, merge=merge, check=check))


def every(merge: Callable[[list[Any]], Any]) -> Callable[[F], F]:
    """Run on every stripe, stripe 0 first; ``merge`` makes one answer of theirs."""
    return _declare(Route(Kind.EVERY, merge=merge))


def first(fn: F) -> F:
    """Run on stripe 0."""
    return _declare(Route(Kind.FIRST))(fn)


def by_name(param: str) -> Callable[[F], F]:
    """Run on the stripe of the schedule named in argument ``param``: the stripe of its
    name as a task id, where every task of its slots goes too."""
    return _declare(Route(Kind.BY_ID, param))


def striped(fn: F) -> F:
    """Written across stripes in :mod:`distsched.ops.stripes`: call it there."""
    return _declare(Route(Kind.STRIPED))(fn)


def route_of(fn: Callable[..., Any]) -> Route:
    route = getattr(fn, ROUTE_ATTRIBUTE, None)
    if not isinstance(route, Route):
        raise TypeError(f"{getattr(fn, '__qualname__', fn)!r} declares no route")
    return route


# ------------------------------------------------------------------------ merges


def total(answers: list[int]) -> int:
    return sum(answers)


def any_of(answers: list[bool]) -> bool:
    return any(answers)


def first_of(answers: list[Any]) -> Any:
    return answers[0]


def last_of(answers: list[Any]) -> Any:
    return answers[-1]


def in_order(parts: list[tuple[list[int], list[Any]]], size: int) -> list[Any]:
    """The answers of each part put back where their items were in the batch."""
    out: list[Any] = [None] * size
    for at, answers in parts:
        for i, answer in zip(at, answers, strict=True):
            out[i] = answer
    return out


def total_of_parts(parts: list[tuple[list[int], int]], size: int) -> int:
    return sum(answer for _, answer in parts)


# ------------------------------------------------------------------------ the router


def stripe_for(task_id: object, stripes: int) -> int:
    """The stripe of ``task_id``; stripe 0 for what is not an id (the operation there
    refuses it)."""
    if stripes == 1 or not isinstance(task_id, str):
        return 0
    return stripe_of(task_id, stripes)


class Router(Generic[S]):
    """Runs the operations of one stripe (``S``) on the stripes their routes name."""

    keys: Keys

    def resolve(self) -> Op[tuple[S, ...]]:
        """The operations of each stripe, stripe 0 first."""
        raise NotImplementedError

    def call(
        self, method: Callable[Concatenate[S, P], Op[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> Op[R]:
        """Run ``method`` (an operation of one stripe) where its route says."""
        route = route_of(method)
        if route.kind is Kind.STRIPED:
            raise TypeError(f"{method.__qualname__} is written across stripes: call it there")
        stripes = yield from self.resolve()
        if len(stripes) == 1 or route.kind is Kind.FIRST:
            return (yield from method(stripes[0], *args, **kwargs))
        if route.kind is Kind.BY_ID:
            task_id = route.of(_argument(route, args, kwargs))
            return (yield from method(stripes[stripe_for(task_id, len(stripes))], *args, **kwargs))
        if route.kind is Kind.EVERY:
            answers = []
            for ops in stripes:
                answers.append((yield from method(ops, *args, **kwargs)))
            merged: R = route.merge(answers)
            return merged
        split: R = yield from self._split(route, method, stripes, args, kwargs)
        return split

    def _split(
        self,
        route: Route,
        method: Callable[..., Op[Any]],
        stripes: Sequence[S],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Op[Any]:
        """A BY_IDS route: the batch checked whole, then sent in parts by stripe."""
        if route.check is not None:
            route.check(stripes[0], *args, **kwargs)
        items = _argument(route, args, kwargs)
        groups: dict[int, list[int]] = {}
        for i, item in enumerate(items):
            groups.setdefault(stripe_for(route.of(item), len(stripes)), []).append(i)
        parts = []
        for s, at in sorted(groups.items()):
            part_args, part_kwargs = _with_argument(route, args, kwargs, [items[i] for i in at])
            parts.append((at, (yield from method(stripes[s], *part_args, **part_kwargs))))
        return route.merge(parts, len(items))


def _argument(route: Route, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if route.param in kwargs:
        return kwargs[route.param]
    return args[route.position]


def _with_argument(
    route: Route, args: tuple[Any, ...], kwargs: dict[str, Any], value: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if route.param in kwargs:
        return args, {**kwargs, route.param: value}
    changed = list(args)
    changed[route.position] = value
    return tuple(changed), kwargs


def task_id_of(item: Any) -> Any:
    """The task id of a claim (None for anything else)."""
    return getattr(item, "task_id", None)


def report_task_id(report: Any) -> Any:
    """The task id of a ``(claim, value)`` report."""
    return task_id_of(report[0]) if report else None
