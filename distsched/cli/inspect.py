"""Read one task: ``status`` (optionally waiting for its end), ``graph`` and
``dep-results`` (what its dependencies hold)."""

from __future__ import annotations

import json
from typing import Any

import click

from distsched import views
from distsched.cli.common import (
    Exit,
    connect,
    count_option,
    duration_option,
    info_dict,
    leave,
    settings_of,
    task_named,
)
from distsched.errors import InvalidArgument, Timeout
from distsched.model import AttemptInfo, State, TaskInfo
from distsched.text import (
    CUT_CHARS,
    DURATION_HINT,
    error_summary,
    escape,
    iso,
    json_line,
    jsonable,
    preview,
    progress_text,
    relative,
    show,
)
from distsched.times import span

PREVIEW_CHARS = 200
# The exit code of `status --wait` whose --timeout passed (1 is a task that did not
# succeed, or any error; 2 is click's usage error).
EXIT_TIMEOUT = Exit.TIMEOUT  # kept for importers; the table is cli.common.Exit


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

    run_at = f"{relative(info.run_at, server_now)} (epoch {info.run_at:.3f})"
    blocked = "-"
    if info.blocked_by is not None:
        cause = info.blocked_by
        blocked = (
            f"{views.show_id(cause.root, id_limit)} via {views.show_path(cause.path, id_limit)}"
        )
    lease = "-"
    if info.lease_deadline is not None:
        lease = relative(info.lease_deadline, server_now)
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
        ("cost", str(info.cost)),
        ("fn", show(info.fn, id_limit) if info.fn else "-"),
        ("args", js(list(info.args))),
        ("kwargs", js(info.kwargs)),
        (
            "paused",
            "-" if info.paused_at is None else f"since {relative(info.paused_at, server_now)}",
        ),
        ("cancel_requested", "yes" if info.cancel_requested else "no"),
        ("worker", show(info.worker, id_limit) if info.worker else "-"),
        ("lease_deadline", lease),
        ("updated_at", relative(info.updated_at, server_now)),
        ("progress", progress_text(info.progress, server_now, id_limit)),
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
        *([("waitpoint", views.waitpoint_text(info, server_now))] if info.waitpoint else []),
        *(
            [("workflow", views.workflow_text(info.workflow, id_limit))]
            if info.workflow is not None
            else []
        ),
        *_attempt_lines(info.attempts, limit, server_now),
    ]


def attempt_text(
    attempt: AttemptInfo, limit: int | None = PREVIEW_CHARS, now: float | None = None
) -> str:
    """One ended attempt on one line: outcome, token, worker, when and how long."""
    took = max(attempt.ended_at - attempt.started_at, 0.0)
    id_limit = None if limit is None else CUT_CHARS
    text = (
        f"{escape(attempt.outcome)}: version {attempt.version} attempt {attempt.attempt}, "
        f"{views.show_id(attempt.worker, id_limit) if attempt.worker else '-'}, "
        f"{iso(attempt.started_at) if now is None else relative(attempt.started_at, now)}, "
        f"{span(took)}"
    )
    if attempt.error:
        text += f", {escape(preview(attempt.error, limit))}"
    return text


def _attempt_lines(
    attempts: tuple[AttemptInfo, ...], limit: int | None, now: float
) -> list[tuple[str, str]]:
    """The ``attempts`` line and one continuation line per further attempt, oldest first."""
    if not attempts:
        return [("attempts", "-")]
    lines = [("attempts", attempt_text(attempts[0], limit, now))]
    return lines + [("", attempt_text(a, limit, now)) for a in attempts[1:]]


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


@click.command()
@click.argument("task_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (always in full).")
@click.option("--full", is_flag=True, help="Print args, kwargs, result and error in full.")
@count_option(
    "--preview",
    "preview_chars",
    default=PREVIEW_CHARS,
    help="Characters shown of args, kwargs, result and error.",
)
@click.option(
    "--wait",
    "wait",
    is_flag=True,
    help="Wait until the task has ended, then show it; exit 0 when it succeeded, 1 when "
    f"it failed, was cancelled or is blocked, {int(Exit.TIMEOUT)} on --timeout.",
)
@duration_option(
    "--timeout",
    field="timeout",
    help=f"With --wait: give up after this long ({DURATION_HINT}); default: no limit.",
)
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
    scheduler = connect(ctx)
    with task_named(ctx, task_id):
        if not wait:
            info = scheduler.status(task_id)
        else:
            try:
                info = scheduler.wait(task_id, timeout)
            except Timeout:
                shown = escape(repr(task_id))
                click.echo(f"task {shown} did not end within {timeout:g}s", err=True)
                leave(ctx, Exit.TIMEOUT)
    if as_json:
        click.echo(json_line(info_dict(info)))
    else:
        limit = None if full else preview_chars
        lines = _status_lines(info, scheduler.server_time(), limit)
        width = max(len(key) for key, _ in lines)
        for key, value in lines:
            click.echo(f"{key + ':' if key else '':<{width + 1}} {value}")
    if wait and info.state is not State.SUCCEEDED:
        leave(ctx, Exit.FAILED)


@click.command()
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
    scheduler = connect(ctx)
    with task_named(ctx, task_id):
        hood = views.walk(scheduler, task_id, limit=limit)
    if as_json:
        data = views.render_json(hood)
        click.echo(json_line(jsonable(data)))
        return
    for line in views.render_text(hood, settings_of(ctx).namespace, None if full else CUT_CHARS):
        click.echo(line)


@click.command("dep-results")
@click.argument("task_id", metavar="ID")
@click.option(
    "--id",
    "ids",
    multiple=True,
    metavar="DEP",
    help="Read only this dependency (repeat it); default: every dependency, in one read.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON, one line per dependency.")
@click.option("--full", is_flag=True, help="Print ids, results and errors whole (not cut).")
@click.pass_context
def dep_results(
    ctx: click.Context, task_id: str, ids: tuple[str, ...], as_json: bool, full: bool
) -> None:
    """Show what the dependencies of task ID hold now: state, version, and the
    result (or the error) of each, as the task reads them (one atomic read of at
    most 1000 dependencies and 2 MiB of results)."""
    scheduler = connect(ctx)
    with task_named(ctx, task_id):
        entries = scheduler.dependency_results(task_id, list(ids) or None)
    limit = None if full else PREVIEW_CHARS
    for dep, entry in entries.items():
        if as_json:
            click.echo(
                json_line(
                    jsonable(
                        {
                            "id": dep,
                            "optional": entry.optional,
                            "state": None if entry.state is None else entry.state.value,
                            "version": entry.version,
                            "result": entry.result,
                            "error": entry.error,
                        }
                    )
                )
            )
            continue
        state = "gone" if entry.state is None else entry.state.value
        kind = " [optional]" if entry.optional else ""
        shown = views.show_id(dep, None if full else CUT_CHARS)
        if entry.error is not None:
            what = _error_value(entry.error, limit)
        elif entry.succeeded:
            what = escape(preview(json.dumps(jsonable(entry.result), ensure_ascii=False), limit))
        else:
            what = "-"
        version = "-" if entry.version is None else str(entry.version)
        click.echo(f"{shown}{kind}: {state} (version {version}) {what}")
