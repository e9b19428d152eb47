"""Many tasks at once: ``tasks`` (one state, page by page), ``retry`` and ``purge``."""

from __future__ import annotations

from collections.abc import Iterator

import click

from distsched import views
from distsched.cli.common import (
    connect,
    connect_existing,
    duration_option,
    info_dict,
    stacked,
    task_named,
)
from distsched.client import Scheduler
from distsched.errors import ConflictError, InvalidArgument, NotFoundError
from distsched.model import BulkOutcome, State, TaskInfo
from distsched.text import (
    CUT_CHARS,
    error_summary,
    escape,
    json_line,
    preview,
    relative,
    show,
    table,
)
from distsched.validate import tasks_limit

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
        relative(info.updated_at, now),
        error,
    ]


@click.command("tasks")
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
    tasks_limit(limit)  # a bad --limit is named before the namespace is looked up
    scheduler = connect_existing(ctx)
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


_bulk_options = stacked(
    click.option("--fn", default=None, help="Only tasks of this function."),
    duration_option(
        "--since",
        field="since",
        help="Only tasks that entered the state at most this long ago (e.g. 1h).",
    ),
    click.option("--limit", type=int, default=None, help="At most N tasks in all."),
    click.option(
        "--batch",
        type=int,
        default=100,
        show_default=True,
        help="Tasks per page (1-1000).",
    ),
)


_error_option = click.option(
    "--error",
    default=None,
    help="Act on the failed tasks of this error group instead (see `distsched failures`).",
)


def _report_error_walk(verb: str, outcome: BulkOutcome) -> None:
    skipped = f", skipped {outcome.skipped}" if outcome.skipped else ""
    click.echo(
        f"{verb} {outcome.done} failed tasks of the group{skipped} "
        f"({outcome.examined} failed tasks examined)"
    )


def _progress(verb: str, done: int, skipped: int) -> None:
    click.echo(f"{verb} {done}, skipped {skipped}", err=True)


@click.command()
@click.argument("task_id", metavar="[ID]", required=False)
@click.option(
    "--no-cascade",
    is_flag=True,
    help="Retry only the task; the tasks it blocked stay blocked.",
)
@click.option(
    "--state",
    type=click.Choice(RETRYABLE_STATES),
    default=None,
    help="Retry every task in this state instead of one ID (with --fn, --since).",
)
@_error_option
@_bulk_options
@click.pass_context
def retry(
    ctx: click.Context,
    task_id: str | None,
    no_cascade: bool,
    state: str | None,
    error: str | None,
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

    With --error instead, retries every failed task of that error group (as
    `distsched failures` lists them; any error line of the group will do).
    """
    if sum(x is not None for x in (task_id, state, error)) != 1:
        raise click.UsageError("give either ID or --state (or --error)")
    if state is None and (fn or since is not None):
        raise click.UsageError("--fn and --since go with --state")
    if task_id is not None and limit is not None:
        raise click.UsageError("--limit goes with --state or --error")
    scheduler = connect_existing(ctx) if state is not None else connect(ctx)
    if error is not None:
        done = scheduler.retry_failures(error, cascade=not no_cascade, batch=batch, limit=limit)
        _report_error_walk("retried", done)
        return
    if state is not None:
        _retry_state(
            scheduler, state, not no_cascade, _listing(scheduler, state, fn, since, limit, batch)
        )
        return
    assert task_id is not None
    _retry_one(ctx, scheduler, task_id, no_cascade)


def _retry_state(
    scheduler: Scheduler, state: str, cascade: bool, pages: Iterator[list[TaskInfo]]
) -> None:
    retried = skipped = 0
    for items in pages:
        for info in items:
            try:
                scheduler.retry(info.task_id, cascade=cascade)
                retried += 1
            except (ConflictError, NotFoundError):
                skipped += 1  # it moved on since the page was read
        _progress("retried", retried, skipped)
    click.echo(f"retried {retried} {state} tasks" + (f", skipped {skipped}" if skipped else ""))


def _retry_one(ctx: click.Context, scheduler: Scheduler, task_id: str, no_cascade: bool) -> None:
    with task_named(ctx, task_id):
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


@click.command()
@click.option(
    "--state",
    type=click.Choice(TERMINAL_STATES),
    default=None,
    help="Remove the tasks that ended in this state.",
)
@_error_option
@_bulk_options
@click.pass_context
def purge(
    ctx: click.Context,
    state: str | None,
    error: str | None,
    fn: str | None,
    since: float | None,
    limit: int | None,
    batch: int,
) -> None:
    """Remove ended tasks now, whatever the retention, with everything they own.

    Page by page (progress on stderr), newest first; safe to interrupt and run
    again. A task that left the state meanwhile, or is still telling its
    dependents that it ended, is skipped. Dependents keep their own records.

    With --error instead of --state, removes the failed tasks of that error group
    (as `distsched failures` lists them).
    """
    if (state is None) == (error is None):
        raise click.UsageError("give either --state or --error")
    if error is not None and (fn or since is not None):
        raise click.UsageError("--fn and --since go with --state")
    scheduler = connect(ctx) if error is not None else connect_existing(ctx)
    if error is not None:
        _report_error_walk("purged", scheduler.purge_failures(error, batch=batch, limit=limit))
        return
    assert state is not None
    removed = skipped = 0
    for items in _listing(scheduler, state, fn, since, limit, batch):
        gone = scheduler.purge_tasks([info.task_id for info in items])
        removed += gone
        skipped += len(items) - gone
        _progress("purged", removed, skipped)
    click.echo(f"purged {removed} {state} tasks" + (f", skipped {skipped}" if skipped else ""))
