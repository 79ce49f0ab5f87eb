"""The originals of headers-only DLQ records, in their source topics: still there, or gone.

Owns `Originals`: for a DLQ record that holds no copy, whether its source offset still exists (the
partition's log start, read once per partition per command or page: cheap) and, when the tools
decode payloads, the source record itself (one fetch each). Sets `DlqEntry.payload_gone` with the
plain words of `sidecar.kafka.tools.payload_gone`. Blocking.

Imports: the standard library, the core's errors, `sidecar.kafka.tools` and `sidecar.ops.dlq.entries`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.core.errors import KafkaClientError
from sidecar.kafka.tools import Fetched, OffsetFetcher, ReadRecord, payload_gone
from sidecar.ops.dlq.entries import DlqEntry

# Log starts remembered per command or page (one per source partition seen).
MAX_PARTITIONS = 10_000


class Originals:
    """Reads what a headers-only DLQ record points at, through one `OffsetFetcher`."""

    def __init__(self, props: Mapping[str, Any], timeout_s: float = 10.0) -> None:
        self._props = dict(props)
        self._timeout_s = timeout_s
        self._made: OffsetFetcher | None = None  # made at the first headers-only record
        self._starts: dict[tuple[str, int], int | str] = {}

    @property
    def _fetcher(self) -> OffsetFetcher:
        if self._made is None:
            self._made = OffsetFetcher(self._props, self._timeout_s)
        return self._made

    def close(self) -> None:
        if self._made is not None:
            self._made.close()

    def check(self, entry: DlqEntry) -> str | None:
        """Why `entry`'s payload is gone (also set on it as `payload_gone`); None when it is not
        headers-only, names no source offset, or its source offset is still there."""
        topic, partition, offset = entry.source_topic, entry.source_partition, entry.source_offset
        if not entry.headers_only or topic is None or offset is None:
            return None
        key = (topic, partition or 0)
        start = self._starts.get(key)
        if start is None:
            if len(self._starts) >= MAX_PARTITIONS:
                self._starts.clear()
            try:
                start = self._starts[key] = self._fetcher.log_start(*key)
            except KafkaClientError:
                return None  # not known now: said nothing, asked again for the next record
        if isinstance(start, str):
            reason: str | None = f"payload gone: {start}"
        elif offset < start:
            reason = payload_gone(topic, key[1], offset, start)
        else:
            reason = None
        object.__setattr__(entry, "payload_gone", reason)
        return reason

    def fetch(self, entry: DlqEntry) -> Fetched | None:
        """The source record of a headers-only `entry` (None when it is not one or names no
        source offset): found, gone (`payload_gone` set), or not readable now."""
        topic, offset = entry.source_topic, entry.source_offset
        if not entry.headers_only or topic is None or offset is None:
            return None
        if self.check(entry) is not None:
            return Fetched(None, entry.payload_gone, True)
        return self._fetcher.fetch(topic, entry.source_partition or 0, offset)

    def record(self, entry: DlqEntry) -> ReadRecord | None:
        """The source record of a headers-only `entry` when it can be read now."""
        fetched = self.fetch(entry)
        return None if fetched is None else fetched.record


__all__ = ["Originals"]
