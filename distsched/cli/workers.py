"""The namespace's workers and the leases they hold: ``workers`` and ``leases``."""

from __future__ import annotations

import click

from distsched import views
from distsched.cli.common import connect, require_namespace, task_named
from distsched.text import duration, json_line, jsonable, show, table
from distsched.times import span
from distsched.tracebacks import one_line


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON: one object per worker.")
@click.pass_context
def workers(ctx: click.Context, as_json: bool) -> None:
    """The namespace's workers as they last registered (every heartbeat rewrites each).

    A worker shows as silent once it missed a few heartbeats; one that stays silent
    (killed, cut off) drops out of the list a few leases later.
    """
    scheduler = connect(ctx)
    require_namespace(ctx, scheduler)
    found = scheduler.workers()
    if as_json:
        click.echo(json_line([jsonable(info) for info in found]))
        return
    if not found:
        click.echo("no workers")
        return
    # Workers of a pool (``--serve``) share their slots with other namespaces: say which.
    pooled = any(info.serves for info in found)
    rows: list[tuple[str, ...]] = [
        ("worker", "host", "pid", "version", "running", "state", "last beat", "up", "functions",
         "counts", *(("slots shared with",) if pooled else ())),
    ]  # fmt: skip
    now = scheduler.server_time()
    for info in found:
        counts = ", ".join(f"{k} {v}" for k, v in info.counts.items() if v)
        shared = (show(one_line(", ".join(info.serves)) or "-"),) if pooled else ()
        rows.append(
            (
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
                *shared,
            )
        )
    for line in table(rows, right=frozenset({2})):
        click.echo(line)


@click.group()
def leases() -> None:
    """Inspect, expire and reap leases of running tasks."""


@leases.command("list")
@click.pass_context
def leases_list(ctx: click.Context) -> None:
    """Running tasks: holder, attempt and time left on the lease (server clock)."""
    scheduler = connect(ctx)
    require_namespace(ctx, scheduler)
    held = views.leases(scheduler)
    if not held:
        click.echo("no leases")
        return
    rows: list[tuple[str, ...]] = [("task", "holder", "attempt", "time left")]
    for lease in held:
        left = lease.seconds_left
        rows.append(
            (
                views.show_id(lease.task_id),
                show(lease.worker),
                f"{lease.attempt}/{lease.max_attempts}",
                span(left) if left >= 0 else f"expired {span(-left)} ago",
            )
        )
    for line in table(rows):
        click.echo(line)


@leases.command("expire")
@click.argument("task_id", metavar="ID")
@click.pass_context
def leases_expire(ctx: click.Context, task_id: str) -> None:
    """Expire task ID's lease now, as if its holder had vanished.

    The task gets a new attempt while attempts remain, otherwise it fails.
    """
    scheduler = connect(ctx)
    with task_named(ctx, task_id):
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
    scheduler = connect(ctx)
    require_namespace(ctx, scheduler)
    total = 0
    while True:
        handled = scheduler.reap()
        total += handled
        if handled == 0:
            break
    click.echo(f"reaped {total} expired lease{'s' if total != 1 else ''}")
