"""The ``distsched`` command line: a thin shell over :class:`~distsched.client.Scheduler`.

Each command parses its options and calls one function. Errors a user can fix
(bad arguments, unknown ids, conflicts, an unreachable Redis) are printed as one
line on stderr with exit code 1; click's usage errors exit with 2.
``status --wait`` exits 1 for a task that did not succeed and 3 (``EXIT_TIMEOUT``)
when its ``--timeout`` passed.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import click
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from distsched import __version__, library, scripts, views
from distsched.client import Scheduler
from distsched.core import (
    CLUSTER_SCHEMES,
    PRIORITY_LABELS,
    Admitted,
    AttemptInfo,
    Explanation,
    KeyInfo,
    Order,
    OrderSetting,
    Reason,
    State,
    TaskInfo,
    cluster_seed,
    validate_worker_id,
)
from distsched.errors import (
    ConflictError,
    CycleError,
    DistschedError,
    InvalidArgument,
    NotFoundError,
    Timeout,
    UnknownDependencyError,
)
from distsched.hooks import validate_hooks
from distsched.keys import MAX_STRIPES
from distsched.schedules import MAX_BACKFILL_SLOTS, Overlap, Schedule, ScheduleOptions
from distsched.scripts import Check
from distsched.text import (
    CUT_CHARS,
    DURATION_HINT,
    duration,
    error_summary,
    escape,
    iso,
    json_line,
    jsonable,
    one_line,
    parse_duration,
    parse_when,
    preview,
    redact,
    redact_text,
    relative,
    show,
    table,
)

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_NAMESPACE = "default"

# How each validated field is spelled on the command line.
OPTION_NAMES = {
    "task_id": "ID",
    "fn": "--fn",
    "args": "--args",
    "kwargs": "--kwargs",
    "run_at": "--run-at",
    "delay": "--delay",
    "priority": "--priority",
    "max_attempts": "--max-attempts",
    "backoff": "--backoff",
    "deps": "--dep",
    "optional_deps": "--optional-dep",
    "limit": "--limit",
    "lease_s": "--lease",
    "namespace": "--namespace",
    "concurrency": "--concurrency",
    "grace": "--grace",
    "timeout": "--timeout",
    "timeout_grace": "--timeout-grace",
    "functions": "APP",
    "app": "APP",
    "url": "--redis",
    "retention_s": "SECONDS",
    "max_running": "N",
    "interval": "--interval",
    "soon_s": "--soon",
    "name": "NAME",
    "cron": "--cron",
    "tz": "--tz",
    "start": "--start",
    "end": "--end",
    "jitter": "--jitter",
    "overlap": "--overlap",
    "catchup": "--catchup",
    "catchup_window": "--catchup-window",
    "n": "-n",
    "token": "--token",
}


@dataclasses.dataclass
class Settings:
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


def _invalid(exc: InvalidArgument) -> str:
    message = str(exc)
    prefix = f"{exc.field}: "
    if message.startswith(prefix):
        message = message[len(prefix) :]
    return f"invalid {OPTION_NAMES.get(exc.field, exc.field)}: {one_line(message)}"


class CliGroup(click.Group):
    """Turns the errors a user can act on into one line on stderr and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return self._invoke(ctx)
        except click.ClickException as exc:
            # Every error message, whoever raised it: no password of a URL, and nothing a
            # terminal would act on (an id or a Redis reply may hold escape sequences).
            # click declares message Final, yet its own handlers only read it when printing.
            exc.message = escape(redact_text(exc.message), keep_newlines=True)  # type: ignore[misc]
            raise

    def _invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except InvalidArgument as exc:
            raise click.ClickException(_invalid(exc)) from None
        except redis.ConnectionError as exc:  # distsched's Unavailable included
            url = redact(_settings(ctx).url)
            if _redirected(exc):
                raise click.ClickException(_cluster_node_message(_settings(ctx).url)) from None
            raise click.ClickException(
                f"cannot connect to Redis at {url}: {one_line(exc)}"
            ) from None
        except redis.exceptions.RedisClusterException as exc:
            # redis-py's own, outside RedisError: no node answered, or none let us in.
            url = redact(_settings(ctx).url)
            raise click.ClickException(
                f"cannot connect to the Redis Cluster at {url}: {one_line(exc)}"
            ) from None
        except DistschedError as exc:
            raise click.ClickException(one_line(exc)) from None
        except redis.RedisError as exc:
            url = redact(_settings(ctx).url)
            raise click.ClickException(f"Redis at {url}: {one_line(exc)}") from None


def _redirected(exc: BaseException) -> bool:
    """A cluster node answered MOVED or ASK: the URL names one node of a cluster."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, redis.exceptions.AskError):  # MovedError included
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _cluster_node_message(url: str) -> str:
    try:
        suggestion = f"--redis {redact(cluster_url(url))}"
    except InvalidArgument:
        suggestion = "--redis redis+cluster://HOST:PORT"
    return (
        f"{redact(url)} is a node of a Redis Cluster: use {suggestion} "
        "(or add --cluster) to reach the whole cluster"
    )


def _settings(ctx: click.Context) -> Settings:
    settings = ctx.find_root().obj
    assert isinstance(settings, Settings)
    return settings


def _connect(ctx: click.Context, lease_s: float = 30.0) -> Scheduler:
    """A scheduler for the chosen URL and namespace, closed when the command ends."""
    settings = _settings(ctx)
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
        raise click.ClickException(_cluster_node_message(url))


@contextmanager
def _task(ctx: click.Context, task_id: str) -> Iterator[None]:
    """Name the task and namespace when the id is unknown."""
    try:
        yield
    except NotFoundError:
        namespace = _settings(ctx).namespace
        raise click.ClickException(f"no task {task_id!r} in namespace {namespace!r}") from None


# --------------------------------------------------------------------------- parsing


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


def import_object(spec: str, field: str) -> Any:
    """The object ``module:attribute`` names (``attribute`` may be dotted)."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise InvalidArgument(field, f"must be 'module:attribute', got {spec!r}")
    # Like other task runners: modules next to where the worker is started are importable.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + ".")
        ):
            raise InvalidArgument(field, f"cannot import module {module_name!r}") from None
        raise
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidArgument(
                field, f"module {module_name!r} has no attribute {attribute!r}"
            ) from None
    return target


def load_hooks(spec: str) -> list[Any]:
    """Import ``module:attribute``: a hook object, a class (made with no arguments), or
    a list of either (see :mod:`distsched.hooks`)."""
    target = import_object(spec, "hooks")
    items = list(target) if isinstance(target, (list, tuple)) else [target]
    return validate_hooks([item() if isinstance(item, type) else item for item in items])


def load_app(spec: str) -> dict[str, Callable[..., Any]]:
    """Import ``module:attribute``: a mapping name -> callable, or a list of callables."""
    target = import_object(spec, "app")
    if isinstance(target, Mapping):
        functions = dict(target)
    elif isinstance(target, (list, tuple)):
        functions = {getattr(f, "__name__", ""): f for f in target}
    else:
        raise InvalidArgument(
            "app",
            f"{spec} must be a mapping of name -> function or a list of functions, "
            f"got {type(target).__name__}",
        )
    bad = [name for name, fn in functions.items() if not isinstance(name, str) or not name
           or not callable(fn)]  # fmt: skip
    if bad or not functions:
        raise InvalidArgument("app", f"{spec} must name at least one function, by str names")
    return functions


# --------------------------------------------------------------------------- output


def info_dict(info: TaskInfo) -> dict[str, Any]:
    data = {f.name: getattr(info, f.name) for f in dataclasses.fields(info)}
    data["state"] = info.state.value
    return {key: jsonable(value) for key, value in data.items()}


PREVIEW_CHARS = 200
# The exit code of `status --wait` whose --timeout passed (1 is a task that did not
# succeed, or any error; 2 is click's usage error).
EXIT_TIMEOUT = 3


# Ids one line of `status` lists (deps, dependents) unless --full.
IDS_SHOWN = 20


def _status_lines(
    info: TaskInfo, server_now: float, limit: int | None = PREVIEW_CHARS
) -> list[tuple[str, str]]:
    """Key/value lines, every stored string escaped; args, kwargs, result and error cut
    to ``limit`` characters, and with a limit, ids cut and lists of ids shortened (None:
    all of each)."""
    id_limit = None if limit is None else CUT_CHARS

    def js(value: Any) -> str:
        return escape(preview(json.dumps(jsonable(value), ensure_ascii=False), limit))

    def ids(values: tuple[str, ...]) -> str:
        shown = values if id_limit is None else values[:IDS_SHOWN]
        text = ", ".join(views.show_id(v, id_limit) for v in shown) or "-"
        if len(shown) < len(values):
            text += f", … ({len(values) - len(shown)} more; --full to see all)"
        return text

    run_at = f"{iso(info.run_at)} ({relative(info.run_at, server_now)}; epoch {info.run_at:.3f})"
    blocked = "-"
    if info.blocked_by is not None:
        cause = info.blocked_by
        blocked = (
            f"{views.show_id(cause.root, id_limit)} via {views.show_path(cause.path, id_limit)}"
        )
    lease = "-"
    if info.lease_deadline is not None:
        lease = f"{iso(info.lease_deadline)} ({relative(info.lease_deadline, server_now)})"
    return [
        ("task_id", show(info.task_id, id_limit)),
        ("state", info.state.value),
        ("version", str(info.version)),
        ("attempt", str(info.attempt)),
        ("max_attempts", str(info.max_attempts)),
        ("priority", str(info.priority)),
        ("run_at", run_at),
        ("backoff", f"{info.backoff:g} s"),
        ("timeout", "-" if info.timeout is None else f"{info.timeout:g} s"),
        ("fn", show(info.fn, id_limit) if info.fn else "-"),
        ("args", js(list(info.args))),
        ("kwargs", js(info.kwargs)),
        ("cancel_requested", "yes" if info.cancel_requested else "no"),
        ("worker", show(info.worker, id_limit) if info.worker else "-"),
        ("lease_deadline", lease),
        ("updated_at", iso(info.updated_at)),
        ("error", _error_value(info.error, limit)),
        ("result", "-" if info.result is None else js(info.result)),
        ("deps", ids(info.deps)),
        ("optional_deps", ids(info.optional_deps)),
        (
            "remaining",
            f"{info.remaining} required, {info.optional_remaining} optional"
            + ("; held while its dependencies are placed in parts" if info.placing else ""),
        ),
        ("dependents", ids(info.dependents)),
        ("blocked_by", blocked),
        *_attempt_lines(info.attempts, limit),
    ]


def attempt_text(attempt: AttemptInfo, limit: int | None = PREVIEW_CHARS) -> str:
    """One ended attempt on one line: outcome, token, worker, when and how long."""
    took = max(attempt.ended_at - attempt.started_at, 0.0)
    id_limit = None if limit is None else CUT_CHARS
    text = (
        f"{escape(attempt.outcome)}: version {attempt.version} attempt {attempt.attempt}, "
        f"{views.show_id(attempt.worker, id_limit) if attempt.worker else '-'}, "
        f"{iso(attempt.started_at)}, {took:.3f} s"
    )
    if attempt.error:
        text += f", {escape(preview(attempt.error, limit))}"
    return text


def _attempt_lines(attempts: tuple[AttemptInfo, ...], limit: int | None) -> list[tuple[str, str]]:
    """The ``attempts`` line and one continuation line per further attempt, oldest first."""
    if not attempts:
        return [("attempts", "-")]
    lines = [("attempts", attempt_text(attempts[0], limit))]
    return lines + [("", attempt_text(a, limit)) for a in attempts[1:]]


def _error_value(error: str | None, limit: int | None) -> str:
    """A traceback shows as its type/message and where it was raised; whole below it
    when nothing is cut."""
    if not error:
        return "-"
    summary = escape(error_summary(error))
    if limit is None and "\n" in error:
        # The traceback's own line breaks are kept; anything else a terminal would act on
        # is escaped.
        return f"{summary}\n{escape(error, keep_newlines=True)}"
    return escape(preview(error_summary(error), limit))


# --------------------------------------------------------------------------- commands


@click.group(cls=CliGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--redis",
    "url",
    envvar="DISTSCHED_REDIS_URL",
    default=DEFAULT_URL,
    show_default=True,
    metavar="URL",
    help="Redis URL: redis://, rediss:// (TLS) or unix://; a Redis Cluster as "
    "redis+cluster://HOST:PORT or rediss+cluster:// through any one of its nodes. "
    "Env: DISTSCHED_REDIS_URL.",
)
@click.option(
    "--cluster",
    is_flag=True,
    envvar="DISTSCHED_CLUSTER",
    help="The --redis URL names a node of a Redis Cluster (same as redis+cluster://). "
    "Env: DISTSCHED_CLUSTER=1.",
)
@click.option(
    "--namespace",
    envvar="DISTSCHED_NAMESPACE",
    default=DEFAULT_NAMESPACE,
    show_default=True,
    help="Namespace of the tasks. Env: DISTSCHED_NAMESPACE.",
)
@click.version_option(__version__, prog_name="distsched")
@click.pass_context
def cli(ctx: click.Context, url: str, namespace: str, cluster: bool) -> None:
    """distsched: a Redis-based distributed task scheduler.

    Try `distsched demo` for a tour that needs no setup.
    """
    source = ctx.get_parameter_source("url")
    given = source not in (None, click.core.ParameterSource.DEFAULT)
    ctx.obj = Settings(
        url=cluster_url(url) if cluster else url, namespace=namespace, url_given=given,
        cluster=cluster,
    )  # fmt: skip


class Processes(click.ParamType):  # type: ignore[type-arg]  # generic in click >= 8.2
    """A number of worker processes: an int >= 1, or ``auto`` for one per core."""

    name = "processes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif str(value).strip().lower() == "auto":
            return os.cpu_count() or 1
        else:
            try:
                number = int(str(value).strip())
            except ValueError:
                number = 0
        if number < 1:
            raise InvalidArgument("processes", f"must be an int >= 1 or 'auto', got {value!r}")
        return number


@cli.command()
@click.argument("app")
@click.option(
    "--processes",
    type=Processes(),
    default="1",
    show_default=True,
    metavar="N|auto",
    help="Worker processes, each with --concurrency slots, under one supervisor that "
    "restarts a process that dies and forwards SIGTERM/SIGINT; auto: one per core.",
)
@click.option(
    "--concurrency",
    type=int,
    default=8,
    show_default=True,
    help="How many task functions may run at once in this process.",
)
@click.option(
    "--lease",
    "lease_s",
    type=Duration("lease_s"),
    default="30s",
    show_default=True,
    help="Lease length (seconds, or 500ms, 30s, 2m); heartbeats renew it every third of it.",
)
@click.option(
    "--grace",
    type=Duration("grace"),
    default="30s",
    show_default=True,
    help="On SIGTERM/SIGINT, how long running functions get before they are cancelled.",
)
@click.option(
    "--timeout",
    type=Duration("timeout"),
    default=None,
    metavar="DURATION",
    help="The time limit of a run whose task sets none (default: no limit); see README, "
    "Time limits.",
)
@click.option(
    "--timeout-grace",
    type=Duration("timeout_grace"),
    default="5s",
    show_default=True,
    help="How long a function past its time limit gets to stop before its attempt is "
    "reported failed (with --processes, a def function that still runs then ends with "
    "its process, which is replaced).",
)
@click.option(
    "--max-unsent",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Finished tasks whose outcome is not reported yet that may wait before they take "
    "slots again (claiming stops): leases held stay within --concurrency + N. "
    "Default: 2 x --concurrency.",
)
@click.option("--worker-id", default=None, help="Worker id (default: host:pid:random).")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    metavar="PORT",
    help="Serve Prometheus metrics at http://ADDR:PORT/metrics (0: any free port). "
    "Needs distsched[metrics].",
)
@click.option(
    "--metrics-addr",
    default="127.0.0.1",
    show_default=True,
    metavar="ADDR",
    help="Address the metrics endpoint listens on.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="INFO",
    show_default=True,
    help="Least severe log lines written: DEBUG adds one line per success.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text for people; json: one JSON object per line (time, level, logger, message, "
    "task_id, fn, version, attempt, duration, outcome, error, traceback).",
)
@click.option(
    "--hooks",
    "hook_specs",
    multiple=True,
    metavar="MODULE:OBJECT",
    help="Worker hooks (before_task, after_task, on_failure; see distsched.hooks): an "
    "object, a class made with no arguments, or a list of them. Repeatable.",
)
@click.option(
    "--otel", is_flag=True,
    help="Trace every run as an OpenTelemetry span (distsched.otel.TracingHooks), linked to "
    "the producer's trace; needs the otel extra and a configured tracer provider.",
)  # fmt: skip
@click.pass_context
def worker(
    ctx: click.Context, app: str, processes: int, concurrency: int, lease_s: float,
    grace: float, timeout: float | None, timeout_grace: float, max_unsent: int | None,
    worker_id: str | None, metrics_port: int | None, metrics_addr: str, log_level: str,
    log_format: str, hook_specs: tuple[str, ...], otel: bool,
) -> None:  # fmt: skip
    """Run the functions of APP (module:attribute) for the namespace's tasks.

    The attribute is a mapping of name -> function, or a list of functions
    registered under their __name__. SIGTERM or SIGINT shuts down gracefully.
    """
    from distsched.worker import Worker
    from distsched.worker.logs import configure
    from distsched.worker.supervisor import EXIT_REPLACE, PROCESS_ENV

    if not math.isfinite(grace) or grace < 0:
        raise InvalidArgument("grace", "must be a finite number of seconds >= 0")
    if worker_id is not None:
        validate_worker_id(worker_id)
    functions = load_app(app)
    hooks = [hook for spec in hook_specs for hook in load_hooks(spec)]
    if otel:
        from distsched.otel import TracingHooks

        hooks.append(TracingHooks())
    scheduler = _connect(ctx, lease_s=lease_s)
    scheduler.client.ping()  # an unreachable Redis is an error now, not endless retries
    if processes > 1:
        scheduler.close()
        configure(log_level.upper(), log_format)
        ctx.exit(_supervise(
            ctx, app, processes, concurrency, lease_s, grace, worker_id, metrics_port,
            metrics_addr, log_level, log_format, hook_specs, otel, timeout, timeout_grace,
            max_unsent,
        ))  # fmt: skip
    metrics = _serve_metrics(ctx, metrics_port, metrics_addr)
    # A process of a supervisor ends itself to end a def function past its time limit.
    supervised = PROCESS_ENV in os.environ
    pool = Worker(
        scheduler, functions, concurrency=concurrency, worker_id=worker_id, grace=grace,
        metrics=metrics, hooks=hooks, timeout=timeout, timeout_grace=timeout_grace,
        stop_on_overrun=supervised, max_unsent=max_unsent,
    )  # fmt: skip
    # Last, once nothing can fail with a one-line error any more.
    configure(log_level.upper(), log_format)
    pool.run()  # it logs its start-up line and its shutdown summary
    if pool.ended_by_overrun:
        # Its outcomes are reported; the function that ignored its time limit (and any
        # thread it started) ends with the process, which the supervisor replaces.
        logging.shutdown()
        os._exit(EXIT_REPLACE)


def _supervise(
    ctx: click.Context, app: str, processes: int, concurrency: int, lease_s: float,
    grace: float, worker_id: str | None, metrics_port: int | None, metrics_addr: str,
    log_level: str, log_format: str, hook_specs: tuple[str, ...], otel: bool,
    timeout: float | None, timeout_grace: float, max_unsent: int | None = None,
) -> int:  # fmt: skip
    """``worker --processes N``: N one-process workers under a supervisor; its exit status."""
    from distsched.worker.supervisor import Supervisor

    settings = _settings(ctx)
    command = [
        sys.executable, "-m", "distsched.cli", "worker", app, "--processes", "1",
        "--concurrency", str(concurrency), "--lease", repr(lease_s), "--grace", repr(grace),
        "--metrics-addr", metrics_addr, "--log-level", log_level, "--log-format", log_format,
        *(arg for spec in hook_specs for arg in ("--hooks", spec)), *(["--otel"] if otel else []),
        *([] if timeout is None else ["--timeout", repr(timeout)]),
        "--timeout-grace", repr(timeout_grace),
        *([] if max_unsent is None else ["--max-unsent", str(max_unsent)]),
    ]  # fmt: skip

    def child_args(index: int) -> list[str]:
        # Each process its own id and metrics port (PORT + index; 0 stays "any free").
        args = [] if worker_id is None else ["--worker-id", f"{worker_id}-{index}"]
        if metrics_port is not None:
            args += ["--metrics-port", str(metrics_port + index if metrics_port else 0)]
        return args

    # The URL (it may hold a password) and the namespace travel in the environment,
    # not on a command line that every local user can read.
    env = {k: v for k, v in os.environ.items() if k != "DISTSCHED_CLUSTER"}
    env.update(DISTSCHED_REDIS_URL=settings.url, DISTSCHED_NAMESPACE=settings.namespace)
    # A child's shutdown: its grace, then the cancel wait and the last reports (10 s
    # each by default), with a margin.
    supervisor = Supervisor(
        command, processes, env=env, stop_timeout=grace + 30.0, child_args=child_args
    )
    return supervisor.run()


def _serve_metrics(ctx: click.Context, port: int | None, addr: str) -> Any:
    """Start the metrics endpoint (closed when the command ends); None without a port."""
    if port is None:
        return None
    from distsched.metrics import PrometheusMetrics, process_registry, serve_metrics

    metrics = PrometheusMetrics(process_registry())
    try:
        server = serve_metrics(port, addr, metrics.registry)
    except OSError as exc:
        raise click.ClickException(
            f"cannot serve metrics on {addr}:{port}: {one_line(exc)}"
        ) from None
    ctx.call_on_close(server.close)
    click.echo(f"metrics at http://{addr}:{server.port}/metrics", err=True)
    return metrics


def _task_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options that describe a task, shared by ``schedule`` and ``submit``."""
    options = [
        click.option("--fn", required=True, help="Name of the registered function to run."),
        click.option(
            "--args", "args_json", default="[]", metavar="JSON",
            help="Positional args: a JSON list.",
        ),
        click.option(
            "--kwargs", "kwargs_json", default="{}", metavar="JSON",
            help="Keyword args: a JSON object.",
        ),
        click.option(
            "--run-at",
            metavar="WHEN",
            help="Epoch seconds (not milliseconds) or ISO-8601 with offset "
            "(2030-01-01T09:00:00+00:00).",
        ),
        click.option(
            "--delay", type=Duration("delay", signed=True),
            help="From now (server clock): seconds, or 500ms, 30s, 5m, 1h30m, 2d.",
        ),
        click.option(
            "--priority",
            type=int,
            default=0,
            show_default=True,
            help="Higher runs first among tasks due at the same time.",
        ),
        click.option("--max-attempts", type=int, default=1, show_default=True),
        click.option(
            "--backoff",
            type=Duration("backoff"),
            default="1s",
            show_default=True,
            help="Wait before attempt 2 (seconds, or 500ms, 2s, 1m); doubles for each later one.",
        ),
        click.option(
            "--dedupe", is_flag=True,
            help="Keep a queued or running version of ID instead of replacing it.",
        ),
        click.option(
            "--dedupe-window", type=Duration("dedupe_window"), metavar="DURATION",
            help="With dedupe: also keep a version that ended less than this long ago.",
        ),
        click.option(
            "--debounce", type=Duration("debounce"), metavar="MAX_WAIT",
            help="Replace a queued version, but start at most this long after the burst's "
            "first submission.",
        ),
        click.option(
            "--deadline", metavar="WHEN",
            help="Expire (end cancelled) if not started by then: as --run-at.",
        ),
        click.option(
            "--ttl", type=Duration("ttl"), metavar="DURATION",
            help="Expire (end cancelled) if not started this long after now (server clock).",
        ),
        click.option(
            "--key", "fair_key", metavar="KEY",
            help="The fairness key (tenant): keys take turns at the claims (see 'keys').",
        ),
        click.option(
            "--timeout", type=Duration("timeout"), metavar="DURATION",
            help="Time limit of each run (default: the worker's); past it the attempt fails.",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def _task_keywords(
    args_json: str, kwargs_json: str, run_at: str | None, delay: float | None, priority: int,
    max_attempts: int, backoff: float, dedupe: bool = False, dedupe_window: float | None = None,
    debounce: float | None = None, deadline: str | None = None, ttl: float | None = None,
    fair_key: str | None = None, timeout: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The options of ``_task_options`` as ``Scheduler.schedule`` keywords."""
    return {
        "timeout": timeout,
        "key": fair_key,
        "deadline": None if deadline is None else parse_when(deadline, "deadline"),
        "ttl": ttl,
        "dedupe": dedupe,
        "dedupe_window": dedupe_window,
        "debounce": debounce,
        "args": parse_json(args_json, "args", list),
        "kwargs": parse_json(kwargs_json, "kwargs", dict),
        "run_at": None if run_at is None else parse_run_at(run_at),
        "delay": delay,
        "priority": priority,
        "max_attempts": max_attempts,
        "backoff": backoff,
    }


@cli.command()
@click.argument("task_id", metavar="ID")
@_task_options
@click.pass_context
def schedule(
    ctx: click.Context, task_id: str, fn: str, args_json: str, kwargs_json: str,
    run_at: str | None, delay: float | None, priority: int, max_attempts: int, backoff: float,
    dedupe: bool, dedupe_window: float | None, debounce: float | None, deadline: str | None,
    ttl: float | None, fair_key: str | None, timeout: float | None,
) -> None:  # fmt: skip
    """Schedule (or replace) task ID; print its new version.

    With --dedupe, a version kept instead is printed, and a note says so on stderr.
    """
    options = _task_keywords(
        args_json, kwargs_json, run_at, delay, priority, max_attempts, backoff,
        dedupe, dedupe_window, debounce, deadline, ttl, fair_key, timeout,
    )  # fmt: skip
    scheduler = _connect(ctx)
    _echo_admitted(scheduler.admit(task_id, fn=fn, **options))


def _echo_admitted(admitted: Admitted) -> None:
    click.echo(admitted.version)
    if not admitted.created:
        click.echo(f"kept the existing version {admitted.version} (dedupe)", err=True)


@cli.command()
@click.argument("task_id", metavar="ID")
@_task_options
@click.option(
    "--dep",
    "deps",
    multiple=True,
    metavar="ID",
    help="A required dependency: the task runs only after it succeeded. Repeatable.",
)
@click.option(
    "--optional-dep",
    "optional_deps",
    multiple=True,
    metavar="ID",
    help="An optional dependency: waited for, but any outcome will do. Repeatable.",
)
@click.option(
    "--allow-unknown",
    is_flag=True,
    help="Accept dependencies not submitted yet, and wait for them.",
)
@click.pass_context
def submit(
    ctx: click.Context, task_id: str, fn: str, args_json: str, kwargs_json: str,
    run_at: str | None, delay: float | None, priority: int, max_attempts: int, backoff: float,
    deps: tuple[str, ...], optional_deps: tuple[str, ...], allow_unknown: bool,
    dedupe: bool, dedupe_window: float | None, debounce: float | None, deadline: str | None,
    ttl: float | None, fair_key: str | None, timeout: float | None,
) -> None:  # fmt: skip
    """Submit (or replace) task ID after its dependencies; print its new version.

    The task waits (pending) until every --dep has succeeded and every
    --optional-dep has ended; a failed, cancelled or blocked --dep blocks it.
    A dependency cycle is refused with its path.
    """
    options = _task_keywords(
        args_json, kwargs_json, run_at, delay, priority, max_attempts, backoff,
        dedupe, dedupe_window, debounce, deadline, ttl, fair_key, timeout,
    )  # fmt: skip
    scheduler = _connect(ctx)
    try:
        admitted = scheduler.admit(
            task_id, fn=fn, deps=deps, optional_deps=optional_deps,
            allow_unknown=allow_unknown, **options,
        )  # fmt: skip
    except CycleError as exc:
        raise click.ClickException(
            f"refused, nothing written: dependency cycle: {views.show_path(exc.path)}"
        ) from None
    except UnknownDependencyError as exc:
        namespace = _settings(ctx).namespace
        raise click.ClickException(
            f"unknown dependency {exc.dependency!r}: no such task in namespace {namespace!r} "
            "(submit it first, or pass --allow-unknown to wait for it)"
        ) from None
    _echo_admitted(admitted)


@cli.command()
@click.argument("task_id", metavar="ID")
@click.pass_context
def cancel(ctx: click.Context, task_id: str) -> None:
    """Cancel task ID; print its state after the call.

    A queued task is cancelled at once and never runs. A running one prints
    'running': its function is asked to stop and the task ends cancelled
    when it does.
    """
    scheduler = _connect(ctx)
    with _task(ctx, task_id):
        state = scheduler.cancel(task_id)
    click.echo(state.value)


@cli.command()
@click.argument("task_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (always in full).")
@click.option("--full", is_flag=True, help="Print args, kwargs, result and error in full.")
@click.option(
    "--preview", "preview_chars", type=click.IntRange(min=1), default=PREVIEW_CHARS,
    show_default=True, help="Characters shown of args, kwargs, result and error.",
)  # fmt: skip
@click.option(
    "--wait",
    "wait",
    is_flag=True,
    help="Wait until the task has ended, then show it; exit 0 when it succeeded, 1 when "
    f"it failed, was cancelled or is blocked, {EXIT_TIMEOUT} on --timeout.",
)
@click.option(
    "--timeout", type=Duration("timeout"), default=None,
    help=f"With --wait: give up after this long ({DURATION_HINT}); default: no limit.",
)  # fmt: skip
@click.pass_context
def status(
    ctx: click.Context,
    task_id: str,
    as_json: bool,
    full: bool,
    preview_chars: int,
    wait: bool,
    timeout: float | None,
) -> None:
    """Show task ID (key: value lines, or --json).

    Large args, kwargs, results and errors are cut to a preview that gives
    their size; --full prints them whole. With --wait, first wait (without
    polling) until the task has ended; the exit code then tells how it ended.
    """
    if timeout is not None and not wait:
        raise click.UsageError("--timeout goes with --wait")
    scheduler = _connect(ctx)
    with _task(ctx, task_id):
        if not wait:
            info = scheduler.status(task_id)
        else:
            try:
                info = scheduler.wait(task_id, timeout)
            except Timeout:
                shown = escape(repr(task_id))
                click.echo(f"task {shown} did not end within {timeout:g}s", err=True)
                ctx.exit(EXIT_TIMEOUT)
    if as_json:
        click.echo(json_line(info_dict(info)))
    else:
        limit = None if full else preview_chars
        lines = _status_lines(info, scheduler.server_time(), limit)
        width = max(len(key) for key, _ in lines)
        for key, value in lines:
            click.echo(f"{key + ':' if key else '':<{width + 1}} {value}")
    if wait and info.state is not State.SUCCEEDED:
        ctx.exit(1)


def _quoted(text: str | None, limit: int | None) -> str:
    """A stored string quoted, escaped and cut, as an error message names it."""
    return "None" if text is None else escape(repr(text if limit is None else text[:limit]))


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _why_lines(exp: Explanation, limit: int | None = CUT_CHARS) -> list[str]:
    """The explanation in plain sentences: a headline, then one line per reason; every
    stored string escaped and cut to ``limit`` characters (None: whole)."""
    now = exp.server_time
    fn = views.show_id(exp.fn, limit) if exp.fn else "(unreadable payload)"
    lines = [
        f"{views.show_id(exp.task_id, limit)} (version {exp.version}, fn {fn}) "
        f"is {exp.state.value}" + ("." if exp.state is State.RUNNING else ", not running:")
    ]
    spent = f"{exp.attempt} of {exp.max_attempts} attempts"
    for reason in exp.reasons:
        if reason is Reason.RUNNING:
            lease = "with no lease recorded"
            if exp.lease_deadline is not None:
                lease = f"until {iso(exp.lease_deadline)} ({relative(exp.lease_deadline, now)})"
            text = (
                f"it runs attempt {exp.attempt} of {exp.max_attempts}, leased by "
                f"{views.show_id(exp.worker or '?', limit)} {lease}"
            )
        elif reason is Reason.CANCEL_REQUESTED:
            text = (
                "cancel requested: its function is asked to stop at the next heartbeat, "
                "and the task ends cancelled when it does"
            )
        elif reason is Reason.LEASE_EXPIRED:
            ago = now - (exp.lease_deadline or now)
            then = "retries it" if exp.attempts_left else "fails it (no attempt left)"
            text = f"its lease expired {ago:.3f} s ago: the next reap {then}"
        elif reason is Reason.SUCCEEDED:
            text = f"it succeeded at {iso(exp.updated_at)}"
        elif reason is Reason.FAILED:
            error = show(one_line(exp.error), limit) if exp.error else "no error recorded"
            text = f"it failed at {iso(exp.updated_at)} after {spent}: {error}"
        elif reason is Reason.CANCELLED:
            text = f"it was cancelled at {iso(exp.updated_at)}"
        elif reason is Reason.EXPIRED:
            text = (
                "it expired: it was not started by its deadline"
                if exp.state is State.CANCELLED
                else "its root cause expired: it was not started by its deadline"
            )
        elif reason is Reason.BLOCKED:
            cause = exp.blocked_by
            if cause is None:
                text = "it is blocked; its root cause is not recorded"
            else:
                root_state = exp.root_state.value if exp.root_state else "no longer readable"
                text = (
                    f"it is blocked by {views.show_id(cause.root, limit)} ({root_state}), "
                    f"via {views.show_path(cause.path, limit)}"
                )
        elif reason is Reason.PLACING:
            text = (
                "it is held while its dependencies are placed in parts; if this stays, "
                "the submission stopped part way: schedule it again or cancel it"
            )
        elif reason is Reason.WAITING_ON_DEPS:
            waits = _count(exp.remaining, "required dependency", "required dependencies")
            text = f"it waits on {waits}"
            if exp.optional_remaining:
                text += f" and {exp.optional_remaining} optional"
            if exp.deps:
                text += ":"
        elif reason is Reason.NOT_DUE:
            due = exp.due_at or now
            retry = f" (a retry after backoff, {spent} spent)" if exp.attempt else ""
            text = (
                f"it is not due yet: due at {iso(due)} ({relative(due, now)}, server clock){retry}"
            )
        elif reason is Reason.UNSERVED:
            last = (
                "none ever announced it"
                if exp.served_at is None
                else f"last announced {now - exp.served_at:.0f} s ago"
            )
            text = f"no live worker serves its function {fn}: {last}"
        elif reason is Reason.CAPACITY:
            text = f"capacity is full: {exp.running} running, max_running {exp.max_running}"
        elif reason is Reason.BEHIND:
            text = (
                f"it is due, {_count(exp.ahead or 0, 'queue entry', 'queue entries')} ahead of it "
                "(live tasks, and stale entries of replaced or cancelled tasks)"
            )
        elif reason is Reason.KEY_CAPPED:
            text = (
                f"its fairness key {_quoted(exp.fair_key, limit)} is at its cap: "
                f"{exp.key_running} running, cap {exp.key_cap}"
            )
        elif reason is Reason.KEY_RATE:
            due = exp.key_next_at or now
            text = (
                f"its fairness key {_quoted(exp.fair_key, limit)} used its rate of "
                f"{exp.key_rate} per {exp.key_per_s:g} s: "
                f"next start at {iso(due)} ({relative(due, now)})"
            )
        elif reason is Reason.NEXT:
            text = "it is due and first in line: the next worker with a free slot claims it"
        else:
            text = "it is ready but has no queue entry (its data was changed outside distsched)"
        lines.append(f"- {text}")
        if reason is Reason.WAITING_ON_DEPS:
            for dep in exp.deps:
                kind = " (optional)" if dep.optional else ""
                state = dep.state.value if dep.state else "no record (not submitted yet)"
                lines.append(f"    {views.show_id(dep.task_id, limit)}{kind}: {state}")
            if exp.deps_not_shown:
                lines.append(f"    ... and {exp.deps_not_shown} more not shown")
    if not exp.state.terminal and exp.state is not State.RUNNING:
        lines.append(f"{spent} spent, {exp.attempts_left} left.")
    return lines


@cli.command()
@click.argument("task_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--full", is_flag=True, help="Print ids and the error whole (not cut).")
@click.pass_context
def why(ctx: click.Context, task_id: str, as_json: bool, full: bool) -> None:
    """Why task ID is not running (or that it is), in plain sentences.

    Times are on the Redis server's clock. A due task's place counts the queue
    entries ahead of it, stale ones included.
    """
    scheduler = _connect(ctx)
    with _task(ctx, task_id):
        exp = scheduler.explain(task_id)
    if as_json:
        data = jsonable(exp)
        data["reasons"] = [reason.value for reason in exp.reasons]
        click.echo(json_line(data))
        return
    for line in _why_lines(exp, None if full else CUT_CHARS):
        click.echo(line)


def _require_namespace(ctx: click.Context, scheduler: Scheduler) -> None:
    """A namespace without a single key is most likely a typo: say so."""

    if not scheduler.exists():
        settings = _settings(ctx)
        raise click.ClickException(
            f"namespace {settings.namespace!r} does not exist at {redact(settings.url)} "
            "(it has no keys: check --namespace and --redis)"
        )


def _by_priority(ages: Mapping[str, float]) -> list[tuple[str, float]]:
    """The per-priority oldest waits, highest priority bucket first."""
    order = {label: i for i, label in enumerate(reversed(PRIORITY_LABELS))}
    return sorted(ages.items(), key=lambda item: order.get(item[0], len(order)))


def _stats_lines(data: Mapping[str, Any]) -> list[str]:
    rows: list[tuple[str, ...]] = [("state", "tasks")]
    rows += [(state, str(count)) for state, count in data["counts"].items()]
    limit = data["max_running"]
    oldest = data["oldest_ready_age"]
    soon = f"{data['leases_soon_s']:g} s"
    return [*table(rows), "", *table([
        ("queue entries", f"{data['queue_entries']} ({data['live_entries']} live, "
                          f"{data['stale_entries']} stale)"),
        ("stale ratio", f"{100 * data['stale_ratio']:.1f}%"),
        ("oldest due", "-" if oldest is None else f"{oldest:.3f} s waiting to start"),
        *[(f"  priority {bucket}", f"{age:.3f} s")
          for bucket, age in _by_priority(data["oldest_ready_age_by_priority"])],
        ("order", data["order"] if data["order"] == "default"
                  else f"priority (aging {data['aging_s']:g} s per point)"),
        ("running", f"{data['running']} (max_running: "
                    f"{'unlimited' if limit is None else limit})"),
        ("leases", f"{data['leases']} ({data['leases_expired']} expired, "
                   f"{data['leases_expiring']} expiring within {soon})"),
        ("retention", duration(data["retention_s"])),
        ("sequence", str(data["sequence"])),
        *[(f"  key {load['key']!r}" if load["key"] else "  key '' (default)",
           f"{load['running']} running (cap {'none' if load['cap'] is None else load['cap']}), "
           f"{load['queued']} queued"
           + ("" if load["ready_wait_s"] is None
              else f", first due {load['ready_wait_s']:.3f} s waiting"))
          for load in data.get("keys", [])],
    ])]  # fmt: skip


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one line per draw).")
@click.option("--watch", is_flag=True, help="Redraw every --interval until Ctrl-C.")
@click.option(
    "--interval", type=Duration("interval"), default="2s", show_default=True,
    help="Time between draws with --watch (seconds, or 500ms, 10s, 1m).",
)  # fmt: skip
@click.option(
    "--count", type=click.IntRange(min=1), default=None,
    help="With --watch: stop after this many draws.",
)  # fmt: skip
@click.option(
    "--soon", "soon_s", type=Duration("soon_s"), default="5s", show_default=True,
    help="Count the leases whose deadline is this close (seconds, or 500ms, 10s, 1m).",
)  # fmt: skip
@click.pass_context
def stats(
    ctx: click.Context, as_json: bool, watch: bool, interval: float, count: int | None,
    soon_s: float,
) -> None:  # fmt: skip
    """Tasks per state, queue entries (live, stale), the oldest due task's wait,
    running vs max_running, leases (expired, expiring soon) and retention.

    All times are on the Redis server's clock.
    """
    if interval < 0.01:
        raise InvalidArgument("interval", "must be at least 10ms")
    scheduler = _connect(ctx)
    _require_namespace(ctx, scheduler)
    settings = _settings(ctx)
    interactive = watch and not as_json and sys.stdout.isatty()
    draws = 0
    try:
        while True:
            data = scheduler.overview(soon_s)
            if as_json:
                click.echo(json.dumps(data))
            else:
                if interactive:
                    click.clear()
                if watch:
                    if draws and not interactive:
                        click.echo("")
                    click.echo(
                        f"namespace {settings.namespace!r} at {redact(settings.url)}, "
                        f"{iso(data['server_time'])}"
                    )
                for line in _stats_lines(data):
                    click.echo(line)
            draws += 1
            if not watch or (count is not None and draws >= count):
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how --watch ends


@cli.command(context_settings={"ignore_unknown_options": True})  # '-1' is a value here
@click.argument("seconds", required=False, metavar="[SECONDS]")
@click.pass_context
def retention(ctx: click.Context, seconds: str | None) -> None:
    """Show, or set to SECONDS, how long terminal tasks are kept.

    SECONDS is a number of seconds or has a unit: 500ms, 90s, 30m, 12h, 7d.
    The setting belongs to the namespace (default 24 h). Workers purge older
    succeeded, failed, cancelled and blocked tasks, with their payloads,
    results and edges, as they go.
    """
    scheduler = _connect(ctx)
    namespace = _settings(ctx).namespace
    if seconds is None:
        _require_namespace(ctx, scheduler)
        kept = scheduler.stats()["retention_s"]
        click.echo(f"retention of namespace {namespace!r}: {duration(kept)}")
        return
    value = parse_duration(seconds, "retention_s")
    scheduler.set_retention(value)
    kept = scheduler.stats()["retention_s"]
    click.echo(f"retention of namespace {namespace!r} set to {duration(kept)}")


@cli.command("max-running", context_settings={"ignore_unknown_options": True})
@click.argument("limit", required=False, metavar="[N|none]")
@click.pass_context
def max_running(ctx: click.Context, limit: str | None) -> None:
    """Show, or set to N, how many tasks of the namespace may run at once.

    The bound holds across every worker of the namespace; `none` removes it,
    0 pauses claiming (running tasks finish).
    """
    scheduler = _connect(ctx)
    namespace = _settings(ctx).namespace

    def shown(value: int | None) -> str:
        return "unlimited" if value is None else str(value)

    if limit is None:
        _require_namespace(ctx, scheduler)
        current = scheduler.stats()["max_running"]
        click.echo(f"max_running of namespace {namespace!r}: {shown(current)}")
        return
    value: int | None
    if limit.strip().lower() in ("none", "unlimited"):
        value = None
    else:
        try:
            value = int(limit)
        except ValueError:
            value = -1
        if value < 0:
            raise InvalidArgument(
                "max_running", f"must be a whole number >= 0 or 'none', got {limit!r}"
            )
    scheduler.set_max_running(value)
    current = scheduler.stats()["max_running"]
    click.echo(f"max_running of namespace {namespace!r} set to {shown(current)}")


@cli.command("payload-limit")
@click.argument("limit", required=False, metavar="[BYTES|default]")
@click.pass_context
def payload_limit(ctx: click.Context, limit: str | None) -> None:
    """Show, or set to BYTES, the largest payload the namespace accepts.

    An operator's setting (at most 1 MiB, the default: a namespace may set less);
    `default` restores 1 MiB.
    """
    scheduler = _connect(ctx)
    namespace = _settings(ctx).namespace
    if limit is None:
        click.echo(f"payload limit of namespace {namespace!r}: {scheduler.payload_limit()} bytes")
        return
    value: int | None = None
    if limit.strip().lower() != "default":
        try:
            value = int(limit)
        except ValueError:
            raise InvalidArgument(
                "payload_max", f"must be a whole number of bytes or 'default', got {limit!r}"
            ) from None
    now = scheduler.set_payload_limit(value)
    click.echo(f"payload limit of namespace {namespace!r} set to {now} bytes")


@cli.command()
@click.argument("count", required=False, type=click.IntRange(min=1, max=MAX_STRIPES))
@click.pass_context
def stripes(ctx: click.Context, count: int | None) -> None:
    """Show the namespace's stripes (hash slots, and nodes on a cluster), or set
    their COUNT.

    A new count is taken only while the namespace holds no task, since ids map to
    stripes by hash; restart the workers after changing it.
    """
    scheduler = _connect(ctx)
    namespace = _settings(ctx).namespace
    if count is not None:
        changed = Scheduler(scheduler.client, namespace=namespace, stripes=count)
        changed.close()
    rows = [["stripe", "keys", "slot", "node"]]
    client = scheduler.client
    for keys in scheduler.stripe_keys():
        slot = key_slot(keys.meta.encode())
        node = "-"
        if isinstance(client, RedisCluster):
            owner = client.nodes_manager.get_node_from_slot(slot)
            node = owner.name if owner is not None else "?"
        rows.append([str(keys.stripe), keys.prefix + "*", str(slot), node])
    click.echo(f"namespace {namespace!r}: {len(rows) - 1} stripe(s)")
    for line in table(rows, right=frozenset({0, 2})):
        click.echo(line)


@cli.command()
@click.argument("order", required=False, type=click.Choice(["default", "priority"]))
@click.option(
    "--aging", "aging_s", type=Duration("aging"), default="60s", show_default=True,
    help="With priority: the wait one point of priority is worth (seconds, or 500ms, 1m).",
)  # fmt: skip
@click.pass_context
def order(ctx: click.Context, order: str | None, aging_s: float) -> None:
    """Show, or set, the order in which workers take the namespace's due tasks.

    default: first due, first served (ties by priority, then submission).
    priority: the highest priority first, each point of priority worth --aging of
    waiting, so a task waits at most (highest priority - its priority) x aging
    behind tasks that became due after it. Queued tasks follow the new order.
    """
    scheduler = _connect(ctx)
    namespace = _settings(ctx).namespace

    def shown(setting: OrderSetting) -> str:
        if setting.order is Order.DEFAULT:
            return "default"
        return f"priority, aging {setting.aging_s:g} s per point"

    if order is None:
        _require_namespace(ctx, scheduler)
        click.echo(f"order of namespace {namespace!r}: {shown(scheduler.order())}")
        return
    setting = scheduler.set_order(order, aging=aging_s)
    click.echo(f"order of namespace {namespace!r} set to {shown(setting)}")


@cli.group()
def keys() -> None:
    """Fairness keys (tenants): caps, weights, and what each one runs and queues."""


def _key_line(info: KeyInfo) -> str:
    cap = info.cap if info.cap is not None else info.default_cap
    shown_cap = "none" if cap is None else str(cap)
    if info.cap is None and info.default_cap is not None:
        shown_cap += " (default)"
    name = repr(info.key) if info.key else "'' (default key)"
    rate = "" if info.rate is None else f", rate {info.rate} per {info.per_s:g} s"
    return (
        f"{name}: cap {shown_cap}, weight {info.weight}{rate}, running {info.running}, "
        f"queued {info.queued}, {info.turn}"
    )


@keys.command("set")
@click.argument("key")
@click.option("--cap", type=int, default=None, help="Most tasks of KEY running at once.")
@click.option("--weight", type=int, default=1, show_default=True, help="Share of claims.")
@click.option("--rate", type=int, default=None, help="Most tasks of KEY started per --per.")
@click.option(
    "--per", "per_s", type=Duration("per"), default="1s", show_default=True,
    help="The interval of --rate (seconds, or 500ms, 1m).",
)  # fmt: skip
@click.pass_context
def keys_set(
    ctx: click.Context, key: str, cap: int | None, weight: int, rate: int | None, per_s: float
) -> None:
    """Set KEY's cap, weight and rate ('' is the default key); no --cap: the default cap."""
    scheduler = _connect(ctx)
    info = scheduler.set_key(key, cap=cap, weight=weight, rate=rate, per=per_s)
    click.echo(_key_line(info))


@keys.command("default")
@click.argument("cap")
@click.pass_context
def keys_default(ctx: click.Context, cap: str) -> None:
    """Set the cap of every key without its own: a whole number, or 'none'."""
    scheduler = _connect(ctx)
    value: int | None = None
    if cap.lower() != "none":
        try:
            value = int(cap)
        except ValueError:
            raise InvalidArgument("cap", f"must be a whole number or 'none', got {cap!r}") from None
    scheduler.set_default_key_cap(value)
    click.echo(f"default key cap set to {cap.lower() if value is None else value}")


@keys.command("show")
@click.argument("key")
@click.pass_context
def keys_show(ctx: click.Context, key: str) -> None:
    """KEY's settings, running and queued tasks."""
    scheduler = _connect(ctx)
    click.echo(_key_line(scheduler.key_info(key)))


@keys.command("list")
@click.option("--limit", type=int, default=100, show_default=True)
@click.pass_context
def keys_list(ctx: click.Context, limit: int) -> None:
    """Keys with work or settings, most running first."""
    scheduler = _connect(ctx)
    infos = scheduler.fair_keys(limit)
    if not infos:
        click.echo("no fairness keys")
    for info in infos:
        click.echo(_key_line(info))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON: one object per worker.")
@click.pass_context
def workers(ctx: click.Context, as_json: bool) -> None:
    """The namespace's workers as they last registered (every heartbeat rewrites each).

    A worker shows as silent once it missed a few heartbeats; one that stays silent
    (killed, cut off) drops out of the list a few leases later.
    """
    scheduler = _connect(ctx)
    _require_namespace(ctx, scheduler)
    found = scheduler.workers()
    if as_json:
        click.echo(json_line([jsonable(info) for info in found]))
        return
    if not found:
        click.echo("no workers")
        return
    rows: list[tuple[str, ...]] = [
        ("worker", "host", "pid", "version", "running", "state", "last beat", "up", "functions",
         "counts"),
    ]  # fmt: skip
    now = scheduler.server_time()
    for info in found:
        counts = ", ".join(f"{k} {v}" for k, v in info.counts.items() if v)
        rows.append((
            show(one_line(info.worker_id)),
            show(one_line(info.host)),
            str(info.pid),
            show(one_line(info.version)),
            f"{info.running}/{info.concurrency}",
            "alive" if info.alive else "silent",
            f"{info.seen_ago:.1f} s ago",
            duration(round(max(0.0, now - info.started))),
            show(one_line(", ".join(info.functions))),
            show(counts) if counts else "-",
        ))  # fmt: skip
    for line in table(rows, right=frozenset({2})):
        click.echo(line)


@cli.group()
def leases() -> None:
    """Inspect, expire and reap leases of running tasks."""


@leases.command("list")
@click.pass_context
def leases_list(ctx: click.Context) -> None:
    """Running tasks: holder, attempt and time left on the lease (server clock)."""
    scheduler = _connect(ctx)
    _require_namespace(ctx, scheduler)
    held = views.leases(scheduler)
    if not held:
        click.echo("no leases")
        return
    rows: list[tuple[str, ...]] = [("task", "holder", "attempt", "time left")]
    for lease in held:
        left = lease.seconds_left
        rows.append((
            views.show_id(lease.task_id),
            show(lease.worker),
            f"{lease.attempt}/{lease.max_attempts}",
            f"{left:.3f} s" if left >= 0 else f"expired {-left:.3f} s ago",
        ))  # fmt: skip
    for line in table(rows):
        click.echo(line)


@leases.command("expire")
@click.argument("task_id", metavar="ID")
@click.pass_context
def leases_expire(ctx: click.Context, task_id: str) -> None:
    """Expire task ID's lease now, as if its holder had vanished.

    The task gets a new attempt while attempts remain, otherwise it fails.
    """
    scheduler = _connect(ctx)
    with _task(ctx, task_id):
        expired = scheduler.expire_lease(task_id)
        info = scheduler.status(task_id)
    if not expired:
        raise click.ClickException(f"task {task_id!r} holds no lease (it is {info.state.value})")
    detail = f"attempt {info.attempt} of {info.max_attempts} used"
    click.echo(f"expired the lease of {task_id!r}: now {info.state.value} ({detail})")


@leases.command("reap")
@click.pass_context
def leases_reap(ctx: click.Context) -> None:
    """Handle every expired lease now (workers also do this as they go)."""
    scheduler = _connect(ctx)
    _require_namespace(ctx, scheduler)
    total = 0
    while True:
        handled = scheduler.reap()
        total += handled
        if handled == 0:
            break
    click.echo(f"reaped {total} expired lease{'s' if total != 1 else ''}")


# --------------------------------------------------------------------------- library


@cli.group("library")
def library_group() -> None:
    """The Redis Functions library the scripts run from: install it (admin), check it.

    Tenants need no right to load functions: an admin installs the library once per
    version, and clients check it byte for byte before they call it (README, Security).
    """


def _library_lines(report: library.NodeLibrary) -> list[str]:
    name = scripts.library_name()
    found = {
        Check.SAME: f"{name} is the exact library",
        Check.MISSING: f"{name} is missing",
        Check.DIFFERENT: f"{name} holds OTHER code than this version ships",
    }[report.found]
    done = {
        None: found,
        library.Action.UNCHANGED: f"{name} already installed, byte for byte: unchanged",
        library.Action.INSTALLED: f"installed {name}",
        library.Action.REPLACED: f"replaced {name}, which held other code",
    }[report.action]
    lines = [f"{report.node}: {done}"]
    if report.pruned:
        lines.append(f"  deleted other versions: {', '.join(report.pruned)}")
    if report.others:
        lines.append(f"  other versions left: {', '.join(report.others)} (--prune deletes them)")
    return lines


@library_group.command("install")
@click.option(
    "--prune",
    is_flag=True,
    help="Also delete the libraries of other distsched versions (once none of their clients runs).",
)
@click.pass_context
def library_install(ctx: click.Context, prune: bool) -> None:
    """Load this version's library on every master (or the one server); idempotent.

    Needs the admin ACL (FUNCTION LOAD): a node that holds it byte for byte is left as
    it is, a missing one is loaded, one with other code under its name is replaced.
    """
    client = _connect(ctx).client
    try:
        reports = library.install(client, prune=prune)
    except redis.exceptions.NoPermissionError as exc:
        raise click.ClickException(
            f"{one_line(exc)}: installing the library needs the admin ACL (README, Security)"
        ) from None
    for report in reports:
        for line in _library_lines(report):
            click.echo(line)


@library_group.command("check")
@click.pass_context
def library_check(ctx: click.Context) -> None:
    """Say whether each master holds this version's exact library; exit 1 if one does not."""
    reports = library.check(_connect(ctx).client)
    for report in reports:
        for line in _library_lines(report):
            click.echo(line)
    if any(report.found is not Check.SAME for report in reports):
        ctx.exit(1)


# --------------------------------------------------------------------------- schedules


@cli.group("schedules")
def schedules_group() -> None:
    """Recurring tasks: add, list, pause, resume, trigger, backfill and remove schedules.

    The workers fire each slot of a schedule exactly once; its task is NAME@<slot ms>.
    """


def _when_text(sc: Schedule) -> str:
    if sc.cron is not None:
        return f"cron {sc.cron!r} {sc.tz}"
    return f"every {duration(sc.interval or 0.0)}"


def _schedule_state(sc: Schedule) -> str:
    if sc.paused:
        return "paused"
    return "ended" if sc.next_fire is None else "active"


def _schedule_dict(sc: Schedule) -> dict[str, Any]:
    data = jsonable(dataclasses.asdict(sc))
    data["overlap"], data["catchup"] = sc.overlap.value, sc.catchup.value
    data["state"] = _schedule_state(sc)
    return dict(data)


@schedules_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def schedules_list(ctx: click.Context, as_json: bool) -> None:
    """Every schedule: when it fires, its next slot, policy and counters."""
    scheduler = _connect(ctx)
    found = scheduler.schedules()
    if as_json:
        click.echo(json_line([_schedule_dict(sc) for sc in found]))
        return
    if not found:
        click.echo("no schedules")
        return
    now = scheduler.server_time()
    rows: list[tuple[str, ...]] = [
        ("name", "fn", "when", "state", "next fire", "overlap", "timeout", "fired", "skipped",
         "missed")
    ]  # fmt: skip
    for sc in found:
        next_fire = (
            "-" if sc.next_fire is None else f"{iso(sc.next_fire)} ({relative(sc.next_fire, now)})"
        )
        rows.append((
            show(one_line(sc.name)), show(one_line(sc.fn)), show(one_line(_when_text(sc))),
            _schedule_state(sc),
            next_fire, sc.overlap.value, "-" if sc.timeout is None else f"{sc.timeout:g} s",
            str(sc.fired), str(sc.skipped), str(sc.missed),
        ))  # fmt: skip
    for line in table(rows, right=frozenset({7, 8, 9})):
        click.echo(line)


@schedules_group.command("add")
@click.argument("name")
@click.option("--fn", required=True, help="Name of the registered function to run.")
@click.option(
    "--args", "args_json", default="[]", metavar="JSON", help="Positional args: a JSON list."
)
@click.option(
    "--kwargs", "kwargs_json", default="{}", metavar="JSON", help="Keyword args: a JSON object."
)
@click.option(
    "--cron", metavar="EXPR", help="Cron expression, e.g. '0 9 * * MON-FRI' (needs the cron extra)."
)
@click.option(
    "--tz", default="UTC", show_default=True, help="Time zone of --cron, e.g. Europe/Madrid."
)
@click.option("--interval", type=Duration("interval"), help="Fire every DURATION (30s, 5m, 1h).")
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--max-attempts", type=int, default=1, show_default=True)
@click.option("--backoff", type=Duration("backoff"), default=1.0, show_default=True)
@click.option(
    "--start", metavar="WHEN", help="First slot no earlier than this (epoch s or ISO-8601)."
)
@click.option("--end", metavar="WHEN", help="No slot after this (epoch s or ISO-8601).")
@click.option(
    "--jitter", type=Duration("jitter"), default=0.0, help="Delay each run by up to DURATION."
)
@click.option("--paused", is_flag=True, help="Add it paused.")
@click.option(
    "--overlap", type=click.Choice([o.value for o in Overlap]), default="skip", show_default=True,
    help="What a slot does while the previous run is still queued or running.",
)  # fmt: skip
@click.option(
    "--catchup", type=click.Choice(["all", "latest"]), default="latest", show_default=True,
    help="After an outage, fire all missed slots within the window, or only the latest.",
)  # fmt: skip
@click.option(
    "--catchup-window", type=Duration("catchup_window"), default=3600.0, show_default=True,
    help="How far back missed slots still fire (older ones are counted as missed).",
)  # fmt: skip
@click.option(
    "--key", "fair_key", metavar="KEY",
    help="Fairness key (tenant) of the tasks it fires (default: the default key).",
)  # fmt: skip
@click.option(
    "--timeout", type=Duration("timeout"), metavar="DURATION",
    help="Time limit of each run it fires (default: the worker's); past it the attempt fails.",
)  # fmt: skip
@click.pass_context
def schedules_add(
    ctx: click.Context, name: str, fn: str, args_json: str, kwargs_json: str, cron: str | None,
    tz: str, interval: float | None, priority: int, max_attempts: int, backoff: float,
    start: str | None, end: str | None, jitter: float, paused: bool, overlap: str, catchup: str,
    catchup_window: float, fair_key: str | None, timeout: float | None,
) -> None:  # fmt: skip
    """Add (or replace) schedule NAME; print its next fire time."""
    options: ScheduleOptions = {
        "args": parse_json(args_json, "args", list),
        "kwargs": parse_json(kwargs_json, "kwargs", dict),
        "cron": cron, "tz": tz, "interval": interval, "priority": priority,
        "max_attempts": max_attempts, "backoff": backoff,
        "start": None if start is None else parse_when(start, "start"),
        "end": None if end is None else parse_when(end, "end"),
        "jitter": jitter, "paused": paused, "overlap": overlap, "catchup": catchup,
        "catchup_window": catchup_window, "key": fair_key, "timeout": timeout,
    }  # fmt: skip
    scheduler = _connect(ctx)
    sc = scheduler.add_schedule(name, fn, **options)
    click.echo(f"{sc.name}: {_when_text(sc)}, {_schedule_state(sc)}, next fire {iso(sc.next_fire)}")


@schedules_group.command("remove")
@click.argument("name")
@click.pass_context
def schedules_remove(ctx: click.Context, name: str) -> None:
    """Remove schedule NAME (the tasks it created stay)."""
    scheduler = _connect(ctx)
    if not scheduler.remove_schedule(name):
        raise click.ClickException(
            f"no schedule {name!r} in namespace {_settings(ctx).namespace!r}"
        )
    click.echo(f"removed {name}")


@schedules_group.command("pause")
@click.argument("name")
@click.pass_context
def schedules_pause(ctx: click.Context, name: str) -> None:
    """Stop firing NAME until it is resumed."""
    sc = _connect(ctx).pause_schedule(name)
    click.echo(f"{sc.name}: paused")


@schedules_group.command("resume")
@click.argument("name")
@click.pass_context
def schedules_resume(ctx: click.Context, name: str) -> None:
    """Fire NAME again from its next slot after now (slots while paused are not caught up)."""
    sc = _connect(ctx).resume_schedule(name)
    click.echo(f"{sc.name}: {_schedule_state(sc)}, next fire {iso(sc.next_fire)}")


@schedules_group.command("trigger")
@click.argument("name")
@click.pass_context
def schedules_trigger(ctx: click.Context, name: str) -> None:
    """Run NAME now, through its overlap policy; print the task id."""
    scheduler = _connect(ctx)
    task_id = scheduler.trigger(name)
    if task_id is None:
        policy = scheduler.get_schedule(name).overlap.value
        click.echo(f"skipped: the previous run is still queued or running (overlap {policy})")
        return
    click.echo(task_id)


@schedules_group.command("backfill")
@click.argument("name")
@click.option("--start", required=True, metavar="WHEN", help="Epoch seconds or ISO-8601.")
@click.option(
    "--end", required=True, metavar="WHEN", help="Epoch seconds or ISO-8601 (not in the future)."
)
@click.option(
    "--limit", type=int, default=MAX_BACKFILL_SLOTS, show_default=True,
    help="The most slots created by this call, from the earliest.",
)  # fmt: skip
@click.pass_context
def schedules_backfill(ctx: click.Context, name: str, start: str, end: str, limit: int) -> None:
    """Create the tasks of NAME's slots within [--start, --end]; print how many.

    Slots whose task exists already (fired, or backfilled before) create nothing.
    """
    scheduler = _connect(ctx)
    created = scheduler.backfill(name, parse_when(start, "start"), parse_when(end, "end"), limit)
    click.echo(f"created {created} task{'s' if created != 1 else ''}")


@schedules_group.command("next")
@click.argument("name")
@click.option("-n", "n", type=int, default=5, show_default=True, help="How many.")
@click.pass_context
def schedules_next(ctx: click.Context, name: str, n: int) -> None:
    """The next fire times of NAME (UTC, and local time for a cron schedule)."""
    scheduler = _connect(ctx)
    sc = scheduler.get_schedule(name)
    for when in scheduler.next_fires(name, n):
        line = iso(when)
        if sc.cron is not None:
            local = datetime.datetime.fromtimestamp(when, ZoneInfo(sc.tz))
            line += f"  {local.isoformat()} {sc.tz}"
        click.echo(line)


@cli.command()
@click.argument("task_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option(
    "--limit",
    type=int,
    default=views.DEFAULT_LIMIT,
    show_default=True,
    help="Read at most this many tasks.",
)
@click.option("--full", is_flag=True, help="Print ids and errors whole (not cut).")
@click.pass_context
def graph(ctx: click.Context, task_id: str, as_json: bool, limit: int, full: bool) -> None:
    """Show what task ID depends on and what depends on it, with their states.

    Optional edges are marked [optional]; a blocked task names the task whose
    failure or cancellation blocked it, and the path from there.
    """
    if limit < 1:
        raise InvalidArgument("limit", "must be at least 1")
    scheduler = _connect(ctx)
    with _task(ctx, task_id):
        hood = views.walk(scheduler, task_id, limit=limit)
    if as_json:
        data = views.render_json(hood)
        click.echo(json_line(jsonable(data)))
        return
    for line in views.render_text(hood, _settings(ctx).namespace, None if full else CUT_CHARS):
        click.echo(line)


TERMINAL_STATES = [s.value for s in State if s.terminal]
RETRYABLE_STATES = [State.FAILED.value, State.CANCELLED.value, State.BLOCKED.value]
BULK_BATCH_MAX = 1000


def _listing(
    scheduler: Scheduler,
    state: str,
    fn: str | None,
    since_s: float | None,
    limit: int | None,
    batch: int,
) -> Iterator[list[TaskInfo]]:
    """The tasks of ``scheduler.tasks(state)`` page by page, cut at ``--since`` (those
    that entered the state at most that long ago) and ``--limit`` tasks in all.

    Pending and terminal tasks come newest first, so the first one older than
    ``--since`` ends the listing; ready and running ones are filtered one by one.
    """
    if limit is not None and limit < 1:
        raise InvalidArgument("limit", "must be >= 1")
    if not 1 <= batch <= BULK_BATCH_MAX:
        raise InvalidArgument("batch", f"must be in [1, {BULK_BATCH_MAX}]")
    cutoff = None if since_s is None else scheduler.server_time() - since_s
    ordered = State(state) not in (State.READY, State.RUNNING)
    cursor: str | None = None
    seen = 0
    while True:
        page = scheduler.tasks(state, fn=fn, limit=batch, cursor=cursor)
        items = list(page.items)
        done = page.cursor is None
        if cutoff is not None:
            kept = [info for info in items if info.updated_at >= cutoff]
            done = done or (ordered and len(kept) < len(items))
            items = kept
        if limit is not None and seen + len(items) >= limit:
            items = items[: limit - seen]
            done = True
        seen += len(items)
        if items:
            yield items
        if done:
            return
        cursor = page.cursor


def _task_row(info: TaskInfo, now: float, full: bool = False) -> list[str]:
    limit = None if full else CUT_CHARS
    error = escape(preview(error_summary(info.error), None if full else 80)) if info.error else "-"
    return [
        views.show_id(info.task_id, limit),
        show(info.fn, limit) if info.fn else "-",
        info.state.value,
        f"{info.attempt}/{info.max_attempts}",
        f"{iso(info.updated_at)} ({relative(info.updated_at, now)})",
        error,
    ]


@cli.command("tasks")
@click.option(
    "--state",
    required=True,
    type=click.Choice([s.value for s in State]),
    help="The state to list.",
)
@click.option("--fn", default=None, help="Only tasks of this function.")
@click.option("--limit", type=int, default=50, show_default=True, help="At most N tasks (1-1000).")
@click.option("--cursor", default=None, help="Go on where a previous listing stopped.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: items and cursor.")
@click.option("--full", is_flag=True, help="Print ids, functions and errors whole (not cut).")
@click.pass_context
def tasks_command(
    ctx: click.Context,
    state: str,
    fn: str | None,
    limit: int,
    cursor: str | None,
    as_json: bool,
    full: bool,
) -> None:
    """List the tasks in one state, without scanning the namespace.

    Pending and ended tasks come newest first (by when they entered the state),
    ready tasks in the order workers will claim them, running tasks by lease
    deadline. When more remain, the command to see the next page goes to stderr.
    """
    scheduler = _connect(ctx)
    page = scheduler.tasks(state, fn=fn, limit=limit, cursor=cursor)
    if as_json:
        data = {"items": [info_dict(info) for info in page.items], "cursor": page.cursor}
        click.echo(json_line(data))
        return
    now = scheduler.server_time()
    header = ["ID", "FN", "STATE", "ATTEMPT", "UPDATED", "ERROR"]
    for line in table([header, *(_task_row(info, now, full) for info in page.items)]):
        click.echo(line)
    if not page.items:
        click.echo(f"no {state} tasks" + (f" of {escape(fn)}" if fn else ""), err=True)
    if page.cursor is not None:
        more = f"distsched tasks --state {state} --cursor {escape(repr(page.cursor))}"
        click.echo(f"more: {more}" + (f" --fn {escape(repr(fn))}" if fn else ""), err=True)


def _bulk_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option("--fn", default=None, help="Only tasks of this function."),
            click.option(
                "--since", type=Duration("since"), default=None,
                help="Only tasks that entered the state at most this long ago (e.g. 1h).",
            ),
            click.option("--limit", type=int, default=None, help="At most N tasks in all."),
            click.option(
                "--batch", type=int, default=100, show_default=True,
                help="Tasks per page (1-1000).",
            ),
        ]
    ):  # fmt: skip
        command = option(command)
    return command


def _progress(verb: str, done: int, skipped: int) -> None:
    click.echo(f"{verb} {done}, skipped {skipped}", err=True)


@cli.command()
@click.argument("task_id", metavar="[ID]", required=False)
@click.option(
    "--no-cascade", is_flag=True,
    help="Retry only the task; the tasks it blocked stay blocked.",
)  # fmt: skip
@click.option(
    "--state", type=click.Choice(RETRYABLE_STATES), default=None,
    help="Retry every task in this state instead of one ID (with --fn, --since).",
)  # fmt: skip
@_bulk_options
@click.pass_context
def retry(
    ctx: click.Context,
    task_id: str | None,
    no_cascade: bool,
    state: str | None,
    fn: str | None,
    since: float | None,
    limit: int | None,
    batch: int,
) -> None:
    """Run a failed, cancelled or blocked task ID again as a new version.

    Prints the new version and state. By default the tasks it blocked get new
    versions too and wait for it again.

    With --state instead of ID, retries every task in that state (newest first,
    page by page; progress on stderr). A retried task leaves the state, so an
    interrupted run is finished by running it again.
    """
    if (task_id is None) == (state is None):
        raise click.UsageError("give either ID or --state")
    if state is None and (fn or since is not None or limit is not None):
        raise click.UsageError("--fn, --since and --limit go with --state")
    scheduler = _connect(ctx)
    if state is not None:
        retried = skipped = 0
        for items in _listing(scheduler, state, fn, since, limit, batch):
            for info in items:
                try:
                    scheduler.retry(info.task_id, cascade=not no_cascade)
                    retried += 1
                except (ConflictError, NotFoundError):
                    skipped += 1  # it moved on since the page was read
            _progress("retried", retried, skipped)
        click.echo(f"retried {retried} {state} tasks" + (f", skipped {skipped}" if skipped else ""))
        return
    assert task_id is not None
    with _task(ctx, task_id):
        blocked = views.blocked_by(scheduler, task_id)
        try:
            version = scheduler.retry(task_id, cascade=not no_cascade)
        except ConflictError:
            now_state = scheduler.status(task_id).state.value
            raise click.ClickException(
                f"cannot retry {task_id!r}: it is {now_state} "
                "(only a failed, cancelled or blocked task can be retried)"
            ) from None
        task = scheduler.status(task_id)
    # The task may have moved on since the retry; the version printed is the retry's.
    click.echo(f"retried {task_id!r}: version {version}, {views.describe(task)}")
    after = views.lookup_many(scheduler, blocked)
    if after:
        click.echo(
            "tasks it had blocked, left blocked (--no-cascade):"
            if no_cascade
            else "tasks it had blocked, retried with it:"
        )
    for info in after:
        click.echo(
            f"  {views.show_id(info.task_id)}: version {info.version}, {views.describe(info)}"
        )


@cli.command()
@click.option("--bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8080, show_default=True, help="Port to listen on.")
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Allow cancel, retry, purge and lease expiry to a user logged in with --token.",
)
@click.option(
    "--token",
    envvar="DISTSCHED_DASHBOARD_TOKEN",
    default=None,
    metavar="TOKEN",
    help="The login token for actions (32 characters or more, e.g. from "
    "secrets.token_urlsafe(32)). Env: DISTSCHED_DASHBOARD_TOKEN.",
)
@click.pass_context
def dashboard(
    ctx: click.Context, bind: str, port: int, allow_actions: bool, token: str | None
) -> None:
    """Serve a web dashboard of the namespace (needs the 'dashboard' extra).

    Read-only unless --allow-actions: then a user who logs in with the token may
    cancel, retry and remove tasks and expire leases. Serves until Ctrl-C.
    """
    try:
        from distsched.dashboard.auth import check_token
        from distsched.dashboard.serve import serve
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs its extra: pip install 'distsched[dashboard]' ({exc})"
        ) from None
    if allow_actions and not token:
        raise click.ClickException(
            "--allow-actions needs --token TOKEN (or DISTSCHED_DASHBOARD_TOKEN)"
        )
    if allow_actions:
        check_token(token)
    if token and not allow_actions:
        click.echo("note: --token is used only with --allow-actions; serving read-only", err=True)
    scheduler = _connect(ctx)
    scheduler.client.ping()
    serve(
        scheduler,
        bind,
        port,
        allow_actions=allow_actions,
        token=token if allow_actions else None,
        echo=click.echo,
        warn=lambda text: click.echo(f"warning: {text}", err=True),
    )


@cli.command()
@click.option(
    "--state", required=True, type=click.Choice(TERMINAL_STATES),
    help="Remove the tasks that ended in this state.",
)  # fmt: skip
@_bulk_options
@click.pass_context
def purge(
    ctx: click.Context,
    state: str,
    fn: str | None,
    since: float | None,
    limit: int | None,
    batch: int,
) -> None:
    """Remove ended tasks now, whatever the retention, with everything they own.

    Page by page (progress on stderr), newest first; safe to interrupt and run
    again. A task that left the state meanwhile, or is still telling its
    dependents that it ended, is skipped. Dependents keep their own records.
    """
    scheduler = _connect(ctx)
    removed = skipped = 0
    for items in _listing(scheduler, state, fn, since, limit, batch):
        gone = scheduler.purge_tasks([info.task_id for info in items])
        removed += gone
        skipped += len(items) - gone
        _progress("purged", removed, skipped)
    click.echo(f"purged {removed} {state} tasks" + (f", skipped {skipped}" if skipped else ""))


def _given_url_checked(ctx: click.Context, override: str | None) -> str | None:
    """The Redis URL the user gave (the command's own --redis first), or None for the
    embedded default. A given URL is checked before anything starts, so a malformed URL
    or an unreachable server is one clear error."""
    settings = _settings(ctx)
    url: str | None = None
    if override is not None:
        url = settings.url = cluster_url(override) if settings.cluster else override
    elif settings.url_given:
        url = settings.url
    if url is not None:
        probe = _connect(ctx)
        probe.client.ping()
        probe.close()
    return url


@cli.command()
@click.option(
    "--redis",
    "demo_url",
    metavar="URL",
    default=None,
    help="Run on this Redis instead of an embedded one.",
)
@click.option(
    "--dashboard",
    "with_dashboard",
    is_flag=True,
    help="At the end, serve the web dashboard on what the demo ran until Ctrl-C "
    "(needs the 'dashboard' extra).",
)
@click.option("--bind", default="127.0.0.1", show_default=True, help="Dashboard address.")
@click.option("--port", type=int, default=8080, show_default=True, help="Dashboard port.")
@click.pass_context
def demo(
    ctx: click.Context, demo_url: str | None, with_dashboard: bool, bind: str, port: int
) -> None:
    """A few-second tour: delays, priorities, replacement, cancellation, a lost worker, a pipeline.

    Without --redis (or DISTSCHED_REDIS_URL) it starts a throwaway redis-server
    when one is on PATH, else an in-process fakeredis server. With --dashboard the
    web dashboard of the demo's namespace is served at the end, until Ctrl-C.
    """
    from distsched.tools.demo import DashboardOptions, run_demo

    options = None
    if with_dashboard:
        try:
            import distsched.dashboard  # noqa: F401
        except ImportError as exc:
            raise click.ClickException(
                f"--dashboard needs its extra: pip install 'distsched[dashboard]' ({exc})"
            ) from None
        options = DashboardOptions(bind, port)
    url = _given_url_checked(ctx, demo_url)
    if not run_demo(url, click.echo, options):
        ctx.exit(1)


def _parse_sizes(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"must be comma-separated integers, got {value!r}") from None
    if not sizes:
        raise click.BadParameter("must name at least one size")
    return sizes


def _parse_sections(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def _bench_size_options() -> list[click.Option]:
    """One option per size of ``BenchConfig``, with its default."""
    from distsched.tools.bench import BenchConfig

    d = BenchConfig()
    options = [
        click.option("--evalsha-calls", type=int, default=d.evalsha_calls, show_default=True,
                     help="(a) EVALSHA calls, sequential and pipelined."),
        click.option("--pipeline", type=int, default=d.pipeline, show_default=True,
                     help="(a) EVALSHA calls per pipeline."),
        click.option("--schedule-calls", type=int, default=d.schedule_calls, show_default=True,
                     help="(b) schedule calls, one task each."),
        click.option("--enqueue-tasks", type=int, default=d.enqueue_tasks, show_default=True,
                     help="(b) tasks enqueued with schedule_many."),
        click.option("--batch", type=int, default=d.batch, show_default=True,
                     help="Tasks per schedule_many call, everywhere."),
        click.option("--tasks", type=int, default=d.tasks, show_default=True,
                     help="(c) no-op tasks drained end to end."),
        click.option("--concurrency", type=int, default=d.concurrency, show_default=True,
                     help="Threads per worker process."),
        click.option("--delayed", type=int, default=d.delayed, show_default=True,
                     help="(d) delayed tasks."),
        click.option("--delay-min", type=Duration("delay_min"), default=d.delay_min,
                     show_default=True, help="(d) smallest delay (seconds, or 100ms, 1s)."),
        click.option("--delay-max", type=Duration("delay_max"), default=d.delay_max,
                     show_default=True, help="(d) largest delay (seconds, or 500ms, 2s)."),
        click.option("--slots", type=int, default=d.slots, show_default=True,
                     help="(d) slots of a schedule fired with an idle worker, 100 ms apart."),
        click.option("--claim-sizes", default=",".join(str(n) for n in d.claim_sizes),
                     show_default=True, callback=_parse_sizes,
                     help="(e) queue sizes to claim from, comma-separated."),
        click.option("--claims", type=int, default=d.claims, show_default=True,
                     help="(e) claims timed per queue size, with ready(1) and ready(100)."),
        click.option("--chain", type=int, default=d.chain, show_default=True,
                     help="(f) tasks in the chain."),
        click.option("--fanout", type=int, default=d.fanout, show_default=True,
                     help="(f) width of the fan-out/fan-in."),
        click.option("--dependents", type=int, default=d.dependents, show_default=True,
                     help="(f) dependents released, then blocked, by one task."),
        click.option("--memory-tasks", type=int, default=d.memory_tasks, show_default=True,
                     help="(g) tasks queued to measure memory per task."),
        click.option("--wake-tasks", type=int, default=d.wake_tasks, show_default=True,
                     help="(h) tasks run one at a time per number of idle processes."),
        click.option("--wake-processes", default=",".join(str(n) for n in d.wake_processes),
                     show_default=True, callback=_parse_sizes,
                     help="(h) numbers of idle worker processes, comma-separated (1,8,32)."),
        click.option("--dashboard-tasks", type=int, default=d.dashboard_tasks, show_default=True,
                     help="(i) tasks in the namespace whose dashboard pages are counted."),
        click.option("--dashboard-drain", type=int, default=d.dashboard_drain, show_default=True,
                     help="(i) tasks drained with and without a dashboard polling."),
        click.option("--fair-heavy", type=int, default=d.fair_heavy, show_default=True,
                     help="(j) tasks of the heavy key queued ahead of the light keys."),
        click.option("--fair-rounds", type=int, default=d.fair_rounds, show_default=True,
                     help="(j) tasks per light key, one every 100 ms."),
        click.option("--fair-claims", type=int, default=d.fair_claims, show_default=True,
                     help="(j) claims over keys of weights 1, 1, 2, 4, 8."),
        click.option("--profile-tasks", type=int, default=d.profile_tasks, show_default=True,
                     help="(k) tasks scheduled one per call, then drained, every command in "
                          "SLOWLOG (the bench's own server only)."),
        click.option("--processes", type=int, default=d.processes, show_default=True,
                     help="(c) worker processes of the last end-to-end run."),
        click.option("--worst-scale", type=float, default=d.worst_scale, show_default=True,
                     help="(l) share of each cap the worst inputs use (1: the caps themselves)."),
        click.option("--worst-repeats", type=int, default=d.worst_repeats, show_default=True,
                     help="(l) runs of each worst input (the bench's own server only)."),
        click.option("--only", default="", callback=_parse_sections, metavar="SECTIONS",
                     help="Run only these sections, comma-separated (worst,profile)."),
    ]  # fmt: skip

    def params(f: Callable[..., Any]) -> list[click.Option]:
        for option in options:
            f = option(f)
        return list(reversed(f.__click_params__))  # type: ignore[attr-defined]

    return params(lambda: None)


class _BenchCommand(click.Command):
    """Takes its size options from ``BenchConfig`` when first asked for them, so that
    importing the CLI does not import the bench."""

    _sized = False

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not self._sized:
            self._sized = True
            self.params.extend(_bench_size_options())
        return super().get_params(ctx)


@cli.command(cls=_BenchCommand)
@click.option(
    "--redis",
    "bench_url",
    metavar="URL",
    default=None,
    help="Run on this Redis (its own namespaces, removed at the end) instead of an embedded one.",
)
@click.option("--json", "json_path", metavar="FILE", default=None, help="Also write JSON here.")
@click.option(
    "--quick", is_flag=True,
    help="Small sizes for a smoke run of every section (under 20 s); sizes given still count.",
)  # fmt: skip
@click.pass_context
def bench(
    ctx: click.Context, /, bench_url: str | None, json_path: str | None, quick: bool,
    **sizes: Any,
) -> None:  # fmt: skip
    """Measure the scheduler against raw Redis: one run, about four minutes.

    Script-call ceiling, enqueue (against a raw LPUSH), end-to-end no-op tasks
    (def and async def) through worker processes (each checked to run exactly once;
    Redis and worker CPU per task), lateness of delayed tasks,
    claim rate by queue size, dependency graphs, memory per task, wake-ups,
    the dashboard (Redis commands per page, workers' drain rate while it is
    polled), and fairness keys (light keys' wait behind a heavy key's backlog, with
    and without keys; claim shares by weight), and where Redis time goes per script
    (SLOWLOG; on the bench's own server only, its settings restored), and the longest
    call of each script given the worst input its caps accept (SLOWLOG too). Prints a table
    with the targets next to the figures, with the machine and library versions;
    progress goes to stderr. --quick runs every section at small sizes (under 20 s) as a smoke test.

    Without --redis (or DISTSCHED_REDIS_URL) it starts a throwaway
    redis-server when one is on PATH, else an in-process fakeredis server.
    Exits 1 when a task did not run exactly once.
    """
    from distsched.tools.bench import BenchConfig, bench_command, progress_lines

    url = _given_url_checked(ctx, bench_url)
    if quick:
        given = {
            name: value for name, value in sizes.items()
            if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
        }  # fmt: skip
        config = dataclasses.replace(BenchConfig.quick(), **given)
    else:
        config = BenchConfig(**sizes)
    with progress_lines(sys.stderr):
        ok = bench_command(url, config, json_path, click.echo)
    if not ok:
        ctx.exit(1)


@cli.command("bench-stripes")
@click.option("--tasks", type=click.IntRange(min=1), default=20_000, show_default=True,
              help="No-op tasks per stripe count.")  # fmt: skip
@click.option("--processes", type=click.IntRange(min=1), default=2, show_default=True,
              help="Worker processes draining them.")  # fmt: skip
@click.option("--concurrency", type=click.IntRange(min=1), default=16, show_default=True,
              help="Threads per worker process.")  # fmt: skip
@click.option("--json", "json_path", metavar="FILE", default=None, help="Also write JSON here.")
@click.pass_context
def bench_stripes(
    ctx: click.Context, /, tasks: int, processes: int, concurrency: int, json_path: str | None
) -> None:
    """Measure a striped namespace on a local three-master cluster (about a minute).

    Starts redis-server nodes joined by redis-cli (both must be on PATH); for 1, 2
    and 3 stripes, on as many masters, enqueues and drains no-op tasks with worker
    processes (each checked to run exactly once) and prints each master's Redis CPU
    per task (INFO cpu: used_cpu_sys + used_cpu_user), the namespace's Redis-bound
    and measured tasks/s, and the order inversion of claims across stripes.
    Exits 1 when a task did not run exactly once or a stripe was claimed out of order.
    """
    from distsched.text import finite_or_none
    from distsched.tools.stripes import StripesConfig, format_report, run_stripes_bench

    config = StripesConfig(tasks=tasks, processes=processes, concurrency=concurrency)
    try:
        report = run_stripes_bench(config, lambda text: click.echo(text, err=True))
    except DistschedError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"Redis {report['redis_version']}, three masters, {report['duration_s']:.0f} s")
    for line in format_report(report):
        click.echo(line)
    if json_path is not None:
        text = json.dumps(finite_or_none(report), indent=2, allow_nan=False)
        Path(json_path).write_text(text + "\n", "utf-8")
        click.echo(f"wrote {json_path}")
    if report["problems"]:
        for problem in report["problems"][:20]:
            click.echo(f"  {problem}", err=True)
        ctx.exit(1)


def main() -> None:
    """The ``distsched`` console script."""
    cli(prog_name="distsched")


if __name__ == "__main__":
    main()
