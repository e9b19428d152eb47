"""``distsched waitpoint``: create, complete and fail waitpoints from the command line."""

from __future__ import annotations

import click

from distsched.cli.common import connect, duration_option, parse_json, task_named


@click.group("waitpoint")
def waitpoint_group() -> None:
    """Waitpoints: tasks no worker runs, which wait for a call from any service.

    A waitpoint stays pending until it is completed (it succeeds, the payload its
    result) or failed, or times out (it fails: 'timed out waiting for completion').
    Tasks depending on it wait for it as for any task.
    """


@waitpoint_group.command("create")
@click.argument("task_id", metavar="ID")
@duration_option(
    "--timeout",
    field="waitpoint",
    default=None,
    help="How long it waits for its completion once its own dependencies succeeded "
    "(90, 30s, 5m, 1h, 7d).",
)
@click.option("--dep", "deps", multiple=True, help="A dependency to wait for first (repeat).")
@click.option("--allow-unknown", is_flag=True, help="Accept dependencies not submitted yet.")
@click.pass_context
def create(
    ctx: click.Context,
    task_id: str,
    timeout: float | None,
    deps: tuple[str, ...],
    allow_unknown: bool,
) -> None:
    """Create waitpoint ID; print its version."""
    if timeout is None:
        raise click.UsageError("give --timeout")
    scheduler = connect(ctx)
    version = scheduler.create_waitpoint(task_id, timeout, deps=deps, allow_unknown=allow_unknown)
    click.echo(version)


@waitpoint_group.command("complete")
@click.argument("task_id", metavar="ID")
@click.option("--payload", default=None, help="The payload, as JSON (its dependents read it).")
@click.option("--version", type=click.IntRange(min=1), default=None, help="Only this version.")
@click.option("--by", default="", help="Who completes it (kept in its history).")
@click.pass_context
def complete(
    ctx: click.Context, task_id: str, payload: str | None, version: int | None, by: str
) -> None:
    """Complete waitpoint ID; print applied, duplicate or stale."""
    value = None if payload is None else parse_json(payload, "payload", object)
    scheduler = connect(ctx)
    with task_named(ctx, task_id):
        outcome = scheduler.complete_waitpoint(task_id, value, version=version, by=by)
    click.echo(outcome.value)


@waitpoint_group.command("fail")
@click.argument("task_id", metavar="ID")
@click.option("--error", required=True, help="Why it failed (its dependents are blocked).")
@click.option("--version", type=click.IntRange(min=1), default=None, help="Only this version.")
@click.option("--by", default="", help="Who fails it (kept in its history).")
@click.pass_context
def fail(ctx: click.Context, task_id: str, error: str, version: int | None, by: str) -> None:
    """Fail waitpoint ID; print applied, duplicate or stale."""
    scheduler = connect(ctx)
    with task_named(ctx, task_id):
        outcome = scheduler.fail_waitpoint(task_id, error, version=version, by=by)
    click.echo(outcome.value)
