"""Throughput over time as an inline SVG bar chart: succeeded and failed per bucket."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Protocol

from distsched.text import iso

WIDTH = 720
HEIGHT = 160
PAD_LEFT = 44
PAD_BOTTOM = 22
PAD_TOP = 10
SUCCEEDED = "#16a34a"
FAILED = "#dc2626"


class Count(Protocol):
    """One minute of throughput (``model.MinuteCount``)."""

    @property
    def minute(self) -> float: ...
    @property
    def succeeded(self) -> int: ...
    @property
    def failed(self) -> int: ...


@dataclass(frozen=True)
class Bucket:
    start: float  # epoch seconds
    succeeded: int
    failed: int


def buckets(counts: Sequence[Count], per: int) -> list[Bucket]:
    """``per`` consecutive minutes summed into one bucket (oldest first)."""
    out: list[Bucket] = []
    for i in range(0, len(counts), per):
        group = counts[i : i + per]
        out.append(
            Bucket(
                float(group[0].minute),
                sum(c.succeeded for c in group),
                sum(c.failed for c in group),
            )
        )
    return out


def _nice(top: int) -> int:
    """The axis maximum: 1, 2 or 5 times a power of ten, at least ``top``."""
    scale = 1
    while True:
        for step in (1, 2, 5):
            if step * scale >= top:
                return step * scale
        scale *= 10


def render(data: Sequence[Bucket], title: str, unit: str) -> str:
    """Stacked bars (failed on top of succeeded) with an axis; every text escaped."""
    top = _nice(max((b.succeeded + b.failed for b in data), default=0) or 1)
    plot_w = WIDTH - PAD_LEFT - 6
    plot_h = HEIGHT - PAD_TOP - PAD_BOTTOM
    n = max(len(data), 1)
    slot = plot_w / n
    bar = max(1.0, slot * 0.8)
    total_ok = sum(b.succeeded for b in data)
    total_failed = sum(b.failed for b in data)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}: {total_ok} succeeded, {total_failed} failed">',
        f'<line x1="{PAD_LEFT}" y1="{PAD_TOP}" x2="{PAD_LEFT}" y2="{PAD_TOP + plot_h}" '
        'stroke="#9ca3af"/>',
        f'<line x1="{PAD_LEFT}" y1="{PAD_TOP + plot_h}" x2="{WIDTH - 6}" '
        f'y2="{PAD_TOP + plot_h}" stroke="#9ca3af"/>',
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + 10}" font-size="10" text-anchor="end">'
        f"{top:,}</text>",
        f'<text x="{PAD_LEFT - 4}" y="{PAD_TOP + plot_h}" font-size="10" text-anchor="end">'
        "0</text>",
    ]
    for i, b in enumerate(data):
        x = PAD_LEFT + i * slot + (slot - bar) / 2
        ok_h = plot_h * b.succeeded / top
        bad_h = plot_h * b.failed / top
        base = PAD_TOP + plot_h
        tip = f"{iso(b.start)} ({unit}): {b.succeeded} succeeded, {b.failed} failed"
        out.append(f"<g><title>{escape(tip)}</title>")
        if b.succeeded:
            out.append(
                f'<rect x="{x:.1f}" y="{base - ok_h:.1f}" width="{bar:.1f}" '
                f'height="{ok_h:.1f}" fill="{SUCCEEDED}"/>'
            )
        if b.failed:
            out.append(
                f'<rect x="{x:.1f}" y="{base - ok_h - bad_h:.1f}" width="{bar:.1f}" '
                f'height="{bad_h:.1f}" fill="{FAILED}"/>'
            )
        out.append("</g>")
    if data:
        first, last = iso(data[0].start)[11:16], iso(data[-1].start)[11:16]
        out.append(
            f'<text x="{PAD_LEFT}" y="{HEIGHT - 6}" font-size="10">{escape(first)} UTC</text>'
            f'<text x="{WIDTH - 6}" y="{HEIGHT - 6}" font-size="10" text-anchor="end">'
            f"{escape(last)} UTC</text>"
        )
    out.append("</svg>")
    return "".join(out)
