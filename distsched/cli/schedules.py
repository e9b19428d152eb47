"""``distsched schedules``: recurring tasks."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any
from zoneinfo import ZoneInfo

import click

from distsched.cli.common import connect, connect_existing, duration_option, parse_json, settings_of
from distsched.client import Scheduler
from distsched.schedules import MAX_BACKFILL_SLOTS, Overlap, Schedule, ScheduleOptions
from distsched.text import duration, iso, json_line, jsonable, parse_when, relative, show, table
from distsched.tracebacks import one_line


@click.group("schedules")
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
    scheduler = connect_existing(ctx)
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
        next_fire = "-" if sc.next_fire is None else relative(sc.next_fire, now)
        rows.append(
            (
                show(one_line(sc.name)),
                show(one_line(sc.fn)),
                show(one_line(_when_text(sc))),
                _schedule_state(sc),
                next_fire,
                sc.overlap.value,
                "-" if sc.timeout is None else f"{sc.timeout:g} s",
                str(sc.fired),
                str(sc.skipped),
                str(sc.missed),
            )
        )
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
@duration_option("--interval", field="interval", help="Fire every DURATION (30s, 5m, 1h).")
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--max-attempts", type=int, default=1, show_default=True)
@duration_option("--backoff", field="backoff", default=1.0)
@click.option(
    "--start", metavar="WHEN", help="First slot no earlier than this (epoch s or ISO-8601)."
)
@click.option("--end", metavar="WHEN", help="No slot after this (epoch s or ISO-8601).")
@duration_option(
    "--jitter",
    field="jitter",
    default=0.0,
    show_default=False,
    help="Delay each run by up to DURATION.",
)
@click.option("--paused", is_flag=True, help="Add it paused.")
@click.option(
    "--overlap",
    type=click.Choice([o.value for o in Overlap]),
    default="skip",
    show_default=True,
    help="What a slot does while the previous run is still queued or running.",
)
@click.option(
    "--catchup",
    type=click.Choice(["all", "latest"]),
    default="latest",
    show_default=True,
    help="After an outage, fire all missed slots within the window, or only the latest.",
)
@duration_option(
    "--catchup-window",
    field="catchup_window",
    default=3600.0,
    help="How far back missed slots still fire (older ones are counted as missed).",
)
@click.option(
    "--key",
    "fair_key",
    metavar="KEY",
    help="Fairness key (tenant) of the tasks it fires (default: the default key).",
)
@duration_option(
    "--timeout",
    field="timeout",
    metavar="DURATION",
    help="Time limit of each run it fires (default: the worker's); past it the attempt fails.",
)
@click.pass_context
def schedules_add(
    ctx: click.Context,
    name: str,
    fn: str,
    args_json: str,
    kwargs_json: str,
    cron: str | None,
    tz: str,
    interval: float | None,
    priority: int,
    max_attempts: int,
    backoff: float,
    start: str | None,
    end: str | None,
    jitter: float,
    paused: bool,
    overlap: str,
    catchup: str,
    catchup_window: float,
    fair_key: str | None,
    timeout: float | None,
) -> None:
    """Add (or replace) schedule NAME; print its next fire time."""
    options: ScheduleOptions = {
        "args": parse_json(args_json, "args", list),
        "kwargs": parse_json(kwargs_json, "kwargs", dict),
        "cron": cron,
        "tz": tz,
        "interval": interval,
        "priority": priority,
        "max_attempts": max_attempts,
        "backoff": backoff,
        "start": None if start is None else parse_when(start, "start"),
        "end": None if end is None else parse_when(end, "end"),
        "jitter": jitter,
        "paused": paused,
        "overlap": overlap,
        "catchup": catchup,
        "catchup_window": catchup_window,
        "key": fair_key,
        "timeout": timeout,
    }
    scheduler = connect(ctx)
    sc = scheduler.add_schedule(name, fn, **options)
    fire = _next_fire(scheduler, sc.next_fire)
    click.echo(f"{sc.name}: {_when_text(sc)}, {_schedule_state(sc)}, next fire {fire}")


def _next_fire(scheduler: Scheduler, when: float | None) -> str:
    return "-" if when is None else relative(when, scheduler.server_time())


@schedules_group.command("remove")
@click.argument("name")
@click.pass_context
def schedules_remove(ctx: click.Context, name: str) -> None:
    """Remove schedule NAME (the tasks it created stay)."""
    scheduler = connect(ctx)
    if not scheduler.remove_schedule(name):
        raise click.ClickException(
            f"no schedule {name!r} in namespace {settings_of(ctx).namespace!r}"
        )
    click.echo(f"removed {name}")


@schedules_group.command("pause")
@click.argument("name")
@click.pass_context
def schedules_pause(ctx: click.Context, name: str) -> None:
    """Stop firing NAME until it is resumed."""
    sc = connect(ctx).pause_schedule(name)
    click.echo(f"{sc.name}: paused")


@schedules_group.command("resume")
@click.argument("name")
@click.pass_context
def schedules_resume(ctx: click.Context, name: str) -> None:
    """Fire NAME again from its next slot after now (slots while paused are not caught up)."""
    scheduler = connect(ctx)
    sc = scheduler.resume_schedule(name)
    click.echo(f"{sc.name}: {_schedule_state(sc)}, next fire {_next_fire(scheduler, sc.next_fire)}")


@schedules_group.command("trigger")
@click.argument("name")
@click.pass_context
def schedules_trigger(ctx: click.Context, name: str) -> None:
    """Run NAME now, through its overlap policy; print the task id."""
    scheduler = connect(ctx)
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
    "--limit",
    type=int,
    default=MAX_BACKFILL_SLOTS,
    show_default=True,
    help="The most slots created by this call, from the earliest.",
)
@click.pass_context
def schedules_backfill(ctx: click.Context, name: str, start: str, end: str, limit: int) -> None:
    """Create the tasks of NAME's slots within [--start, --end]; print how many.

    Slots whose task exists already (fired, or backfilled before) create nothing.
    """
    scheduler = connect(ctx)
    created = scheduler.backfill(name, parse_when(start, "start"), parse_when(end, "end"), limit)
    click.echo(f"created {created} task{'s' if created != 1 else ''}")


@schedules_group.command("next")
@click.argument("name")
@click.option("-n", "n", type=int, default=5, show_default=True, help="How many.")
@click.pass_context
def schedules_next(ctx: click.Context, name: str, n: int) -> None:
    """The next fire times of NAME (UTC, and local time for a cron schedule)."""
    scheduler = connect(ctx)
    sc = scheduler.get_schedule(name)
    for when in scheduler.next_fires(name, n):
        line = iso(when)
        if sc.cron is not None:
            local = datetime.datetime.fromtimestamp(when, ZoneInfo(sc.tz))
            line += f"  {local.isoformat()} {sc.tz}"
        click.echo(line)
