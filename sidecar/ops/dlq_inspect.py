"""`dlq inspect`: read a DLQ topic from the beginning to its current end and count what matches.

Nothing is committed. Every matching record is counted (by exception class, source topic and the system
that wrote it: `sidecar.ops.dlq_formats`), the
first `limit` are kept for rendering or streamed to `on_entry` (`--json`).

Imports: the standard library and the `sidecar.ops.dlq_*` modules entries, filters and reader (which
reads through `sidecar.kafka.tools`).
Must not import the engines, the ledger, the source, the daemon or the HTTP modules; of the DLQ writer it
shares only the header names (`sidecar.kafka.dlq`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sidecar.kafka.tools import ReadConsumer
from sidecar.ops.dlq_entries import DlqEntry, entry_from_record
from sidecar.ops.dlq_filters import Filters
from sidecar.ops.dlq_reader import client_properties, dlq_partitions


@dataclass(slots=True)
class InspectResult:
    entries: list[DlqEntry] = field(default_factory=list)  # the first `limit` matching records
    scanned: int = 0
    matched: int = 0
    by_exception_class: Counter[str] = field(default_factory=Counter)
    by_source_topic: Counter[str] = field(default_factory=Counter)
    by_writer: Counter[str] = field(default_factory=Counter)


def inspect_dlq(
    bootstrap: str,
    topic: str,
    filters: Filters,
    *,
    limit: int | None = None,
    kafka: Mapping[str, str] | None = None,
    on_entry: Callable[[DlqEntry], None] | None = None,
) -> InspectResult:
    """Read `topic` from the beginning to its current end; count every matching record, keep the first `limit`."""
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
                result.matched += 1
                result.by_exception_class[entry.exception_class or "(none)"] += 1
                result.by_source_topic[
                    entry.source_topic
                    or ("(none named)" if entry.is_dlq_record else "(not a DLQ record)")
                ] += 1
                result.by_writer[entry.context.writer] += 1
                if limit is None or len(result.entries) < limit:
                    result.entries.append(entry)
                    if on_entry is not None:
                        on_entry(entry)
    finally:
        consumer.close()
    return result
