"""Which DLQ records a command looks at: the filter set and the parsing of its arguments.

Owns `--format` (which system wrote the record), `--reason`, `--message-contains`, `--record` (DLQ
`partition:offset`), `--since`/`--until` (an ISO 8601 instant, naive = UTC, or a duration before now: `90m`, `1h30m`,
`2d`), `--offset-range` (`A-B`, `A-`, `-B`, inclusive source offsets) and `Filters`, whose `describe()`
is the canonical form a replay name's fingerprint is computed from. Pure: callers pass `now_ms`.

Imports: the standard library, `sidecar.ops.dlq.entries` and `sidecar.ops.dlq.errors` only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sidecar.ops.dlq.entries import DlqEntry
from sidecar.ops.dlq.errors import UsageError

_RELATIVE = re.compile(r"^(?:(\d+(?:\.\d+)?)([smhdw]))+$")
_RELATIVE_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True, slots=True)
class TimeBound:
    """A `--since`/`--until` value: an absolute instant, or a duration before now (`90m`, `1h30m`, `2d`)."""

    text: str
    absolute_ms: int | None = None
    ago_s: float | None = None

    def resolve_ms(self, now_ms: int) -> int:
        if self.absolute_ms is not None:
            return self.absolute_ms
        assert self.ago_s is not None
        return now_ms - int(self.ago_s * 1000)

    def canonical(self) -> str:
        # Relative bounds stay relative in the fingerprint: `--since 1h` means the same thing on every run.
        if self.absolute_ms is not None:
            return datetime.fromtimestamp(self.absolute_ms / 1000, UTC).isoformat()
        return f"-{self.ago_s}s"


def parse_time(text: str) -> TimeBound:
    """Parse an ISO 8601 time (naive = UTC) or a relative duration like `1h`, `30m`, `1h30m`, `2d`."""
    value = text.strip()
    if _RELATIVE.match(value):
        seconds = sum(float(n) * _UNIT_S[u] for n, u in _RELATIVE_PART.findall(value))
        return TimeBound(text=value, ago_s=seconds)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(
            f"bad time {text!r}: use ISO 8601 (2024-05-01T12:00:00Z) or a duration before now "
            "(30s, 15m, 1h, 2d, 1h30m)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return TimeBound(text=value, absolute_ms=int(when.timestamp() * 1000))


def parse_record(text: str) -> tuple[int, int]:
    """`P:OFFSET` (or `P/OFFSET`): one DLQ record by its partition and offset."""
    match = re.fullmatch(r"\s*(\d+)\s*[:/]\s*(\d+)\s*", text)
    if not match:
        raise UsageError(f"bad record {text!r}: use PARTITION:OFFSET of the DLQ record")
    return int(match.group(1)), int(match.group(2))


def parse_offset_range(text: str) -> tuple[int, int]:
    """`A-B` (inclusive), `A-` (from A) or `-B` (up to B): source offsets."""
    match = re.fullmatch(r"\s*(\d*)\s*-\s*(\d*)\s*", text)
    if not match or not (match.group(1) or match.group(2)):
        raise UsageError(f"bad offset range {text!r}: use A-B, A- or -B (inclusive source offsets)")
    low = int(match.group(1)) if match.group(1) else 0
    high = int(match.group(2)) if match.group(2) else 2**63 - 1
    if low > high:
        raise UsageError(f"bad offset range {text!r}: {low} is above {high}")
    return low, high


@dataclass(frozen=True, slots=True)
class Filters:
    """Which DLQ records a command looks at. Empty tuples mean "any"."""

    source_topics: tuple[str, ...] = ()
    source_partitions: tuple[int, ...] = ()
    exception_classes: tuple[str, ...] = ()
    formats: tuple[
        str, ...
    ] = ()  # which system wrote the record (`sidecar.ops.dlq.formats.FORMATS`)
    since: TimeBound | None = None
    until: TimeBound | None = None
    offset_range: tuple[int, int] | None = None
    reasons: tuple[str, ...] = ()  # the writer's reason (`DlqContext.reason`), exactly
    message_contains: str | None = None  # in the exception message or cause text, any case
    records: tuple[tuple[int, int], ...] = ()  # DLQ (partition, offset): chosen records only

    def mismatch(self, entry: DlqEntry, now_ms: int) -> str | None:
        """None when `entry` matches, else the name of the first filter it fails."""
        if self.formats and entry.format not in self.formats:
            return "format"
        if self.source_topics and entry.source_topic not in self.source_topics:
            return "source-topic"
        if self.source_partitions and entry.source_partition not in self.source_partitions:
            return "source-partition"
        if self.exception_classes and not (
            entry.exception_class in self.exception_classes
            or entry.context.cause_class in self.exception_classes
        ):
            return "exception-class"
        if self.offset_range is not None and (
            entry.source_offset is None
            or not self.offset_range[0] <= entry.source_offset <= self.offset_range[1]
        ):
            return "offset-range"
        if self.records and (entry.dlq_partition, entry.dlq_offset) not in self.records:
            return "record"
        if self.reasons and entry.reason not in self.reasons:
            return "reason"
        if self.message_contains is not None:
            needle = self.message_contains.casefold()
            texts = (entry.exception_message or "", entry.cause or "")
            if not any(needle in text.casefold() for text in texts):
                return "message-contains"
        if self.since is not None and entry.timestamp_ms < self.since.resolve_ms(now_ms):
            return "since"
        if self.until is not None and entry.timestamp_ms > self.until.resolve_ms(now_ms):
            return "until"
        return None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.formats:
            out["formats"] = sorted(self.formats)
        if self.source_topics:
            out["source_topics"] = sorted(self.source_topics)
        if self.source_partitions:
            out["source_partitions"] = sorted(self.source_partitions)
        if self.exception_classes:
            out["exception_classes"] = sorted(self.exception_classes)
        if self.since is not None:
            out["since"] = self.since.canonical()
        if self.until is not None:
            out["until"] = self.until.canonical()
        if self.offset_range is not None:
            out["offset_range"] = list(self.offset_range)
        if self.reasons:
            out["reasons"] = sorted(self.reasons)
        if self.message_contains is not None:
            out["message_contains"] = self.message_contains
        if self.records:
            out["records"] = [list(r) for r in sorted(self.records)]
        return out


def filters_from_values(
    *,
    formats: Iterable[str] = (),
    source_topics: Iterable[str] = (),
    source_partitions: Iterable[int] = (),
    exception_classes: Iterable[str] = (),
    since: str | None = None,
    until: str | None = None,
    offset_range: str | None = None,
    reasons: Iterable[str] = (),
    message_contains: str | None = None,
    records: Iterable[str] = (),
) -> Filters:
    """The filter set from the commands' option values (the CLI's arguments, the console's query):
    times, ranges and records parsed here, a bad one a `UsageError`; empty texts mean "any"."""
    return Filters(
        formats=tuple(formats),
        source_topics=tuple(t for t in source_topics if t),
        source_partitions=tuple(source_partitions),
        exception_classes=tuple(c for c in exception_classes if c),
        since=parse_time(since) if since else None,
        until=parse_time(until) if until else None,
        offset_range=parse_offset_range(offset_range) if offset_range else None,
        reasons=tuple(r for r in reasons if r),
        message_contains=message_contains or None,
        records=tuple(parse_record(r) for r in records if r),
    )
