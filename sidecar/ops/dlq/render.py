"""Rendering the results of `dlq inspect` and `dlq replay` for a terminal or a pipe (rich).

Owns the tables of records (a payload preview never prints more than a few dozen bytes), the counts
and the replay summary; writes only to the `Console` it is given, decides nothing. Every value from a
record is printed as plain text, never as rich markup.

Imports the standard library, rich and the `sidecar.ops.dlq.*` result types; never the engines, the
ledger, the source, the daemon or the HTTP modules.
"""

from __future__ import annotations

from datetime import UTC, datetime

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sidecar.ops.dlq.entries import DlqEntry
from sidecar.ops.dlq.inspect import InspectResult
from sidecar.ops.dlq.replay import ReplayOptions, ReplaySummary


def payload_preview(entry: DlqEntry, width: int = 40) -> str:
    payload = entry.payload
    if entry.payload_gone is not None:
        return entry.payload_gone
    if payload is not None and payload.schema is not None:
        text: str = payload.preview()
        return text if len(text) <= width * 3 else text[: width * 3 - 1] + "…"
    if entry.headers_only:
        if payload is not None:
            return f"(headers only) the source's value not decoded: {payload.reason}"
        return "(headers only)"
    if entry.value is None:
        return "(null value)"
    if payload is not None:
        return f"{_bytes_preview(entry.value, width)} not decoded: {payload.reason}"
    return _bytes_preview(entry.value, width)


def _bytes_preview(value: bytes, width: int) -> str:
    try:
        text = value.decode("utf-8")
        shown = text if len(text) <= width else text[: width - 1] + "…"
        shown = shown.replace("\n", "\\n")
    except UnicodeDecodeError:
        shown = "0x" + value[: width // 2].hex() + ("…" if len(value) > width // 2 else "")
    return f"{shown} ({len(value)} B)"


def written_by(e: DlqEntry) -> str:
    """The writer's format and, where it says, the group, connector or application: `connect my-sink`."""
    return f"{e.format} {e.group}" if e.group else e.format


# Below this many columns (140 before the "written by" column) the ten-column table has no room left for its folded columns (an 80-column terminal
# showed the payload column zero wide): each record is then a block of "name: value" lines instead.
WIDE_TABLE_MIN_COLUMNS = 160


def _fields(e: DlqEntry) -> list[tuple[str, str]]:
    return [
        ("DLQ p/offset", f"{e.dlq_partition}/{e.dlq_offset}"),
        ("written by", written_by(e)),
        (
            "source topic",
            e.source_topic or ("(none named)" if e.is_dlq_record else "(not a DLQ record)"),
        ),
        ("src p@offset", f"{e.source_partition}@{e.source_offset}" if e.source_topic else ""),
        ("count", str(e.delivery_count if e.delivery_count is not None else "")),
        (
            "exception class",
            (e.exception_class or "")
            + (f" (cause {e.context.cause_class})" if e.context.cause_class else ""),
        ),
        ("message", e.exception_message or e.cause or ""),
        (
            "DLQ time (UTC)",
            datetime.fromtimestamp(e.timestamp_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[
                :-3
            ],
        ),
        ("replays", str(e.replay_count or "")),
        ("payload", payload_preview(e)),
    ]


def render_inspect(console: Console, result: InspectResult, topic: str) -> None:
    if console.width < WIDE_TABLE_MIN_COLUMNS:
        _render_inspect_blocks(console, result, topic)
    else:
        _render_inspect_table(console, result, topic)
    render_inspect_summary(console, result)


def _render_inspect_table(console: Console, result: InspectResult, topic: str) -> None:
    table = Table(title=Text(f"DLQ {topic}"), show_lines=False)
    table.add_column("DLQ p/offset", no_wrap=True)
    table.add_column("written by", overflow="fold")
    table.add_column("source topic", overflow="fold")
    table.add_column("src p@offset", no_wrap=True)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("exception class", overflow="fold")
    table.add_column("message", overflow="fold")
    table.add_column("DLQ time (UTC)", no_wrap=True)
    table.add_column("replays", justify="right", no_wrap=True)
    table.add_column("payload", overflow="fold", min_width=12)
    for e in result.entries:
        table.add_row(*(Text(value) for _, value in _fields(e)))
    console.print(table)


def _render_inspect_blocks(console: Console, result: InspectResult, topic: str) -> None:
    console.print(f"DLQ {topic}", markup=False, highlight=False)
    for e in result.entries:
        block = Table.grid(padding=(0, 1))
        block.add_column(style="bold", no_wrap=True)
        block.add_column(overflow="fold")
        for name, value in _fields(e):
            if value:
                block.add_row(f"{name}:", Text(value))
        console.print()
        console.print(block)
    console.print()


def render_inspect_summary(console: Console, result: InspectResult) -> None:
    shown = len(result.entries)
    console.print(
        f"{result.matched} matching of {result.scanned} records read"
        + (f"; first {shown} shown" if shown < result.matched else ""),
        markup=False,
        highlight=False,
    )
    if result.payload_gone:
        console.print(
            f"{result.payload_gone} headers-only records: payload gone (their source offset was "
            "deleted; they cannot be replayed)",
            markup=False,
            highlight=False,
        )
    for title, counts in (
        ("by exception class", result.by_exception_class),
        ("by source topic", result.by_source_topic),
        ("by writer", result.by_writer),
    ):
        table = Table(title=Text(title))
        table.add_column("name", overflow="fold")
        table.add_column("records", justify="right")
        for name, n in counts.most_common():
            table.add_row(Text(name), str(n))
        console.print(table)


def render_replay_summary(console: Console, s: ReplaySummary, options: ReplayOptions) -> None:
    def say(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    for line in s.planned:
        say(line)
    verb = "would replay" if s.dry_run else "replayed"
    say(
        f"{'DRY RUN: ' if s.dry_run else ''}{verb} {s.replayed_total} of {s.matched} matching records "
        f"({s.scanned} read from {options.dlq_topic}) in {s.elapsed_s:.1f}s under name {options.name!r}"
    )
    for topic, n in sorted(s.replayed.items()):
        say(f"  {verb} to {topic}: {n}")
    for reason, n in sorted(s.skipped.items()):
        say(f"  skipped, {reason}: {n}")
    for title, problems in (
        ("skipped, replayed too often", s.max_replays_skipped),
        ("UNRECOVERABLE (partition stopped here; --skip-unrecoverable passes it)", s.unrecoverable),
        ("unrecoverable, skipped", s.unrecoverable_skipped),
        ("FAILED (partition stopped here)", s.failures),
    ):
        if problems:
            say(f"  {title}: {len(problems)}")
            for problem in problems[:20]:
                say(f"    {problem.coordinates} ({problem.source}): {problem.reason}")
            if len(problems) > 20:
                say(f"    ... and {len(problems) - 20} more")
    if s.committed:
        where = ", ".join(f"[{p}] {o}" for p, o in sorted(s.committed.items()))
        say(f"  committed {options.dlq_topic} for group {options.group}: {where}")
    elif not s.dry_run:
        say(f"  nothing new committed for group {options.group}")
