"""``distsched why``: why a task is not running, in plain sentences."""

from __future__ import annotations

import click

from distsched import views
from distsched.cli.common import (
    connect,
    task_named,
)
from distsched.core import (
    Explanation,
    Reason,
    State,
)
from distsched.text import (
    CUT_CHARS,
    escape,
    iso,
    json_line,
    jsonable,
    one_line,
    relative,
    show,
)


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


@click.command()
@click.argument("task_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--full", is_flag=True, help="Print ids and the error whole (not cut).")
@click.pass_context
def why(ctx: click.Context, task_id: str, as_json: bool, full: bool) -> None:
    """Why task ID is not running (or that it is), in plain sentences.

    Times are on the Redis server's clock. A due task's place counts the queue
    entries ahead of it, stale ones included.
    """
    scheduler = connect(ctx)
    with task_named(ctx, task_id):
        exp = scheduler.explain(task_id)
    if as_json:
        data = jsonable(exp)
        data["reasons"] = [reason.value for reason in exp.reasons]
        click.echo(json_line(data))
        return
    for line in _why_lines(exp, None if full else CUT_CHARS):
        click.echo(line)
