"""The commands that run a tool: ``demo``, ``bench`` and ``bench-stripes``; each tool
is imported only inside its command, so that importing the CLI loads none."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import click
import redis

from distsched.cli.common import (
    Duration,
    Exit,
    cluster_url,
    connect,
    count_option,
    leave,
    settings_of,
)
from distsched.errors import DistschedError
from distsched.tracebacks import one_line


def _given_url_checked(ctx: click.Context, override: str | None) -> str | None:
    """The Redis URL the user gave (the command's own --redis first), or None for the
    embedded default. A given URL is checked before anything starts, so a malformed URL
    or an unreachable server is one clear error."""
    settings = settings_of(ctx)
    url: str | None = None
    if override is not None:
        url = settings.url = cluster_url(override) if settings.cluster else override
    elif settings.url_given:
        url = settings.url
    if url is not None:
        probe = connect(ctx)
        probe.client.ping()
        probe.close()
    return url


@click.command()
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
    help="At the end, add failures in three error groups, a blocked branch, a recurring "
    "schedule and a task due tomorrow, and serve the web dashboard on it all until Ctrl-C "
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
    try:
        ok = run_demo(url, click.echo, options)
    except redis.ConnectionError as exc:
        if url is not None:
            raise
        # Not the URL of the settings (never used here): the server the demo started.
        raise click.ClickException(f"lost the demo's embedded Redis: {one_line(exc)}") from None
    if not ok:
        leave(ctx, Exit.FAILED)


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


# Each size of ``BenchConfig``: its option (named after the field), its type (tuple:
# comma-separated sizes) and its help; the default is the field's.
_BENCH_SIZES: tuple[tuple[str, Any, str], ...] = (
    ("--evalsha-calls", int, "(a) EVALSHA calls, sequential and pipelined."),
    ("--pipeline", int, "(a) EVALSHA calls per pipeline."),
    ("--schedule-calls", int, "(b) schedule calls, one task each; also the tasks per feature."),
    ("--enqueue-tasks", int, "(b) tasks enqueued with schedule_many."),
    ("--batch", int, "Tasks per schedule_many call, everywhere."),
    ("--tasks", int, "(c) no-op tasks drained end to end."),
    ("--concurrency", int, "Threads per worker process."),
    ("--delayed", int, "(d) delayed tasks."),
    ("--delay-min", Duration("delay_min"), "(d) smallest delay (seconds, or 100ms, 1s)."),
    ("--delay-max", Duration("delay_max"), "(d) largest delay (seconds, or 500ms, 2s)."),
    ("--slots", int, "(d) slots of a schedule fired with an idle worker, 100 ms apart."),
    ("--claim-sizes", tuple, "(e) queue sizes to claim from, comma-separated."),
    ("--claims", int, "(e) claims timed per queue size, with ready(1) and ready(100)."),
    ("--chain", int, "(f) tasks in the chain."),
    ("--fanout", int, "(f) width of the fan-out/fan-in."),
    ("--dependents", int, "(f) dependents released, then blocked, by one task."),
    ("--memory-tasks", int, "(g) tasks queued to measure memory per task."),
    ("--wake-tasks", int, "(h) tasks run one at a time per number of idle processes."),
    ("--wake-processes", tuple, "(h) numbers of idle worker processes, comma-separated (1,8,32)."),
    ("--dashboard-tasks", int, "(i) tasks in the namespace whose dashboard pages are counted."),
    ("--dashboard-drain", int, "(i) tasks drained with and without a dashboard polling."),
    ("--fair-heavy", int, "(j) tasks of the heavy key queued ahead of the light keys."),
    ("--fair-rounds", int, "(j) tasks per light key, one every 100 ms."),
    ("--fair-claims", int, "(j) claims over keys of weights 1, 1, 2, 4, 8."),
    ("--profile-tasks", int, "(k) tasks scheduled one per call, then drained, every command in "
                             "SLOWLOG (the bench's own server only)."),
    ("--processes", int, "(c) worker processes of the last end-to-end run."),
    ("--worst-scale", float,
     "(l) share of each cap the worst inputs use (1: the caps themselves)."),
    ("--worst-repeats", int, "(l) runs of each worst input (the bench's own server only)."),
)  # fmt: skip


def _size_option(flag: str, kind: Any, default: Any, help: str) -> click.Option:
    if kind is tuple:
        shown = ",".join(str(n) for n in default)
        return click.Option(
            [flag], default=shown, show_default=True, callback=_parse_sizes, help=help
        )
    return click.Option([flag], type=kind, default=default, show_default=True, help=help)


def _bench_size_options() -> list[click.Option]:
    """One option per size of ``BenchConfig``, with its default, and ``--only``, in the
    order ``--help`` shows them (the table's last first)."""
    from distsched.tools.bench import BenchConfig

    d = BenchConfig()
    options = [
        _size_option(flag, kind, getattr(d, flag[2:].replace("-", "_")), help)
        for flag, kind, help in _BENCH_SIZES
    ]
    only_help = "Run only these sections, comma-separated (worst,profile)."
    options.append(
        click.Option(
            ["--only"], default="", callback=_parse_sections, metavar="SECTIONS", help=only_help
        )
    )
    return options[::-1]


class _BenchCommand(click.Command):
    """Takes its size options from ``BenchConfig`` when first asked for them, so that
    importing the CLI does not import the bench."""

    _sized = False

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if not self._sized:
            self._sized = True
            self.params.extend(_bench_size_options())
        return super().get_params(ctx)


@click.command(cls=_BenchCommand)
@click.option(
    "--redis",
    "bench_url",
    metavar="URL",
    default=None,
    help="Run on this Redis (its own namespaces, removed at the end) instead of an embedded one.",
)
@click.option("--json", "json_path", metavar="FILE", default=None, help="Also write JSON here.")
@click.option(
    "--quick",
    is_flag=True,
    help="Small sizes for a smoke run of every section (under 20 s); sizes given still count.",
)
@click.pass_context
def bench(
    ctx: click.Context,
    /,
    bench_url: str | None,
    json_path: str | None,
    quick: bool,
    **sizes: Any,
) -> None:
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
            name: value
            for name, value in sizes.items()
            if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
        }
        config = dataclasses.replace(BenchConfig.quick(), **given)
    else:
        config = BenchConfig(**sizes)
    with progress_lines(sys.stderr):
        ok = bench_command(url, config, json_path, click.echo)
    if not ok:
        leave(ctx, Exit.FAILED)


@click.command("bench-stripes")
@count_option(
    "--tasks",
    default=10_000,
    help="No-op tasks per stripe count and producer regime.",
)
@count_option(
    "--processes",
    default=2,
    help="Worker processes draining them.",
)
@count_option(
    "--concurrency",
    default=16,
    help="Threads per worker process.",
)
@click.option("--json", "json_path", metavar="FILE", default=None, help="Also write JSON here.")
@click.pass_context
def bench_stripes(
    ctx: click.Context, /, tasks: int, processes: int, concurrency: int, json_path: str | None
) -> None:
    """Measure a striped namespace on a local three-master cluster (a few minutes).

    Starts redis-server nodes joined by redis-cli (both must be on PATH); for three
    producer regimes (batches enqueued first, one schedule per task first, one per
    task while workers drain) and 1, 2 and 3 stripes placed on as many masters,
    enqueues and drains no-op tasks with worker processes (each checked to run
    exactly once) and prints each master's Redis CPU per task (INFO cpu:
    used_cpu_sys + used_cpu_user), the total against one stripe's, the namespace's
    Redis-bound and measured tasks/s, and the order inversion of claims across stripes.
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
        leave(ctx, Exit.FAILED)
