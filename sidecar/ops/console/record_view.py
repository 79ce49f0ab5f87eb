"""One DLQ record as the record page shows it: the decoded context, every header decoded per its format
(Spring's binary partition, offset and timestamp as numbers), key and value as text, pretty JSON or hex,
their sizes, and for a headers-only record the original read back from the source topic.

Pure: the caller reads the record (and the original) and passes them. At most `MAX_SHOWN_BYTES` of a key
or value are shown.

Imports: the standard library, `sidecar.kafka.tools` (the fetch's result type) and `sidecar.ops.dlq.*`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from sidecar.kafka.tools import Fetched
from sidecar.ops.dlq.entries import DlqEntry, Header
from sidecar.ops.dlq.formats import header_display

MAX_SHOWN_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Bytes:
    """A key or a value: its size, and how it reads (`kind`: null, json, text, hex)."""

    size: int | None
    kind: str
    shown: str
    cut: bool


@dataclass(frozen=True, slots=True)
class HeaderRow:
    name: str
    value: str
    kind: str
    size: int | None


@dataclass(frozen=True, slots=True)
class RecordView:
    entry: DlqEntry
    fields: list[tuple[str, str]]
    headers: list[HeaderRow]
    key: Bytes
    value: Bytes
    original: tuple[Bytes, Bytes, list[HeaderRow]] | None
    original_problem: str | None


def show_bytes(data: bytes | None) -> Bytes:
    if data is None:
        return Bytes(None, "null", "", False)
    part = data[:MAX_SHOWN_BYTES]
    cut = len(data) > MAX_SHOWN_BYTES
    try:
        text = part.decode("utf-8")
        binary = not all(ch.isprintable() or ch in "\t\n\r" for ch in text)
    except UnicodeDecodeError:
        binary = True
    if binary:
        lines = [part[i : i + 16].hex(" ") for i in range(0, len(part), 16)]
        return Bytes(len(data), "hex", "\n".join(lines), cut)
    if not cut:
        try:
            return Bytes(
                len(data), "json", json.dumps(json.loads(text), indent=2, ensure_ascii=False), False
            )
        except ValueError:
            pass
    return Bytes(len(data), "text", text, cut)


def header_rows(headers: tuple[Header, ...] | list[Header], fmt: str) -> list[HeaderRow]:
    rows = []
    for name, value in headers:
        shown, kind = header_display(name, value, fmt)
        rows.append(HeaderRow(name, shown, kind, None if value is None else len(value)))
    return rows


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def record_view(entry: DlqEntry, original: Fetched | None) -> RecordView:
    ctx = entry.context
    fields = [
        ("DLQ record", f"{entry.dlq_topic}[{entry.dlq_partition}]@{entry.dlq_offset}"),
        ("DLQ time (UTC)", _when(entry.timestamp_ms)),
        ("format", entry.format),
        ("writer", ctx.writer),
        ("source topic", entry.source_topic or ""),
        ("source partition", "" if entry.source_partition is None else str(entry.source_partition)),
        ("source offset", "" if entry.source_offset is None else str(entry.source_offset)),
        ("source time (UTC)", _when(ctx.source_timestamp_ms)),
        ("group or connector", entry.group or ""),
        ("delivery count", "" if entry.delivery_count is None else str(entry.delivery_count)),
        ("reason", entry.reason or ""),
        ("exception class", entry.exception_class or ""),
        ("root cause class", ctx.cause_class or ""),
        ("exception message", entry.exception_message or ""),
        ("detail", ctx.detail or ""),
        ("replays so far", str(entry.replay_count)),
        ("headers only", "yes" if entry.headers_only else "no"),
    ]
    shown_original = None
    problem = None
    if original is not None:
        if original.record is not None:
            rec = original.record
            shown_original = (
                show_bytes(rec.key),
                show_bytes(rec.value),
                header_rows(rec.headers, "unknown"),
            )
        else:
            problem = original.reason
    elif entry.headers_only:
        problem = "the record names no source offset to read the original from"
    return RecordView(
        entry=entry,
        fields=[(k, v) for k, v in fields if v],
        headers=header_rows(entry.headers, entry.format),
        key=show_bytes(entry.key),
        value=show_bytes(entry.value),
        original=shown_original,
        original_problem=problem,
    )


__all__ = ["RecordView", "record_view", "show_bytes"]
