"""Write one task: ``schedule``, ``submit`` (with dependencies), ``cancel``, and the
changes in place ``amend``, ``pause`` and ``resume``."""

from __future__ import annotations

from typing import Any

import click
from redis.exceptions import RedisError

from distsched import views
from distsched.cli.common import (
    connect,
    connect_existing,
    duration_option,
    info_dict,
    parse_json,
    parse_run_at,
    settings_of,
    stacked,
    task_named,
)
from distsched.client import Scheduler
from distsched.errors import CycleError, UnknownDependencyError
from distsched.model import Admitted, Change, Changed
from distsched.text import CUT_CHARS, escape, json_line, parse_when, relative, show, table

# The options that describe a task, shared by ``schedule`` and ``submit``.
_task_options = stacked(
    click.option("--fn", required=True, help="Name of the registered function to run."),
    click.option(
        "--args",
        "args_json",
        default="[]",
        metavar="JSON",
        help="Positional args: a JSON list.",
    ),
    click.option(
        "--kwargs",
        "kwargs_json",
        default="{}",
        metavar="JSON",
        help="Keyword args: a JSON object.",
    ),
    click.option(
        "--run-at",
        metavar="WHEN",
        help="Epoch seconds (not milliseconds) or ISO-8601 with offset "
        "(2030-01-01T09:00:00+00:00).",
    ),
    duration_option(
        "--delay",
        field="delay",
        signed=True,
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
    duration_option(
        "--backoff",
        field="backoff",
        default="1s",
        help="Wait before attempt 2 (seconds, or 500ms, 2s, 1m); doubles for each later one.",
    ),
    click.option(
        "--dedupe",
        is_flag=True,
        help="Keep a queued or running version of ID instead of replacing it.",
    ),
    duration_option(
        "--dedupe-window",
        field="dedupe_window",
        metavar="DURATION",
        help="With dedupe: also keep a version that ended less than this long ago.",
    ),
    duration_option(
        "--debounce",
        field="debounce",
        metavar="MAX_WAIT",
        help="Replace a queued version, but start at most this long after the burst's "
        "first submission.",
    ),
    click.option(
        "--deadline",
        metavar="WHEN",
        help="Expire (end cancelled) if not started by then: as --run-at.",
    ),
    duration_option(
        "--ttl",
        field="ttl",
        metavar="DURATION",
        help="Expire (end cancelled) if not started this long after now (server clock).",
    ),
    click.option(
        "--key",
        "fair_key",
        metavar="KEY",
        help="The fairness key (tenant): keys take turns at the claims (see 'keys').",
    ),
    click.option(
        "--cost",
        type=int,
        default=1,
        show_default=True,
        metavar="UNITS",
        help="Units of its key's rate the task takes when it starts (tokens, requests).",
    ),
    duration_option(
        "--timeout",
        field="timeout",
        metavar="DURATION",
        help="Time limit of each run (default: the worker's); past it the attempt fails.",
    ),
)


def _task_keywords(
    *,
    args_json: str,
    kwargs_json: str,
    run_at: str | None,
    delay: float | None,
    priority: int,
    max_attempts: int,
    backoff: float,
    dedupe: bool,
    dedupe_window: float | None,
    debounce: float | None,
    deadline: str | None,
    ttl: float | None,
    fair_key: str | None,
    cost: int,
    timeout: float | None,
) -> dict[str, Any]:
    """The options of ``_task_options`` as ``Scheduler.schedule`` keywords."""
    return {
        "timeout": timeout,
        "key": fair_key,
        "cost": cost,
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


@click.command()
@click.argument("task_id", metavar="ID")
@_task_options
@click.pass_context
def schedule(ctx: click.Context, /, task_id: str, fn: str, **given: Any) -> None:
    """Schedule (or replace) task ID; print its new version.

    With --dedupe, a version kept instead is printed, and a note says so on stderr.
    """
    options = _task_keywords(**given)
    scheduler = connect(ctx)
    scheduler.warn_unserved = False  # said on stderr below, not logged
    _echo_admitted(scheduler.admit(task_id, fn=fn, **options))
    _warn_unserved(scheduler, fn)


def _echo_admitted(admitted: Admitted) -> None:
    click.echo(admitted.version)
    if not admitted.created:
        click.echo(f"kept the existing version {admitted.version} (dedupe)", err=True)


def _warn_unserved(scheduler: Scheduler, fn: str | None) -> None:
    """Say on stderr when live workers serve functions and none serves ``fn``."""
    if not fn:
        return
    try:
        message = scheduler.unserved(fn)
    except RedisError:  # the task is scheduled: a missing hint is no failure
        return
    if message is not None:
        click.echo(f"warning: {escape(message)}", err=True)


@click.command()
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
    ctx: click.Context,
    /,
    task_id: str,
    fn: str,
    deps: tuple[str, ...],
    optional_deps: tuple[str, ...],
    allow_unknown: bool,
    **given: Any,
) -> None:
    """Submit (or replace) task ID after its dependencies; print its new version.

    The task waits (pending) until every --dep has succeeded and every
    --optional-dep has ended; a failed, cancelled or blocked --dep blocks it.
    A dependency cycle is refused with its path.
    """
    options = _task_keywords(**given)
    scheduler = connect(ctx)
    scheduler.warn_unserved = False  # said on stderr below, not logged
    try:
        admitted = scheduler.admit(
            task_id,
            fn=fn,
            deps=deps,
            optional_deps=optional_deps,
            allow_unknown=allow_unknown,
            **options,
        )
    except CycleError as exc:
        raise click.ClickException(
            f"refused, nothing written: dependency cycle: {views.show_path(exc.path)}"
        ) from None
    except UnknownDependencyError as exc:
        namespace = settings_of(ctx).namespace
        raise click.ClickException(
            f"unknown dependency {exc.dependency!r}: no such task in namespace {namespace!r} "
            "(submit it first, or pass --allow-unknown to wait for it)"
        ) from None
    _echo_admitted(admitted)
    _warn_unserved(scheduler, fn)


@click.command()
@click.argument("task_id", metavar="ID")
@click.option(
    "--workflow",
    is_flag=True,
    help="Cancel the whole workflow of ID: its root and every task spawned under it.",
)
@click.pass_context
def cancel(ctx: click.Context, task_id: str, workflow: bool) -> None:
    """Cancel task ID; print its state after the call.

    A queued task is cancelled at once and never runs. A running one prints
    'running': its function is asked to stop and the task ends cancelled
    when it does. With --workflow, print how many tasks of its workflow were
    cancelled or asked to stop.
    """
    scheduler = connect(ctx)
    with task_named(ctx, task_id):
        if workflow:
            click.echo(f"{scheduler.cancel_workflow(task_id)} tasks cancelled or asked to stop")
            return
        state = scheduler.cancel(task_id)
    click.echo(state.value)


_version_option = click.option(
    "--version",
    "version",
    type=int,
    default=None,
    metavar="N",
    help="Change only this version of ID (as status shows it); another is a conflict.",
)


def _echo_changed(ctx: click.Context, changed: Changed) -> None:
    """Print what a change in place did; anything but a change made (or nothing to do)
    fails with a line on stderr."""
    task_id = changed.task_id
    if changed.change is Change.NOT_FOUND:
        namespace = settings_of(ctx).namespace
        raise click.ClickException(f"no task {task_id!r} in namespace {namespace!r}")
    if changed.change is Change.CONFLICT:
        raise click.ClickException(
            f"task {task_id!r} is at version {changed.version}: nothing changed"
        )
    if changed.change is Change.NOT_QUEUED:
        state = changed.state.value if changed.state else "gone"
        raise click.ClickException(f"task {task_id!r} is {state}: nothing changed")
    click.echo(f"{changed.change.value} {changed.state} {changed.version}")


@click.command()
@click.argument("task_id", metavar="ID")
@click.option("--priority", type=int, default=None, help="The new priority.")
@click.option("--run-at", metavar="WHEN", help="The new due time: as for schedule.")
@duration_option(
    "--delay",
    field="delay",
    signed=True,
    help="The new due time from now (server clock): seconds, or 500ms, 30s, 5m, 1h30m, 2d.",
)
@click.option(
    "--max-attempts",
    type=int,
    default=None,
    help="The new attempt budget (a queued or running task; not below the attempt "
    "that runs now or next).",
)
@_version_option
@click.pass_context
def amend(
    ctx: click.Context,
    task_id: str,
    priority: int | None,
    run_at: str | None,
    delay: float | None,
    max_attempts: int | None,
    version: int | None,
) -> None:
    """Change task ID in place, without a new version; print 'applied', its state and
    version.

    The priority and due time change while it is queued (ready or pending): a ready
    task moves to its new place in the queue, keeping its place among equals. The
    attempt budget also changes while it runs. A task that is not queued, or another
    version than --version, is left as it is (exit code 1).
    """
    scheduler = connect(ctx)
    changed = scheduler.amend(
        task_id,
        priority=priority,
        run_at=None if run_at is None else parse_run_at(run_at),
        delay=delay,
        max_attempts=max_attempts,
        version=version,
    )
    _echo_changed(ctx, changed)


@click.command()
@click.argument("task_id", metavar="ID")
@_version_option
@click.pass_context
def pause(ctx: click.Context, task_id: str, version: int | None) -> None:
    """Pause queued task ID: no worker claims it until 'resume'; print 'applied' (or
    'unchanged' when it was paused), its state and version.

    It stays ready or pending (and counted so); a pending one stays pending when its
    dependencies finish. cancel, retry and purge work on it as on any task.
    """
    _echo_changed(ctx, connect(ctx).pause_task(task_id, version))


@click.command()
@click.argument("task_id", metavar="ID")
@_version_option
@click.pass_context
def resume(ctx: click.Context, task_id: str, version: int | None) -> None:
    """Resume paused task ID: back to its place in the queue; print 'applied' (or
    'unchanged' when it was not paused), its state and version."""
    _echo_changed(ctx, connect(ctx).resume_task(task_id, version))


@click.command("paused")
@click.option("--limit", type=int, default=100, show_default=True, help="At most N tasks (1-1000).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the tasks.")
@click.pass_context
def paused(ctx: click.Context, limit: int, as_json: bool) -> None:
    """List the paused tasks, longest paused first (see 'pause')."""
    scheduler = connect_existing(ctx)
    infos = scheduler.paused_tasks(limit)
    if as_json:
        click.echo(json_line({"items": [info_dict(info) for info in infos]}))
        return
    now = scheduler.server_time()
    header = ["ID", "FN", "STATE", "PRIORITY", "PAUSED"]
    rows = [
        [
            views.show_id(info.task_id, CUT_CHARS),
            show(info.fn, CUT_CHARS) if info.fn else "-",
            info.state.value,
            str(info.priority),
            relative(info.paused_at or now, now),
        ]
        for info in infos
    ]
    for line in table([header, *rows]):
        click.echo(line)
    if not infos:
        click.echo("no paused tasks", err=True)
