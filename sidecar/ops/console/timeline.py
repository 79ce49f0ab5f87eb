"""Dead letters over time: a histogram built in one pass in bounded memory, drawn as an SVG bar chart.

`Timeline.add` takes records in any order. The buckets start one second wide; whenever the records seen
span more than `max_buckets`, neighbours are merged and the width doubles, so memory is bounded by
`max_buckets` times the series kept (at most `max_series` names per chart, the rest counted as
"(other)"), whatever the topic's size. `svg_chart` draws one series set as stacked bars, server-side
(no JavaScript), every text escaped. Pure: no clock, no I/O.

Imports: the standard library and `sidecar.ops.dlq.entries` only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape

from sidecar.ops.dlq.entries import DlqEntry

OTHER = "(other)"
NONE = "(none)"
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
)
OTHER_COLOUR = "#bab0ac"


@dataclass(slots=True)
class _Series:
    """Counts per bucket for one way of naming records (reason, exception class)."""

    max_names: int
    totals: Counter[str] = field(default_factory=Counter)
    buckets: dict[int, Counter[str]] = field(default_factory=dict)

    def add(self, index: int, name: str) -> None:
        if name not in self.totals and len(self.totals) >= self.max_names:
            name = OTHER
        self.totals[name] += 1
        self.buckets.setdefault(index, Counter())[name] += 1

    def rebucket(self) -> None:
        merged: dict[int, Counter[str]] = {}
        for index, counts in self.buckets.items():
            merged.setdefault(index // 2, Counter()).update(counts)
        self.buckets = merged


@dataclass(slots=True)
class Timeline:
    """DLQ records per time bucket, by reason and by exception class."""

    max_buckets: int = 48
    max_series: int = 8
    width_ms: int = 1000
    origin_ms: int | None = None
    low: int | None = None
    high: int | None = None
    count: int = 0
    by_reason: _Series = field(init=False)
    by_class: _Series = field(init=False)

    def __post_init__(self) -> None:
        self.by_reason = _Series(self.max_series)
        self.by_class = _Series(self.max_series)

    def add(self, entry: DlqEntry) -> None:
        ts = entry.timestamp_ms
        if self.origin_ms is None:
            self.origin_ms = ts - ts % self.width_ms
        index = (ts - self.origin_ms) // self.width_ms
        low = index if self.low is None else min(self.low, index)
        high = index if self.high is None else max(self.high, index)
        while high - low >= self.max_buckets:
            self.width_ms *= 2
            self.by_reason.rebucket()
            self.by_class.rebucket()
            index, low, high = index // 2, low // 2, high // 2
        self.low, self.high = low, high
        self.count += 1
        self.by_reason.add(index, entry.reason or NONE)
        self.by_class.add(index, entry.exception_class or NONE)

    def span(self) -> tuple[int, int] | None:
        """(first bucket's start, last bucket's end) in ms, or None before any record."""
        if self.origin_ms is None or self.low is None or self.high is None:
            return None
        return (
            self.origin_ms + self.low * self.width_ms,
            self.origin_ms + (self.high + 1) * self.width_ms,
        )


def _label(ms: int, width_ms: int) -> str:
    when = datetime.fromtimestamp(ms / 1000, UTC)
    return when.strftime("%H:%M:%S" if width_ms < 60_000 else "%m-%d %H:%M")


def svg_chart(timeline: Timeline, series: str, title: str) -> str:
    """Stacked bars of `timeline`'s `series` ("reason" or "class"), with a legend; escaped SVG text."""
    data = timeline.by_reason if series == "reason" else timeline.by_class
    span = timeline.span()
    width, height, left, top, bottom = 720, 220, 44, 24, 36
    plot_w, plot_h = width - left - 12, height - top - bottom
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'viewBox="0 0 {width} {height + 22 * ((len(data.totals) + 2) // 3)}" '
        f'aria-label="{escape(title)}">',
        f'<text x="{left}" y="16" class="chart-title">{escape(title)}</text>',
    ]
    if span is None or timeline.low is None or timeline.high is None:
        parts.append(f'<text x="{left}" y="{top + 40}">no records</text></svg>')
        return "".join(parts)
    names = [name for name, _n in data.totals.most_common() if name != OTHER]
    if OTHER in data.totals:
        names.append(OTHER)
    colour = {
        name: (OTHER_COLOUR if name == OTHER else PALETTE[i % len(PALETTE)])
        for i, name in enumerate(names)
    }
    slots = timeline.high - timeline.low + 1
    tallest = max(sum(c.values()) for c in data.buckets.values())
    bar_w = plot_w / slots
    parts.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" '
        'stroke="#888"/>'
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" class="axis">{tallest}</text>'
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end" class="axis">0</text>'
    )
    for index in range(timeline.low, timeline.high + 1):
        counts = data.buckets.get(index)
        if not counts:
            continue
        x = left + (index - timeline.low) * bar_w
        y = float(top + plot_h)
        start_ms = (timeline.origin_ms or 0) + index * timeline.width_ms
        for name in names:
            n = counts.get(name, 0)
            if not n:
                continue
            h = plot_h * n / tallest
            y -= h
            parts.append(
                f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" '
                f'height="{h:.1f}" fill="{colour[name]}"><title>'
                f"{escape(_label(start_ms, timeline.width_ms))}: {escape(name)} {n}"
                "</title></rect>"
            )
    for x_ms, anchor, x in (
        (span[0], "start", left),
        (span[1], "end", left + plot_w),
    ):
        parts.append(
            f'<text x="{x}" y="{top + plot_h + 14}" text-anchor="{anchor}" class="axis">'
            f"{escape(_label(x_ms, timeline.width_ms))} UTC</text>"
        )
    for i, name in enumerate(names):
        lx = left + (i % 3) * 230
        ly = height + 22 * (i // 3)
        parts.append(
            f'<rect x="{lx}" y="{ly - 10}" width="10" height="10" fill="{colour[name]}"/>'
            f'<text x="{lx + 14}" y="{ly}" class="legend">{escape(name[:34])} '
            f"({data.totals[name]})</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


__all__ = ["Timeline", "svg_chart"]
