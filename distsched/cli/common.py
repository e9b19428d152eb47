"""What every command shares: the chosen Redis and namespace, the connection, and
the parsing of option values."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
import redis

from distsched.client import Scheduler
from distsched.errors import InvalidArgument, NotFoundError
from distsched.model import TaskInfo
from distsched.retention import DEFAULT_WARNING_FRACTION
from distsched.text import jsonable, parse_duration, parse_when, redact
from distsched.tracebacks import one_line
from distsched.validate import CLUSTER_SCHEMES, cluster_seed


class Exit(enum.IntEnum):
    """The exit codes of every command (docs/pages/reference/exit-codes.md)."""

    OK = 0
    """Done."""
    FAILED = 1
    """Refused or failed, said in one line on stderr: a bad value, an unknown task id,
    namespace or schedule, a conflict, Redis unreachable; ``status --wait``: the task
    did not succeed."""
    USAGE = 2
    """The command line itself is wrong (click: unknown option, missing argument)."""
    TIMEOUT = 3
    """``status --wait``: ``--timeout`` passed before the task ended."""


def leave(ctx: click.Context, code: Exit) -> None:
    """End the command with ``code`` (every exit other than an error's goes here)."""
    ctx.exit(int(code))


@dataclasses.dataclass
class Settings:
    """What the options of the top command chose, for every command (``ctx.obj``)."""

    url: str
    namespace: str
    url_given: bool
    cluster: bool = False


def cluster_url(url: str) -> str:
    """``url`` naming a Redis Cluster through that node: ``redis://`` becomes
    ``redis+cluster://`` and ``rediss://`` ``rediss+cluster://`` (user, password and
    query kept); a cluster URL stays as it is."""
    if cluster_seed(url) is not None:
        return url
    for cluster_scheme, plain in CLUSTER_SCHEMES.items():
        if url.startswith(plain):
            return cluster_scheme + url[len(plain) :]
    raise InvalidArgument("url", f"--cluster needs a redis:// or rediss:// URL, got {redact(url)}")


def cluster_node_message(url: str) -> str:
    try:
        suggestion = f"--redis {redact(cluster_url(url))}"
    except InvalidArgument:
        suggestion = "--redis redis+cluster://HOST:PORT"
    return (
        f"{redact(url)} is a node of a Redis Cluster: use {suggestion} "
        "(or add --cluster) to reach the whole cluster"
    )


def settings_of(ctx: click.Context) -> Settings:
    settings = ctx.find_root().obj
    assert isinstance(settings, Settings)
    return settings


def connect(ctx: click.Context, lease_s: float = 30.0) -> Scheduler:
    """A scheduler for the chosen URL and namespace, closed when the command ends."""
    settings = settings_of(ctx)
    try:
        scheduler = Scheduler.from_url(settings.url, namespace=settings.namespace, lease_s=lease_s)
    except InvalidArgument:
        raise
    except ValueError as exc:
        # redis-py's URL parser: bad port, bad database number, ...
        raise click.ClickException(f"invalid --redis: {one_line(exc)}") from None
    ctx.call_on_close(scheduler.close)
    if cluster_seed(settings.url) is None:
        _refuse_cluster_node(scheduler, settings.url)
    return scheduler


def _refuse_cluster_node(scheduler: Scheduler, url: str) -> None:
    """A plain URL naming a cluster node would meet MOVED for most namespaces: say how
    to reach the cluster instead, before anything is sent."""
    try:
        info = scheduler.client.info("cluster")
    except redis.ResponseError:
        return  # INFO refused (an ACL, a server without it): the calls themselves will tell
    if str(info.get("cluster_enabled", "0")) == "1":
        raise click.ClickException(cluster_node_message(url))


@contextmanager
def task_named(ctx: click.Context, task_id: str) -> Iterator[None]:
    """Name the task and namespace when the id is unknown."""
    try:
        yield
    except NotFoundError:
        namespace = settings_of(ctx).namespace
        raise click.ClickException(f"no task {task_id!r} in namespace {namespace!r}") from None


def parse_json(value: str, field: str, kind: type) -> Any:
    """Parse a JSON option that must hold a list or an object."""
    try:
        data = json.loads(value)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(field, f"is not valid JSON ({exc.msg}): {value!r}") from None
    if not isinstance(data, kind):
        wanted = "a JSON list, e.g. '[1, \"a\"]'" if kind is list else "a JSON object"
        raise InvalidArgument(field, f"must be {wanted}, got {value!r}")
    return data


def parse_run_at(value: str) -> float | datetime.datetime:
    """Epoch seconds, or an ISO-8601 datetime that carries its UTC offset."""
    return parse_when(value, "run_at")


class Duration(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2
    """Seconds on the command line: ``90``, ``500ms``, ``30s``, ``5m``, ``1h30m``, ``7d``.

    A bad value is an ``InvalidArgument`` for ``field``, reported like every other one.
    """

    name = "duration"

    def __init__(self, field: str, signed: bool = False) -> None:
        self.field = field
        self.signed = signed

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip()
        if self.signed and text.startswith("-"):
            return -parse_duration(text[1:], self.field)
        return parse_duration(text, self.field)


Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def stacked(*decorators: Decorator) -> Decorator:
    """One decorator that applies ``decorators`` as if written one above the other in
    this order (so options show in ``--help`` in this order)."""

    def apply(command: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            command = decorator(command)
        return command

    return apply


def duration_option(
    *decls: str,
    field: str,
    help: str | None = None,
    default: str | float | None = None,
    show_default: bool = True,
    signed: bool = False,
    metavar: str | None = None,
) -> Decorator:
    """An option holding a :class:`Duration` for ``field``; a default given shows in
    ``--help`` unless ``show_default`` is false."""
    extra: dict[str, Any] = {} if default is None else {"default": default}
    return click.option(
        *decls,
        type=Duration(field, signed),
        show_default=show_default,
        metavar=metavar,
        help=help,
        **extra,
    )


def count_option(*decls: str, help: str, default: int | None = None) -> Decorator:
    """An option holding a whole number of at least 1; a default given shows in ``--help``."""
    return click.option(
        *decls, type=click.IntRange(min=1), default=default, show_default=True, help=help
    )


def memory_warning_option(help: str) -> Decorator:
    """``--memory-warning FRACTION``: the share of maxmemory past which the projected
    memory of ended tasks is flagged (docs: "Planning for retention")."""
    return click.option(
        "--memory-warning",
        type=click.FloatRange(0, 1, min_open=True),
        default=DEFAULT_WARNING_FRACTION,
        show_default=True,
        metavar="FRACTION",
        help=help,
    )


def info_dict(info: TaskInfo) -> dict[str, Any]:
    data = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
    data["state"] = info.state.value
    return {key: jsonable(value) for key, value in data.items()}


def connect_existing(ctx: click.Context) -> Scheduler:
    """``connect``, refusing a namespace that does not exist (most likely misspelled)
    the same way for every command that reads one."""
    scheduler = connect(ctx)
    require_namespace(ctx, scheduler)
    return scheduler


def require_namespace(ctx: click.Context, scheduler: Scheduler) -> None:
    """A namespace without a single key is most likely a typo: say so."""

    if not scheduler.exists():
        settings = settings_of(ctx)
        raise click.ClickException(
            f"namespace {settings.namespace!r} does not exist at {redact(settings.url)} "
            "(it has no keys: check --namespace and --redis)"
        )
