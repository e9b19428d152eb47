"""``distsched why``: why a task is not running, in plain sentences."""

from __future__ import annotations

from collections.abc import Callable

import click

from distsched import views
from distsched.cli.common import connect, task_named
from distsched.model import Explanation, Reason, State
from distsched.text import (
    CUT_CHARS,
    escape,
    json_line,
    jsonable,
    progress_text,
    relative,
    show,
)
from distsched.times import span
from distsched.tracebacks import one_line


def _quoted(text: str | None, limit: int | None) -> str:
    """A stored string quoted, escaped and cut, as an error message names it."""
    return "None" if text is None else escape(repr(text if limit is None else text[:limit]))


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _fn_shown(exp: Explanation, limit: int | None) -> str:
    return views.show_id(exp.fn, limit) if exp.fn else "(unreadable payload)"


def _spent(exp: Explanation) -> str:
    return f"{exp.attempt} of {exp.max_attempts} attempts"


def _running(exp: Explanation, limit: int | None) -> str:
    lease = "with no lease recorded"
    if exp.lease_deadline is not None:
        lease = f"until {relative(exp.lease_deadline, exp.server_time)}"
    return (
        f"it runs attempt {exp.attempt} of {exp.max_attempts}, leased by "
        f"{views.show_id(exp.worker or '?', limit)} {lease}"
    )


def _cancel_requested(exp: Explanation, limit: int | None) -> str:
    return (
        "cancel requested: its function is asked to stop at the next heartbeat, "
        "and the task ends cancelled when it does"
    )


def _lease_expired(exp: Explanation, limit: int | None) -> str:
    now = exp.server_time
    ago = now - (exp.lease_deadline or now)
    then = "retries it" if exp.attempts_left else "fails it (no attempt left)"
    return f"its lease expired {span(ago)} ago: the next reap {then}"


def _succeeded(exp: Explanation, limit: int | None) -> str:
    return f"it succeeded {relative(exp.updated_at, exp.server_time)}"


def _failed(exp: Explanation, limit: int | None) -> str:
    error = show(one_line(exp.error), limit) if exp.error else "no error recorded"
    return f"it failed {relative(exp.updated_at, exp.server_time)} after {_spent(exp)}: {error}"


def _cancelled(exp: Explanation, limit: int | None) -> str:
    return f"it was cancelled {relative(exp.updated_at, exp.server_time)}"


def _expired(exp: Explanation, limit: int | None) -> str:
    if exp.state is State.CANCELLED:
        return "it expired: it was not started by its deadline"
    return "its root cause expired: it was not started by its deadline"


def _blocked(exp: Explanation, limit: int | None) -> str:
    cause = exp.blocked_by
    if cause is None:
        return "it is blocked; its root cause is not recorded"
    root_state = exp.root_state.value if exp.root_state else "no longer readable"
    if exp.root_state is State.FAILED and exp.root_error:
        # What made it fail, on one line: a waitpoint that timed out says so.
        root_state += f": {_quoted(one_line(exp.root_error), limit)}"
    return (
        f"it is blocked by {views.show_id(cause.root, limit)} ({root_state}), "
        f"via {views.show_path(cause.path, limit)}"
    )


def _placing(exp: Explanation, limit: int | None) -> str:
    return (
        "it is held while its dependencies are placed in parts; if this stays, "
        "the submission stopped part way: schedule it again or cancel it"
    )


def _waiting_on_deps(exp: Explanation, limit: int | None) -> str:
    waits = _count(exp.remaining, "required dependency", "required dependencies")
    text = f"it waits on {waits}"
    if exp.optional_remaining:
        text += f" and {exp.optional_remaining} optional"
    if exp.deps:
        text += ":"
    return text


def _waitpoint(exp: Explanation, limit: int | None) -> str:
    timeout = span(exp.waitpoint_timeout or 0.0)
    if exp.waitpoint_times_out_at is None:
        return (
            "it is a waitpoint: it waits for its own dependencies first, then for an "
            f"external completion, timing out {timeout} after they succeeded"
        )
    return (
        "it is a waitpoint waiting for an external completion (distsched waitpoint "
        "complete/fail, or waitpoint.lua from any service), times out "
        f"{relative(exp.waitpoint_times_out_at, exp.server_time)}; no worker runs it"
    )


def _not_due(exp: Explanation, limit: int | None) -> str:
    now = exp.server_time
    due = exp.due_at or now
    retry = f" (a retry after backoff, {_spent(exp)} spent)" if exp.attempt else ""
    return f"it is not due yet: due {relative(due, now)} (server clock){retry}"


def _unserved(exp: Explanation, limit: int | None) -> str:
    last = (
        "none ever announced it"
        if exp.served_at is None
        else f"last announced {exp.server_time - exp.served_at:.0f} s ago"
    )
    return f"no live worker serves its function {_fn_shown(exp, limit)}: {last}"


def _capacity(exp: Explanation, limit: int | None) -> str:
    return f"capacity is full: {exp.running} running, max_running {exp.max_running}"


def _behind(exp: Explanation, limit: int | None) -> str:
    return (
        f"it is due, {_count(exp.ahead or 0, 'queue entry', 'queue entries')} ahead of it "
        "(live tasks, and stale entries of replaced or cancelled tasks)"
    )


def _key_capped(exp: Explanation, limit: int | None) -> str:
    return (
        f"its fairness key {_quoted(exp.fair_key, limit)} is at its cap: "
        f"{exp.key_running} running, cap {exp.key_cap}"
    )


def _key_rate(exp: Explanation, limit: int | None) -> str:
    now = exp.server_time
    due = exp.key_next_at or now
    key = _quoted(exp.fair_key, limit)
    rate = f"{exp.key_rate} per {exp.key_per_s:g} s"
    left = "" if exp.key_units is None else f", {_count(exp.key_units, 'unit', 'units')} left"
    if exp.ahead:
        # The key waits for the units of the task at its head, not this one's.
        return (
            f"its fairness key {key} used its rate of {rate}{left}: next start {relative(due, now)}"
        )
    need = min(exp.cost, exp.key_rate or exp.cost)
    return (
        f"it is waiting for {_count(need, 'unit', 'units')} of the rate of its fairness key "
        f"{key} ({rate}{left}): it starts {relative(due, now)}"
    )


def _cost_over_rate(exp: Explanation, limit: int | None) -> str:
    return (
        f"its cost of {exp.cost} units is more than the whole rate of key "
        f"{_quoted(exp.fair_key, limit)} ({exp.key_rate} per {exp.key_per_s:g} s, lowered "
        "since it was scheduled): it starts only when the key's bucket is full, and takes "
        "all of it"
    )


def _next(exp: Explanation, limit: int | None) -> str:
    return "it is due and first in line: the next worker with a free slot claims it"


def _paused(exp: Explanation, limit: int | None) -> str:
    since = "" if exp.paused_at is None else f" {relative(exp.paused_at, exp.server_time)}"
    return f"it was paused{since}: no worker claims it until it is resumed ('distsched resume')"


def _window(exp: Explanation, limit: int | None) -> str:
    w = exp.workflow
    running, window = (w.window_running, w.window) if w is not None else (0, None)
    return (
        f"it waits for a window slot ({running} running, window {window}): it becomes ready "
        "when a child of its parent before it ends"
    )


def _not_queued(exp: Explanation, limit: int | None) -> str:
    return "it is ready but has no queue entry (its data was changed outside distsched)"


# The sentence of each reason (one this version does not know reads as not queued).
SENTENCES: dict[Reason, Callable[[Explanation, int | None], str]] = {
    Reason.RUNNING: _running,
    Reason.CANCEL_REQUESTED: _cancel_requested,
    Reason.LEASE_EXPIRED: _lease_expired,
    Reason.SUCCEEDED: _succeeded,
    Reason.FAILED: _failed,
    Reason.CANCELLED: _cancelled,
    Reason.EXPIRED: _expired,
    Reason.BLOCKED: _blocked,
    Reason.PLACING: _placing,
    Reason.WAITING_ON_DEPS: _waiting_on_deps,
    Reason.WAITPOINT: _waitpoint,
    Reason.NOT_DUE: _not_due,
    Reason.UNSERVED: _unserved,
    Reason.CAPACITY: _capacity,
    Reason.BEHIND: _behind,
    Reason.KEY_CAPPED: _key_capped,
    Reason.KEY_RATE: _key_rate,
    Reason.COST_OVER_RATE: _cost_over_rate,
    Reason.NEXT: _next,
    Reason.NOT_QUEUED: _not_queued,
    Reason.PAUSED: _paused,
    Reason.WINDOW: _window,
}


def _dep_lines(exp: Explanation, limit: int | None) -> list[str]:
    """Below the waiting sentence: one line per dependency shown."""
    lines = []
    for dep in exp.deps:
        kind = " (optional)" if dep.optional else ""
        state = dep.state.value if dep.state else "no record (not submitted yet)"
        lines.append(f"    {views.show_id(dep.task_id, limit)}{kind}: {state}")
    if exp.deps_not_shown:
        lines.append(f"    ... and {exp.deps_not_shown} more not shown")
    return lines


def _headline(exp: Explanation, limit: int | None) -> str:
    return (
        f"{views.show_id(exp.task_id, limit)} (version {exp.version}, fn {_fn_shown(exp, limit)}) "
        f"is {exp.state.value}" + ("." if exp.state is State.RUNNING else ", not running:")
    )


def _why_lines(exp: Explanation, limit: int | None = CUT_CHARS) -> list[str]:
    """The explanation in plain sentences: a headline, then one line per reason; every
    stored string escaped and cut to ``limit`` characters (None: whole)."""
    lines = [_headline(exp, limit)]
    if exp.workflow is not None:
        lines.append(f"- {views.workflow_text(exp.workflow, limit)}")
    for reason in exp.reasons:
        lines.append(f"- {SENTENCES.get(reason, _not_queued)(exp, limit)}")
        if reason is Reason.WAITING_ON_DEPS:
            lines += _dep_lines(exp, limit)
    if exp.progress is not None:
        lines.append(f"Progress: {progress_text(exp.progress, exp.server_time, limit)}.")
    if not exp.state.terminal and exp.state is not State.RUNNING and exp.waitpoint_timeout is None:
        lines.append(f"{_spent(exp)} spent, {exp.attempts_left} left.")
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
