"""The ``distsched`` command line: a thin shell over :class:`~distsched.client.Scheduler`.

Each command parses its options and calls one function. Errors a user can fix
(bad arguments, unknown ids or namespaces, conflicts, an unreachable Redis) are
printed as one line on stderr. Exit codes are one table, ``distsched.cli.common.Exit``
(docs/pages/reference/exit-codes.md): 0 done, 1 refused or failed, 2 usage error,
3 ``status --wait`` timed out.
"""

from __future__ import annotations

from typing import Any

import click
import redis

from distsched import __version__
from distsched.cli import (
    admin,
    bulk,
    dashboard,
    exporter,
    failures,
    inspect,
    keys,
    namespace,
    schedules,
    tasks,
    tools,
    waitpoints,
    why,
    worker,
    workers,
)
from distsched.cli.common import Settings, cluster_node_message, cluster_url, settings_of
from distsched.errors import DistschedError, InvalidArgument
from distsched.text import escape, redact, redact_text
from distsched.tracebacks import one_line

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
    "error": "--error",
    "batch": "--batch",
    "count": "--count",
}


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
            url = redact(settings_of(ctx).url)
            if _redirected(exc):
                raise click.ClickException(cluster_node_message(settings_of(ctx).url)) from None
            raise click.ClickException(
                f"cannot connect to Redis at {url}: {one_line(exc)}"
            ) from None
        except redis.exceptions.RedisClusterException as exc:
            # redis-py's own, outside RedisError: no node answered, or none let us in.
            url = redact(settings_of(ctx).url)
            raise click.ClickException(
                f"cannot connect to the Redis Cluster at {url}: {one_line(exc)}"
            ) from None
        except DistschedError as exc:
            raise click.ClickException(one_line(exc)) from None
        except redis.RedisError as exc:
            url = redact(settings_of(ctx).url)
            raise click.ClickException(f"Redis at {url}: {one_line(exc)}") from None


def _redirected(exc: BaseException) -> bool:
    """A cluster node answered MOVED or ASK: the URL names one node of a cluster."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, redis.exceptions.AskError):  # MovedError included
            return True
        seen = seen.__cause__ or seen.__context__
    return False


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
        url=cluster_url(url) if cluster else url,
        namespace=namespace,
        url_given=given,
        cluster=cluster,
    )


COMMANDS: list[click.Command] = [
    worker.worker,
    tasks.schedule,
    tasks.submit,
    tasks.cancel,
    tasks.amend,
    tasks.pause,
    tasks.resume,
    tasks.paused,
    inspect.status,
    inspect.graph,
    inspect.dep_results,
    why.why,
    waitpoints.waitpoint_group,
    namespace.stats,
    namespace.retention,
    namespace.max_running,
    namespace.payload_limit,
    namespace.stripes,
    namespace.order,
    namespace.namespace_group,
    keys.keys,
    workers.workers,
    workers.leases,
    admin.library_group,
    schedules.schedules_group,
    bulk.tasks_command,
    bulk.retry,
    bulk.purge,
    failures.failures,
    dashboard.dashboard,
    exporter.exporter,
    tools.demo,
    tools.bench,
    tools.bench_stripes,
]
for command in COMMANDS:
    cli.add_command(command)


def main() -> None:
    """The ``distsched`` console script."""
    cli(prog_name="distsched")
