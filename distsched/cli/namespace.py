"""The namespace as a whole: ``stats`` and its settings (retention, max-running,
payload-limit, stripes, order)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any, cast

import click
from redis.cluster import RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoPermissionError

from distsched.cli.common import (
    connect,
    count_option,
    duration_option,
    memory_warning_option,
    require_namespace,
    settings_of,
)
from distsched.client import Scheduler, slot_owner
from distsched.errors import InvalidArgument
from distsched.keys import MAX_STRIPES, Keys
from distsched.model import PRIORITY_LABELS, Order, OrderSetting, Stats, stage_counts
from distsched.placement import masters_spanned
from distsched.retention import RetentionPlan
from distsched.text import duration, iso, parse_duration, redact, size, table
from distsched.worker.link import WorkerLink


def _by_priority(ages: Mapping[str, float]) -> list[tuple[str, float]]:
    """The per-priority oldest waits, highest priority bucket first."""
    order = {label: i for i, label in enumerate(reversed(PRIORITY_LABELS))}
    return sorted(ages.items(), key=lambda item: order.get(item[0], len(order)))


def _key_load_row(load: Mapping[str, Any]) -> tuple[str, str]:
    """One fair-share key's line: its running count against its cap, and its queue."""
    name = f"  key {load['key']!r}" if load["key"] else "  key '' (default)"
    cap = "none" if load["cap"] is None else load["cap"]
    wait = load["ready_wait_s"]
    first_due = "" if wait is None else f", first due {wait:.3f} s waiting"
    return name, f"{load['running']} running (cap {cap}), {load['queued']} queued{first_due}"


def _namespace_rows(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    limit = "unlimited" if data["max_running"] is None else data["max_running"]
    oldest = data["oldest_ready_age"]
    soon = f"{data['leases_soon_s']:g} s"
    order = data["order"]
    if order != "default":
        order = f"priority (aging {data['aging_s']:g} s per point)"
    entries = (
        f"{data['queue_entries']} ({data['live_entries']} live, {data['stale_entries']} stale)"
    )
    leases = (
        f"{data['leases']} ({data['leases_expired']} expired, "
        f"{data['leases_expiring']} expiring within {soon})"
    )
    return [
        ("queue entries", entries),
        ("stale ratio", f"{100 * data['stale_ratio']:.1f}%"),
        ("oldest due", "-" if oldest is None else f"{oldest:.3f} s waiting to start"),
        *[
            (f"  priority {bucket}", f"{age:.3f} s")
            for bucket, age in _by_priority(data["oldest_ready_age_by_priority"])
        ],
        ("order", order),
        ("running", f"{data['running']} (max_running: {limit})"),
        ("leases", leases),
        ("retention", duration(data["retention_s"])),
        ("sequence", str(data["sequence"])),
        *[_key_load_row(load) for load in data.get("keys", [])],
    ]


def _plan_rows(plan: RetentionPlan | None, warning: float) -> list[tuple[str, str]]:
    """The memory the ended tasks take and will take (docs: "Planning for retention")."""
    if plan is None:
        return [("ended tasks", "memory not readable by this user (needs HSTRLEN)")]
    per_task = plan.bytes_per_ended_task
    rows = [
        ("ended tasks", f"{plan.ended_kept} kept, {plan.ended_per_s:.1f}/s over the last 10 min"),
        ("bytes per ended", "-" if per_task is None else f"{per_task:.0f} B"),
        ("ended kept use", size(plan.kept_bytes)),
    ]
    projected = f"{size(plan.projected_bytes)} at this rate for {duration(plan.retention_s)}"
    if plan.maxmemory:
        projected += f" ({100 * (plan.fraction_of_maxmemory or 0):.0f}% of maxmemory)"
        if plan.over(warning):
            projected += f"  WARNING: over {100 * warning:.0f}% of maxmemory"
    elif plan.maxmemory == 0:
        projected += " (no maxmemory set)"
    rows.append(("projected", projected))
    return rows


def _stats_lines(
    data: Mapping[str, Any], plan: RetentionPlan | None = None, warning: float = 1.0
) -> list[str]:
    rows: list[tuple[str, ...]] = [("state", "tasks")]
    rows += [(state, str(count)) for state, count in stage_counts(cast(Stats, data)).items()]
    return [*table(rows), "", *table(_namespace_rows(data) + _plan_rows(plan, warning))]


def _retention_plan(scheduler: Scheduler) -> RetentionPlan | None:
    try:
        return scheduler.retention_plan()
    except NoPermissionError:
        return None  # a tenant's user without HSTRLEN: the rest of stats still shows


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one line per draw).")
@click.option("--watch", is_flag=True, help="Redraw every --interval until Ctrl-C.")
@duration_option(
    "--interval",
    field="interval",
    default="2s",
    help="Time between draws with --watch (seconds, or 500ms, 10s, 1m).",
)
@count_option(
    "--count",
    default=None,
    help="With --watch: stop after this many draws.",
)
@duration_option(
    "--soon",
    "soon_s",
    field="soon_s",
    default="5s",
    help="Count the leases whose deadline is this close (seconds, or 500ms, 10s, 1m).",
)
@memory_warning_option(
    "Warn when the projected memory of ended tasks exceeds this share of maxmemory."
)
@click.pass_context
def stats(
    ctx: click.Context,
    as_json: bool,
    watch: bool,
    interval: float,
    count: int | None,
    soon_s: float,
    memory_warning: float,
) -> None:
    """Tasks per state, queue entries (live, stale), the oldest due task's wait,
    running vs max_running, leases (expired, expiring soon), retention, and the
    memory ended tasks take and will take at the current rate.

    All times are on the Redis server's clock.
    """
    if interval < 0.01:
        raise InvalidArgument("interval", "must be at least 10ms")
    scheduler = connect(ctx)
    require_namespace(ctx, scheduler)
    settings = settings_of(ctx)
    interactive = watch and not as_json and sys.stdout.isatty()
    draws = 0
    try:
        while True:
            data = scheduler.overview(soon_s)
            plan = _retention_plan(scheduler)
            if as_json:
                shown = {**data, "retention_plan": None if plan is None else asdict(plan)}
                click.echo(json.dumps(shown))
            else:
                if interactive:
                    click.clear()
                if watch:
                    if draws and not interactive:
                        click.echo("")
                    click.echo(
                        f"namespace {settings.namespace!r} at {redact(settings.url)}, "
                        f"{iso(data['server_time'])}"
                    )
                for line in _stats_lines(data, plan, memory_warning):
                    click.echo(line)
            draws += 1
            if not watch or (count is not None and draws >= count):
                return
            time.sleep(interval)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how --watch ends


@click.command(context_settings={"ignore_unknown_options": True})  # '-1' is a value here
@click.argument("seconds", required=False, metavar="[SECONDS]")
@click.pass_context
def retention(ctx: click.Context, seconds: str | None) -> None:
    """Show, or set to SECONDS, how long terminal tasks are kept.

    SECONDS is a number of seconds or has a unit: 500ms, 90s, 30m, 12h, 7d.
    The setting belongs to the namespace (default 24 h). Workers purge older
    succeeded, failed, cancelled and blocked tasks, with their payloads,
    results and edges, as they go.
    """
    scheduler = connect(ctx)
    namespace = settings_of(ctx).namespace
    if seconds is None:
        require_namespace(ctx, scheduler)
        kept = scheduler.stats()["retention_s"]
        click.echo(f"retention of namespace {namespace!r}: {duration(kept)}")
        return
    value = parse_duration(seconds, "retention_s")
    scheduler.set_retention(value)
    kept = scheduler.stats()["retention_s"]
    click.echo(f"retention of namespace {namespace!r} set to {duration(kept)}")


@click.command("max-running", context_settings={"ignore_unknown_options": True})
@click.argument("limit", required=False, metavar="[N|none]")
@click.pass_context
def max_running(ctx: click.Context, limit: str | None) -> None:
    """Show, or set to N, how many tasks of the namespace may run at once.

    The bound holds across every worker of the namespace; `none` removes it,
    0 pauses claiming (running tasks finish).
    """
    scheduler = connect(ctx)
    namespace = settings_of(ctx).namespace

    def shown(value: int | None) -> str:
        return "unlimited" if value is None else str(value)

    if limit is None:
        require_namespace(ctx, scheduler)
        current = scheduler.stats()["max_running"]
        click.echo(f"max_running of namespace {namespace!r}: {shown(current)}")
        return
    value: int | None
    if limit.strip().lower() in ("none", "unlimited"):
        value = None
    else:
        try:
            value = int(limit)
        except ValueError:
            value = -1
        if value < 0:
            raise InvalidArgument(
                "max_running", f"must be a whole number >= 0 or 'none', got {limit!r}"
            )
    scheduler.set_max_running(value)
    current = scheduler.stats()["max_running"]
    click.echo(f"max_running of namespace {namespace!r} set to {shown(current)}")


@click.command("payload-limit")
@click.argument("limit", required=False, metavar="[BYTES|default]")
@click.pass_context
def payload_limit(ctx: click.Context, limit: str | None) -> None:
    """Show, or set to BYTES, the largest payload the namespace accepts.

    An operator's setting (at most 1 MiB, the default: a namespace may set less);
    `default` restores 1 MiB.
    """
    scheduler = connect(ctx)
    namespace = settings_of(ctx).namespace
    if limit is None:
        click.echo(f"payload limit of namespace {namespace!r}: {scheduler.payload_limit()} bytes")
        return
    value: int | None = None
    if limit.strip().lower() != "default":
        try:
            value = int(limit)
        except ValueError:
            raise InvalidArgument(
                "payload_max", f"must be a whole number of bytes or 'default', got {limit!r}"
            ) from None
    now = scheduler.set_payload_limit(value)
    click.echo(f"payload limit of namespace {namespace!r} set to {now} bytes")


@click.command()
@click.argument("count", required=False, type=click.IntRange(min=1, max=MAX_STRIPES))
@click.option(
    "--place",
    is_flag=True,
    help="Place the stripes of an empty namespace on distinct cluster masters again "
    "(after a reshard put two on one master).",
)
@click.pass_context
def stripes(ctx: click.Context, count: int | None, place: bool) -> None:
    """Show the namespace's stripes (hash slots, and masters on a cluster), or set
    their COUNT.

    A new count is taken only while the namespace holds no task, since ids map to
    stripes by hash; restart the workers after changing it. On a cluster the stripes
    of a new count are placed on distinct masters (as far as there are masters).
    """
    scheduler = connect(ctx)
    namespace = settings_of(ctx).namespace
    if count is not None:
        changed = Scheduler(scheduler.client, namespace=namespace, stripes=count)
        changed.close()
    if place:
        WorkerLink(scheduler).place_stripes()
    rows = [["stripe", "keys", "slot", "node"]]
    client = scheduler.client
    owner = slot_owner(client.nodes_manager) if isinstance(client, RedisCluster) else None
    keys_of = WorkerLink(scheduler).stripe_keys()
    for keys in keys_of:
        slot = key_slot(keys.meta.encode())
        node = "-" if owner is None else (owner(slot) or "?")
        rows.append([str(keys.stripe), keys.prefix + "*", str(slot), node])
    click.echo(f"namespace {namespace!r}: {len(rows) - 1} stripe(s)")
    for line in table(rows, right=frozenset({0, 2})):
        click.echo(line)
    if isinstance(client, RedisCluster) and owner is not None and len(keys_of) > 1:
        masters = len(client.get_primaries())  # type: ignore[no-untyped-call]
        click.echo(_placement_line(keys_of, owner, masters))


def _placement_line(keys: list[Keys], owner: Callable[[int], str | None], masters: int) -> str:
    """Whether the stripes span as many masters as they can, and what to do if not."""
    where = masters_spanned(keys, owner)
    spanned = len(set(where))
    best = min(len(keys), masters)
    line = f"stripes span {spanned} of {masters} master(s)"
    if spanned >= best:
        return line + " (as many as they can)"
    shared = sorted({m for m in where if m is not None and where.count(m) > 1})
    return (
        f"{line}; sharing a master: {', '.join(shared)}. An empty namespace is placed again "
        "by `distsched stripes --place`; one with tasks, by moving a stripe's slot to a "
        "master without one (`redis-cli --cluster reshard`)"
    )


@click.command()
@click.argument("order", required=False, type=click.Choice(["default", "priority"]))
@duration_option(
    "--aging",
    "aging_s",
    field="aging",
    default="60s",
    help="With priority: the wait one point of priority is worth (seconds, or 500ms, 1m).",
)
@click.pass_context
def order(ctx: click.Context, order: str | None, aging_s: float) -> None:
    """Show, or set, the order in which workers take the namespace's due tasks.

    default: first due, first served (ties by priority, then submission).
    priority: the highest priority first, each point of priority worth --aging of
    waiting, so a task waits at most (highest priority - its priority) x aging
    behind tasks that became due after it. Queued tasks follow the new order.
    """
    scheduler = connect(ctx)
    namespace = settings_of(ctx).namespace

    def shown(setting: OrderSetting) -> str:
        if setting.order is Order.DEFAULT:
            return "default"
        return f"priority, aging {setting.aging_s:g} s per point"

    if order is None:
        require_namespace(ctx, scheduler)
        click.echo(f"order of namespace {namespace!r}: {shown(scheduler.order())}")
        return
    setting = scheduler.set_order(order, aging=aging_s)
    click.echo(f"order of namespace {namespace!r} set to {shown(setting)}")


@click.group("namespace")
def namespace_group() -> None:
    """The namespace as a whole."""


@namespace_group.command("wipe")
@click.option("--yes", is_flag=True, help="Confirm: delete everything of the namespace.")
@click.pass_context
def namespace_wipe(ctx: click.Context, yes: bool) -> None:
    """Delete every task, schedule, setting and worker registration of the namespace.

    Irreversible; refused without --yes. Stop the namespace's workers first.
    """
    scheduler = connect(ctx)
    require_namespace(ctx, scheduler)
    name = settings_of(ctx).namespace
    if not yes:
        stats = scheduler.stats()
        total = sum(stats["counts"].values())
        raise click.ClickException(
            f"namespace {name!r} holds {total} task(s); nothing deleted: add --yes to wipe it"
        )
    scheduler.clear()
    click.echo(f"namespace {name!r} wiped")
