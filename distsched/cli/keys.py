"""``distsched keys``: fairness keys (tenants), their caps, weights and rates."""

from __future__ import annotations

import click

from distsched.cli.common import connect, connect_existing, duration_option
from distsched.errors import InvalidArgument
from distsched.model import KeyInfo


@click.group()
def keys() -> None:
    """Fairness keys (tenants): caps, weights, and what each one runs and queues."""


def _key_line(info: KeyInfo) -> str:
    cap = info.cap if info.cap is not None else info.default_cap
    shown_cap = "none" if cap is None else str(cap)
    if info.cap is None and info.default_cap is not None:
        shown_cap += " (default)"
    name = repr(info.key) if info.key else "'' (default key)"
    rate = "" if info.rate is None else f", rate {info.rate} per {info.per_s:g} s"
    if info.rate is not None and info.units is not None:
        rate += f" ({info.units} of {info.rate} units left)"
    return (
        f"{name}: cap {shown_cap}, weight {info.weight}{rate}, running {info.running}, "
        f"queued {info.queued}, {info.turn}"
    )


@keys.command("set")
@click.argument("key")
@click.option("--cap", type=int, default=None, help="Most tasks of KEY running at once.")
@click.option("--weight", type=int, default=1, show_default=True, help="Share of claims.")
@click.option(
    "--rate",
    type=int,
    default=None,
    help="Most units of KEY started per --per (a task takes its --cost, 1 unless given).",
)
@duration_option(
    "--per",
    "per_s",
    field="per",
    default="1s",
    help="The interval of --rate (seconds, or 500ms, 1m).",
)
@click.pass_context
def keys_set(
    ctx: click.Context, key: str, cap: int | None, weight: int, rate: int | None, per_s: float
) -> None:
    """Set KEY's cap, weight and rate ('' is the default key); no --cap: the default cap."""
    scheduler = connect(ctx)
    info = scheduler.set_key(key, cap=cap, weight=weight, rate=rate, per=per_s)
    click.echo(_key_line(info))


@keys.command("default")
@click.argument("cap")
@click.pass_context
def keys_default(ctx: click.Context, cap: str) -> None:
    """Set the cap of every key without its own: a whole number, or 'none'."""
    scheduler = connect(ctx)
    value: int | None = None
    if cap.lower() != "none":
        try:
            value = int(cap)
        except ValueError:
            raise InvalidArgument("cap", f"must be a whole number or 'none', got {cap!r}") from None
    scheduler.set_default_key_cap(value)
    click.echo(f"default key cap set to {cap.lower() if value is None else value}")


@keys.command("show")
@click.argument("key")
@click.pass_context
def keys_show(ctx: click.Context, key: str) -> None:
    """KEY's settings, running and queued tasks."""
    scheduler = connect_existing(ctx)
    click.echo(_key_line(scheduler.key_info(key)))


@keys.command("list")
@click.option("--limit", type=int, default=100, show_default=True)
@click.pass_context
def keys_list(ctx: click.Context, limit: int) -> None:
    """Keys with work or settings, most running first."""
    scheduler = connect_existing(ctx)
    infos = scheduler.fair_keys(limit)
    if not infos:
        click.echo("no fairness keys")
    for info in infos:
        click.echo(_key_line(info))
