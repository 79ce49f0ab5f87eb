"""`dlq inspect`: read a DLQ topic from the beginning to its current end and count what matches.

Owns `inspect_dlq`, `inspect_page` (one page from a cursor, bounded: its docstring) and `read_entry`.
Nothing is committed.

Imports the standard library and the `sidecar.ops.dlq.*` modules entries, filters, originals and reader; never
the engines, the ledger, the source, the daemon or the HTTP modules.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sidecar.kafka.tools import ReadConsumer
from sidecar.ops.dlq.entries import DlqEntry, entry_from_record
from sidecar.ops.dlq.filters import Filters
from sidecar.ops.dlq.originals import Originals
from sidecar.ops.dlq.payloads import PayloadReader
from sidecar.ops.dlq.reader import client_properties, dlq_partitions


@dataclass(slots=True)
class InspectResult:
    entries: list[DlqEntry] = field(default_factory=list)  # the first `limit` matching records
    scanned: int = 0
    matched: int = 0
    by_exception_class: Counter[str] = field(default_factory=Counter)
    by_source_topic: Counter[str] = field(default_factory=Counter)
    by_writer: Counter[str] = field(default_factory=Counter)
    payload_gone: int = 0  # headers-only records whose source offset was deleted


def inspect_dlq(
    bootstrap: str,
    topic: str,
    filters: Filters,
    *,
    limit: int | None = None,
    kafka: Mapping[str, str] | None = None,
    on_entry: Callable[[DlqEntry], None] | None = None,
    each: Callable[[DlqEntry], None] | None = None,
    payloads: PayloadReader | None = None,
    originals: Originals | None = None,
) -> InspectResult:
    """Read `topic` from the beginning to its current end; count every matching record, keep the first `limit`.

    With `originals`, each headers-only record the filters pass is checked against its source partition's log
    start (`DlqEntry.payload_gone`, counted in `payload_gone`; one request per source partition) and, with
    `payloads`, decoded from its source record (one fetch each)."""
    props = client_properties(bootstrap, kafka or {})
    consumer = ReadConsumer(props)
    result = InspectResult()
    now_ms = int(time.time() * 1000)
    try:
        parts = dlq_partitions(consumer, topic)
        marks = consumer.watermarks(topic, parts)
        for records in consumer.read_range(topic, marks):
            for record in records:
                entry = entry_from_record(record)
                result.scanned += 1
                if filters.mismatch(entry, now_ms) is not None:
                    continue
                gone = originals is not None and originals.check(entry) is not None
                if payloads is not None:
                    # A headers-only record is decoded from its source record (one fetch each).
                    original = None if originals is None or gone else originals.record(entry)
                    if not payloads.read(entry, original):
                        continue  # a --field filter on the decoded value
                result.matched += 1
                result.payload_gone += gone
                result.by_exception_class[entry.exception_class or "(none)"] += 1
                result.by_source_topic[
                    entry.source_topic
                    or ("(none named)" if entry.is_dlq_record else "(not a DLQ record)")
                ] += 1
                result.by_writer[entry.context.writer] += 1
                if each is not None:
                    each(entry)
                if limit is None or len(result.entries) < limit:
                    result.entries.append(entry)
                    if on_entry is not None:
                        on_entry(entry)
    finally:
        consumer.close()
    return result


@dataclass(frozen=True, slots=True)
class Page:
    """One page of matching records, in (partition, offset) order, and where the next one starts."""

    entries: list[DlqEntry]
    scanned: int
    cursor: dict[int, int]  # partition -> the offset this page started at
    next_cursor: dict[int, int] | None  # None: the topic's end (as seen now) is reached
    ends: dict[int, int]  # the high watermarks this page read up to


def inspect_page(
    consumer: ReadConsumer,
    topic: str,
    filters: Filters,
    *,
    cursor: Mapping[int, int] | None = None,
    size: int = 50,
    scan_budget: int = 20_000,
    now_ms: int | None = None,
    accept: Callable[[DlqEntry], bool] | None = None,
) -> Page:
    """Up to `size` records of `topic` matching `filters`, from `cursor` (partition -> next offset; None:
    the beginning), reading partition by partition and at most `scan_budget` records.

    Nothing is committed. Every matching record is counted (by exception class, source topic and the system
    that wrote it: `sidecar.ops.dlq.formats`), the first `limit` are kept for rendering or streamed to
    `on_entry` (`--json`), and every one is shown to `each` (the console's timeline). `inspect_page` reads one
    page of matching records from a cursor (the console's table): partition by partition, at most `size`
    matches and `scan_budget` records read, so a large topic is never read whole into memory;
    `read_entry` reads one record. `accept`, when given, is asked about each record the filters pass (the
    console's filter on decoded fields: it decodes the record onto the entry).
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    parts = dlq_partitions(consumer, topic)
    marks = consumer.watermarks(topic, parts)
    start = {p: max(lo, (cursor or {}).get(p, lo)) for p, (lo, _hi) in marks.items()}
    position = dict(start)
    entries: list[DlqEntry] = []
    scanned = 0

    def full() -> bool:
        return len(entries) >= size or scanned >= scan_budget

    for p in sorted(parts):
        end = marks[p][1]
        if position[p] >= end:
            continue
        for records in consumer.read_range(topic, {p: (position[p], end)}, stop=full):
            for record in records:
                if full():
                    break
                position[p] = record.offset + 1
                scanned += 1
                entry = entry_from_record(record)
                if filters.mismatch(entry, now) is None and (accept is None or accept(entry)):
                    entries.append(entry)
            if full():
                break
        if full():
            break
        position[p] = end  # read to its end (a transaction marker may sit on the last offset)
    more = any(position[p] < marks[p][1] for p in parts)
    return Page(
        entries=entries,
        scanned=scanned,
        cursor=start,
        next_cursor=position if more else None,
        ends={p: hi for p, (_lo, hi) in marks.items()},
    )


def read_entry(consumer: ReadConsumer, topic: str, partition: int, offset: int) -> DlqEntry | None:
    """The DLQ record at `topic[partition]@offset`; None when there is none (deleted, a marker)."""
    lo, hi = consumer.watermarks(topic, [partition])[partition]
    if not lo <= offset < hi:
        return None
    for records in consumer.read_range(topic, {partition: (offset, offset + 1)}):
        for record in records:
            if record.offset == offset:
                return entry_from_record(record)
    return None
