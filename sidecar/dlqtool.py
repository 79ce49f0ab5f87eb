"""Operating the DLQ (SPEC §10): `dlq-sidecar dlq inspect` and `dlq-sidecar dlq replay`.

This module owns reading DLQ topics back (headers decoded, filters, payload previews), replaying DLQ records to
their source topic or another topic, and the replay bookkeeping:

- progress: the replay name is a consumer group on the DLQ topic, `dlq-replay.<name>`; the DLQ offsets are
  committed only after the replayed records were confirmed (acks=all, idempotent producer), and a commit never
  passes a record that was not handled, so a second run with the same name replays nothing twice;
- the filter set is part of the name: its fingerprint is stored in the commit metadata, and a run with the same
  name but other filters is refused (records a filter skipped were committed past, so another filter under the
  same name would silently miss them);
- loop protection: replayed records carry `__dlq.replay.*` markers; the DLQ writer keeps them
  (`sidecar.dlq.REPLAY_HEADER_PREFIX`), and a record whose replay count reached `--max-replays` is skipped;
- headers-only DLQ records are replayed from the source topic while its retention still holds the offset.

Errors: `DlqToolError` is the root; `UsageError` (bad arguments, exit 2) and `ToolKafkaError` (the broker failed
us, exit 1) are its subclasses. confluent-kafka errors are translated at this boundary.

It is a blocking command-line tool (no trio): every broker call has a timeout, and reading stops at the high
watermark seen at start, so it never waits forever. Must not import the engine, the ledger, the source or the
HTTP modules; it shares only the header names of `sidecar.dlq`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sidecar.dlq import (
    DLQ_HEADER_PREFIX,
    H_COPY_DROPPED,
    H_DELIVERY_COUNT,
    H_EXC_CLASS,
    H_EXC_MESSAGE,
    H_GROUP,
    H_MESSAGE,
    H_OFFSET,
    H_PARTITION,
    H_TOPIC,
    REPLAY_HEADER_PREFIX,
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

H_REPLAY_NAME = REPLAY_HEADER_PREFIX + "name"
H_REPLAY_FROM = REPLAY_HEADER_PREFIX + "from"
H_REPLAY_COUNT = REPLAY_HEADER_PREFIX + "count"
REPLAY_GROUP_PREFIX = "dlq-replay."
# Commit metadata: "<version>;<fingerprint>;<filters as JSON>". The JSON is only for error messages.
_METADATA_VERSION = "dlqreplay1"
_METADATA_MAX_CHARS = 3000  # well under the broker's offset.metadata.max.bytes default of 4096

Header = tuple[str, bytes | None]


class DlqToolError(Exception):
    """Root of the errors `dlq inspect` and `dlq replay` report."""


class UsageError(DlqToolError):
    """The arguments cannot work (bad filter, unknown topic, a name used with other filters): exit 2."""


class ToolKafkaError(DlqToolError):
    """The broker could not be reached or refused a read, a write or a commit: exit 1."""


# ------------------------------------------------------------------------------------- arguments

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
    since: TimeBound | None = None
    until: TimeBound | None = None
    offset_range: tuple[int, int] | None = None

    def mismatch(self, entry: DlqEntry, now_ms: int) -> str | None:
        """None when `entry` matches, else the name of the first filter it fails."""
        if self.source_topics and entry.source_topic not in self.source_topics:
            return "source-topic"
        if self.source_partitions and entry.source_partition not in self.source_partitions:
            return "source-partition"
        if self.exception_classes and entry.exception_class not in self.exception_classes:
            return "exception-class"
        if self.offset_range is not None and (
            entry.source_offset is None
            or not self.offset_range[0] <= entry.source_offset <= self.offset_range[1]
        ):
            return "offset-range"
        if self.since is not None and entry.timestamp_ms < self.since.resolve_ms(now_ms):
            return "since"
        if self.until is not None and entry.timestamp_ms > self.until.resolve_ms(now_ms):
            return "until"
        return None

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
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
        return out


# ------------------------------------------------------------------------------------- DLQ records


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", errors="replace")


def _int(value: bytes | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def encode_bytes(value: bytes | None) -> dict[str, Any] | None:
    """Bytes for JSON output: UTF-8 text when it is valid UTF-8, else base64; None stays null."""
    if value is None:
        return None
    try:
        return {"text": value.decode("utf-8"), "size": len(value)}
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(value).decode(), "size": len(value)}


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """One record read from a DLQ topic, with its `__dlq.*` context decoded."""

    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]

    def header(self, name: str) -> bytes | None:
        """The last value of a header (the DLQ writer's context headers come last)."""
        found: bytes | None = None
        for n, v in self.headers:
            if n == name:
                found = v
        return found

    @property
    def source_topic(self) -> str | None:
        return _text(self.header(H_TOPIC))

    @property
    def source_partition(self) -> int | None:
        return _int(self.header(H_PARTITION))

    @property
    def source_offset(self) -> int | None:
        return _int(self.header(H_OFFSET))

    @property
    def delivery_count(self) -> int | None:
        return _int(self.header(H_DELIVERY_COUNT))

    @property
    def exception_class(self) -> str | None:
        return _text(self.header(H_EXC_CLASS))

    @property
    def exception_message(self) -> str | None:
        return _text(self.header(H_EXC_MESSAGE))

    @property
    def cause(self) -> str | None:
        return _text(self.header(H_MESSAGE))

    @property
    def replay_count(self) -> int:
        return _int(self.header(H_REPLAY_COUNT)) or 0

    @property
    def is_dlq_record(self) -> bool:
        return self.source_topic is not None and self.source_partition is not None

    @property
    def headers_only(self) -> bool:
        """True when the DLQ record does not hold the original record (copy off, or dropped as too large).

        A copied record always has a key or a value unless the original was a keyless tombstone; that
        one reads back the same from the source topic, so treating it as headers-only loses nothing.
        """
        return self.header(H_COPY_DROPPED) is not None or (self.key is None and self.value is None)

    def original_headers(self) -> list[Header]:
        """The copied original headers: everything but our own `__dlq.*` namespace, order and repeats kept."""
        return [(n, v) for n, v in self.headers if not n.startswith(DLQ_HEADER_PREFIX)]

    def coordinates(self) -> str:
        return f"{self.dlq_topic}/{self.dlq_partition}/{self.dlq_offset}"

    def to_json(self) -> dict[str, Any]:
        return {
            "dlq_topic": self.dlq_topic,
            "dlq_partition": self.dlq_partition,
            "dlq_offset": self.dlq_offset,
            "timestamp_ms": self.timestamp_ms,
            "timestamp": _iso(self.timestamp_ms),
            "source_topic": self.source_topic,
            "source_partition": self.source_partition,
            "source_offset": self.source_offset,
            "group": _text(self.header(H_GROUP)),
            "delivery_count": self.delivery_count,
            "exception_class": self.exception_class,
            "exception_message": self.exception_message,
            "cause": self.cause,
            "headers_only": self.headers_only,
            "replay_count": self.replay_count,
            "replay_name": _text(self.header(H_REPLAY_NAME)),
            "key": encode_bytes(self.key),
            "value": encode_bytes(self.value),
            "headers": [{"name": n, "value": encode_bytes(v)} for n, v in self.headers],
        }


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def entry_from_message(msg: Any) -> DlqEntry:
    return DlqEntry(
        dlq_topic=msg.topic(),
        dlq_partition=msg.partition(),
        dlq_offset=msg.offset(),
        timestamp_ms=msg.timestamp()[1],
        key=msg.key(),
        value=msg.value(),
        headers=tuple(msg.headers() or ()),
    )


# ------------------------------------------------------------------------------------- reading


def client_properties(bootstrap: str, extra: Mapping[str, str]) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, **extra}


def _kafka_error(what: str, exc: KafkaException) -> ToolKafkaError:
    err = exc.args[0] if exc.args else None
    text = err.str() if isinstance(err, KafkaError) else str(exc)
    return ToolKafkaError(f"{what}: {text}")


def _reader(props: Mapping[str, Any], group: str | None = None) -> Consumer:
    """A consumer that reads by assign() and never commits on its own."""
    return Consumer(
        {
            **props,
            # A group id is required by librdkafka even for assign(); a throwaway one leaves no trace
            # because nothing is ever committed under it.
            "group.id": group or f"dlq-inspect-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # Whatever the configuration says: aborted transactional DLQ writes (and the abort-only
            # probes of the marker check) are not DLQ records.
            "isolation.level": "read_committed",
        }
    )


def dlq_partitions(consumer: Consumer, topic: str, timeout_s: float = 15) -> list[int]:
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
    except KafkaException as exc:
        raise _kafka_error(f"cannot read the metadata of {topic}", exc) from exc
    tmd = md.topics.get(topic)
    if tmd is None or tmd.error is not None or not tmd.partitions:
        raise UsageError(f"topic {topic} does not exist (or is not readable)")
    return sorted(tmd.partitions)


def watermarks(
    consumer: Consumer, topic: str, partitions: Sequence[int], timeout_s: float = 15
) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for p in partitions:
        try:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
        except KafkaException as exc:
            raise _kafka_error(f"cannot read the offsets of {topic}[{p}]", exc) from exc
        out[p] = (lo, hi)
    return out


def read_range(
    consumer: Consumer,
    topic: str,
    ranges: Mapping[int, tuple[int, int]],
    *,
    stop: Callable[[], bool] = lambda: False,
    skip_partition: Callable[[int], bool] = lambda _p: False,
    batch: int = 500,
    stall_timeout_s: float = 30.0,
) -> Iterator[list[Any]]:
    """Yield batches of messages of `topic` from each partition's start offset up to (excluding) its end.

    The ends are the high watermarks seen at start: records appended meanwhile belong to a later run. A
    partition is finished at its end offset or at a partition-EOF event (a transaction marker can sit on
    the last offset, so offset `end - 1` may never arrive). Raises ToolKafkaError when nothing arrives for
    `stall_timeout_s` while records are still expected.
    """
    pending = {p: r for p, r in ranges.items() if r[0] < r[1]}
    if not pending:
        return
    try:
        consumer.assign([TopicPartition(topic, p, start) for p, (start, _end) in pending.items()])
    except KafkaException as exc:
        raise _kafka_error(f"cannot read {topic}", exc) from exc
    last_progress = time.monotonic()
    while pending and not stop():
        for p in [p for p in pending if skip_partition(p)]:
            del pending[p]
        if not pending:
            break
        try:
            msgs: list[Any] = consumer.consume(batch, 0.5)
        except KafkaException as exc:
            raise _kafka_error(f"cannot read {topic}", exc) from exc
        out = []
        for msg in msgs:
            p = msg.partition()
            err = msg.error()
            if p not in pending:
                continue  # finished, skipped, or prefetched beyond the end
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    del pending[p]
                    last_progress = time.monotonic()
                    continue
                raise ToolKafkaError(f"cannot read {topic}[{p}]: {err.str()}")
            if msg.offset() >= pending[p][1]:
                del pending[p]
                continue
            out.append(msg)
            if msg.offset() >= pending[p][1] - 1:
                del pending[p]
        if out:
            last_progress = time.monotonic()
            yield out
        elif time.monotonic() - last_progress > stall_timeout_s:
            waiting = ", ".join(f"[{p}] up to {end}" for p, (_s, end) in sorted(pending.items()))
            raise ToolKafkaError(
                f"no records from {topic} for {stall_timeout_s:.0f}s while expecting {waiting}"
            )


# ------------------------------------------------------------------------------------- inspect


@dataclass(slots=True)
class InspectResult:
    entries: list[DlqEntry] = field(default_factory=list)  # the first `limit` matching records
    scanned: int = 0
    matched: int = 0
    by_exception_class: Counter[str] = field(default_factory=Counter)
    by_source_topic: Counter[str] = field(default_factory=Counter)


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
    consumer = _reader(props)
    result = InspectResult()
    now_ms = int(time.time() * 1000)
    try:
        parts = dlq_partitions(consumer, topic)
        marks = watermarks(consumer, topic, parts)
        for msgs in read_range(consumer, topic, marks):
            for msg in msgs:
                entry = entry_from_message(msg)
                result.scanned += 1
                if filters.mismatch(entry, now_ms) is not None:
                    continue
                result.matched += 1
                result.by_exception_class[entry.exception_class or "(none)"] += 1
                result.by_source_topic[entry.source_topic or "(not a DLQ record)"] += 1
                if limit is None or len(result.entries) < limit:
                    result.entries.append(entry)
                    if on_entry is not None:
                        on_entry(entry)
    finally:
        consumer.close()
    return result


def payload_preview(entry: DlqEntry, width: int = 40) -> str:
    if entry.headers_only:
        return "(headers only)"
    if entry.value is None:
        return "(null value)"
    try:
        text = entry.value.decode("utf-8")
        shown = text if len(text) <= width else text[: width - 1] + "…"
        shown = shown.replace("\n", "\\n")
    except UnicodeDecodeError:
        shown = (
            "0x" + entry.value[: width // 2].hex() + ("…" if len(entry.value) > width // 2 else "")
        )
    return f"{shown} ({len(entry.value)} B)"


def render_inspect(console: Console, result: InspectResult, topic: str) -> None:
    table = Table(title=f"DLQ {topic}", show_lines=False)
    table.add_column("DLQ p/offset", no_wrap=True)
    table.add_column("source topic", overflow="fold")
    table.add_column("src p@offset", no_wrap=True)
    table.add_column("count", justify="right", no_wrap=True)
    table.add_column("exception class", overflow="fold")
    table.add_column("message", overflow="fold")
    table.add_column("DLQ time (UTC)", no_wrap=True)
    table.add_column("replays", justify="right", no_wrap=True)
    table.add_column("payload", overflow="fold", min_width=12)
    for e in result.entries:
        table.add_row(
            f"{e.dlq_partition}/{e.dlq_offset}",
            e.source_topic or "(not a DLQ record)",
            f"{e.source_partition}@{e.source_offset}" if e.is_dlq_record else "",
            str(e.delivery_count if e.delivery_count is not None else ""),
            e.exception_class or "",
            e.exception_message or e.cause or "",
            datetime.fromtimestamp(e.timestamp_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[
                :-3
            ],
            str(e.replay_count or ""),
            payload_preview(e),
        )
    console.print(table)
    render_inspect_summary(console, result)


def render_inspect_summary(console: Console, result: InspectResult) -> None:
    shown = len(result.entries)
    console.print(
        f"{result.matched} matching of {result.scanned} records read"
        + (f"; first {shown} shown" if shown < result.matched else ""),
        markup=False,
        highlight=False,
    )
    for title, counts in (
        ("by exception class", result.by_exception_class),
        ("by source topic", result.by_source_topic),
    ):
        table = Table(title=title)
        table.add_column("name", overflow="fold")
        table.add_column("records", justify="right")
        for name, n in counts.most_common():
            table.add_row(name, str(n))
        console.print(table)


# ------------------------------------------------------------------------------------- replay


@dataclass(slots=True)
class TokenBucket:
    """Pace at `rate_per_s` with a burst of `capacity` tokens. Pure: callers pass the clock."""

    rate_per_s: float
    capacity: float = 1.0
    tokens: float = 1.0
    updated_s: float | None = None

    def take(self, now_s: float) -> float:
        """Take one token; return how long to wait before using it (0 when one was available)."""
        if self.updated_s is not None:
            self.tokens = min(
                self.capacity, self.tokens + (now_s - self.updated_s) * self.rate_per_s
            )
        self.updated_s = now_s
        self.tokens -= 1.0
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate_per_s


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    bootstrap: str
    dlq_topic: str
    name: str
    filters: Filters = Filters()
    target_topic: str | None = None  # None: each record's source topic
    dry_run: bool = False
    rate_per_s: float | None = None
    max_replays: int = 1
    skip_unrecoverable: bool = False
    limit: int | None = None
    kafka: Mapping[str, str] = field(default_factory=dict)
    fetch_timeout_s: float = 15.0

    @property
    def group(self) -> str:
        return REPLAY_GROUP_PREFIX + self.name

    def fingerprint_fields(self) -> dict[str, Any]:
        return {
            "filters": self.filters.describe(),
            "to": self.target_topic or "(source topic)",
            "max_replays": self.max_replays,
        }

    def fingerprint(self) -> str:
        canonical = json.dumps(self.fingerprint_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def commit_metadata(self) -> str:
        fields = json.dumps(self.fingerprint_fields(), sort_keys=True, separators=(",", ":"))
        return f"{_METADATA_VERSION};{self.fingerprint()};{fields}"[:_METADATA_MAX_CHARS]


@dataclass(frozen=True, slots=True)
class Problem:
    """A record a replay could not (or would not) send, and why."""

    coordinates: str  # dlqtopic/partition/offset
    source: str
    reason: str


@dataclass(slots=True)
class ReplaySummary:
    dry_run: bool = False
    scanned: int = 0
    matched: int = 0
    replayed: Counter[str] = field(
        default_factory=Counter
    )  # per target topic (would-be in a dry run)
    skipped: Counter[str] = field(default_factory=Counter)  # per reason
    max_replays_skipped: list[Problem] = field(default_factory=list)
    unrecoverable: list[Problem] = field(default_factory=list)  # stopped a partition
    unrecoverable_skipped: list[Problem] = field(default_factory=list)  # --skip-unrecoverable
    failures: list[Problem] = field(default_factory=list)
    committed: dict[int, int] = field(default_factory=dict)  # DLQ partition -> next offset
    planned: list[str] = field(default_factory=list)  # dry run: one line per record it would send
    elapsed_s: float = 0.0

    @property
    def replayed_total(self) -> int:
        return sum(self.replayed.values())

    @property
    def ok(self) -> bool:
        return not self.failures and not self.unrecoverable


@dataclass(slots=True)
class _Planned:
    entry: DlqEntry
    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[Header]
    error: str | None = None
    delivered: bool = False


class _SourceFetcher:
    """Reads one original record from its source topic (for headers-only DLQ records): assign, seek, fetch."""

    def __init__(self, props: Mapping[str, Any], timeout_s: float) -> None:
        self._consumer = Consumer(
            {
                **props,
                "group.id": f"dlq-replay-fetch-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # A deleted offset must show as an error, never silently jump to another record.
                "auto.offset.reset": "error",
            }
        )
        self._timeout_s = timeout_s
        self._partitions: dict[
            str, int | str
        ] = {}  # topic -> partition count, or why it is unusable

    def close(self) -> None:
        self._consumer.close()

    def _partition_count(self, topic: str) -> int | str:
        if topic not in self._partitions:
            try:
                tmd = self._consumer.list_topics(topic, timeout=10).topics.get(topic)
            except KafkaException as exc:
                raise _kafka_error(f"cannot read the metadata of {topic}", exc) from exc
            if tmd is None or tmd.error is not None or not tmd.partitions:
                self._partitions[topic] = f"source topic {topic} does not exist (deleted?)"
            else:
                self._partitions[topic] = len(tmd.partitions)
        return self._partitions[topic]

    def fetch(self, topic: str, partition: int, offset: int) -> tuple[Any | None, str | None, bool]:
        """(message, None, _) when found; (None, reason, True) when gone for good; (None, reason, False)
        when it could not be read now (a failure, not a skip)."""
        count = self._partition_count(topic)
        if isinstance(count, str):
            return None, count, True
        if partition >= count:
            return None, f"partition {partition} of {topic} does not exist", True
        tp = TopicPartition(topic, partition)
        try:
            lo, hi = self._consumer.get_watermark_offsets(tp, timeout=10)
        except KafkaException as exc:
            return None, f"cannot read the offsets of {topic}[{partition}]: {exc}", False
        if offset < lo:
            return (
                None,
                f"source offset {topic}[{partition}]@{offset} is below the low watermark {lo} "
                "(deleted by retention or delete-records)",
                True,
            )
        if offset >= hi:
            return (
                None,
                f"source offset {topic}[{partition}]@{offset} is beyond the high watermark {hi}",
                True,
            )
        try:
            self._consumer.assign([TopicPartition(topic, partition, offset)])
            deadline = time.monotonic() + self._timeout_s
            while time.monotonic() < deadline:
                msg: Any = self._consumer.poll(0.5)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        return (
                            None,
                            f"no record at {topic}[{partition}]@{offset} (compacted?)",
                            True,
                        )
                    if err.code() in (
                        KafkaError._AUTO_OFFSET_RESET,
                        KafkaError.OFFSET_OUT_OF_RANGE,
                    ):
                        return (
                            None,
                            f"source offset {topic}[{partition}]@{offset} was deleted: {err.str()}",
                            True,
                        )
                    return None, f"cannot read {topic}[{partition}]@{offset}: {err.str()}", False
                if msg.offset() == offset:
                    return msg, None, False
                if msg.offset() > offset:
                    return None, f"no record at {topic}[{partition}]@{offset} (compacted?)", True
            return (
                None,
                f"timed out after {self._timeout_s:.0f}s reading {topic}[{partition}]@{offset}",
                False,
            )
        except KafkaException as exc:
            return None, f"cannot read {topic}[{partition}]@{offset}: {exc}", False
        finally:
            with contextlib.suppress(KafkaException):
                self._consumer.unassign()


ProgressHook = Callable[[ReplaySummary, int], None]


class Replayer:
    """Runs one `dlq replay`: read, decide, send at the given rate, confirm, commit."""

    def __init__(self, options: ReplayOptions, on_progress: ProgressHook | None = None) -> None:
        self.options = options
        self.summary = ReplaySummary(dry_run=options.dry_run)
        self._props = client_properties(options.bootstrap, options.kafka)
        self.on_progress = on_progress
        self._blocked: set[int] = set()
        self._target_partitions: dict[str, int | None] = {}
        self._bucket = TokenBucket(options.rate_per_s) if options.rate_per_s else None
        self._fetcher: _SourceFetcher | None = None
        self._producer: Producer | None = None
        self.total = 0  # DLQ records this run will scan at most (for progress bars)
        self.planned = 0  # records handed to the producer (or planned, in a dry run)

    # -- setup --------------------------------------------------------------------------------------

    def prepare(self) -> tuple[Consumer, dict[int, tuple[int, int]]]:
        """Check the arguments against the cluster and find the offset range each DLQ partition replays."""
        o = self.options
        if o.target_topic is not None and o.target_topic == o.dlq_topic:
            raise UsageError("--to must not be the DLQ topic itself: that would replay in a loop")
        consumer = _reader(self._props, group=o.group)
        try:
            parts = dlq_partitions(consumer, o.dlq_topic)
            marks = watermarks(consumer, o.dlq_topic, parts)
            try:
                committed = consumer.committed(
                    [TopicPartition(o.dlq_topic, p) for p in parts], timeout=15
                )
            except KafkaException as exc:
                raise _kafka_error(f"cannot read the offsets of group {o.group}", exc) from exc
            ranges: dict[int, tuple[int, int]] = {}
            for tp in committed:
                lo, hi = marks[tp.partition]
                if tp.offset >= 0:
                    self._check_metadata(tp.partition, tp.offset, tp.metadata)
                    start = max(tp.offset, lo)
                else:
                    start = lo
                ranges[tp.partition] = (start, hi)
            if o.target_topic is not None and self._partition_count(o.target_topic) is None:
                raise UsageError(f"target topic {o.target_topic} does not exist")
        except BaseException:
            consumer.close()
            raise
        self.total = sum(max(0, end - start) for start, end in ranges.values())
        return consumer, ranges

    def _check_metadata(self, partition: int, offset: int, metadata: str | None) -> None:
        o = self.options
        parts = (metadata or "").split(";", 2)
        if len(parts) < 2 or parts[0] != _METADATA_VERSION:
            raise UsageError(
                f"group {o.group} has a committed offset on {o.dlq_topic}[{partition}] that dlq replay did "
                "not write; choose another --name"
            )
        if parts[1] != o.fingerprint():
            used = parts[2] if len(parts) > 2 else "(unknown)"
            now = json.dumps(o.fingerprint_fields(), sort_keys=True, separators=(",", ":"))
            raise UsageError(
                f"replay name {o.name!r} was used with other filters: {used}; this run has {now}. "
                "A replay name stands for one filter set (records the first filter skipped are already "
                "committed past under it); use a new --name for a different filter set"
            )

    def _partition_count(self, topic: str) -> int | None:
        if topic not in self._target_partitions:
            probe = self._fetcher_or_new()
            count = probe._partition_count(topic)
            self._target_partitions[topic] = count if isinstance(count, int) else None
        return self._target_partitions[topic]

    def _fetcher_or_new(self) -> _SourceFetcher:
        if self._fetcher is None:
            self._fetcher = _SourceFetcher(self._props, self.options.fetch_timeout_s)
        return self._fetcher

    # -- run ----------------------------------------------------------------------------------------

    def run(self) -> ReplaySummary:
        started = time.monotonic()
        consumer, ranges = self.prepare()
        try:
            if not self.options.dry_run:
                self._producer = Producer(
                    {
                        **self._props,
                        "enable.idempotence": True,
                        "acks": "all",
                        "linger.ms": 5,
                        "message.timeout.ms": 30000,
                    }
                )
            batch = 500
            if self._bucket is not None:
                # Commit about once a second at low rates, so an interrupted run repeats little.
                batch = max(1, min(500, int(self._bucket.rate_per_s)))
            for msgs in read_range(
                consumer,
                self.options.dlq_topic,
                ranges,
                stop=self._limit_reached,
                skip_partition=lambda p: p in self._blocked,
                batch=batch,
            ):
                self._replay_batch(consumer, msgs)
        finally:
            if self._producer is not None:
                self._producer.flush(30)
            if self._fetcher is not None:
                self._fetcher.close()
            consumer.close()
            self.summary.elapsed_s = time.monotonic() - started
        return self.summary

    def _limit_reached(self) -> bool:
        limit = self.options.limit
        return limit is not None and self.planned >= limit

    def _replay_batch(self, consumer: Consumer, msgs: list[Any]) -> None:
        o, s = self.options, self.summary
        now_ms = int(time.time() * 1000)
        # Per DLQ partition, in offset order: (offset, plan or None when the record is skipped).
        decided: dict[int, list[tuple[int, _Planned | None]]] = {}
        for msg in msgs:
            p = msg.partition()
            if p in self._blocked or self._limit_reached():
                continue
            entry = entry_from_message(msg)
            s.scanned += 1
            plan = self._decide(entry, now_ms)
            if isinstance(plan, str):  # "blocked"
                self._blocked.add(p)
            else:
                decided.setdefault(p, []).append((entry.dlq_offset, plan))
                if plan is not None:
                    self._send(plan)
            if self.on_progress is not None:
                self.on_progress(s, 1)
        if self._producer is not None:
            # A record still unconfirmed after this is treated as failed below: nothing is committed past it.
            self._producer.flush(60)
        commits: list[TopicPartition] = []
        for p, items in decided.items():
            next_offset: int | None = None
            for offset, plan in items:
                if plan is not None:
                    if plan.error is not None or (not o.dry_run and not plan.delivered):
                        s.failures.append(
                            Problem(
                                plan.entry.coordinates(),
                                _source_of(plan.entry),
                                plan.error or "not confirmed by the broker within 60s",
                            )
                        )
                        self._blocked.add(p)
                        break
                    s.replayed[plan.topic] += 1
                next_offset = offset + 1
            if next_offset is not None and not o.dry_run:
                commits.append(
                    TopicPartition(
                        o.dlq_topic, p, next_offset, metadata=self.options.commit_metadata()
                    )
                )
                s.committed[p] = next_offset
        if commits:
            try:
                consumer.commit(offsets=commits, asynchronous=False)
            except KafkaException as exc:
                raise _kafka_error(f"cannot commit the offsets of group {o.group}", exc) from exc

    def _decide(self, entry: DlqEntry, now_ms: int) -> _Planned | str | None:
        """A plan to send, None to skip (and commit past), or "blocked" (stop this DLQ partition here)."""
        o, s = self.options, self.summary
        if not entry.is_dlq_record:
            s.skipped["not a DLQ record (no __dlq.errors.topic/partition headers)"] += 1
            return None
        mismatch = o.filters.mismatch(entry, now_ms)
        if mismatch == "until":
            # DLQ time grows along a partition: everything after this record is a later run's job,
            # so stop here instead of committing past records a later run with the same name must see.
            self._blocked.add(entry.dlq_partition)
            s.skipped["newer than --until (left for a later run)"] += 1
            return "blocked"
        if mismatch is not None:
            s.skipped[f"filtered out by --{mismatch}"] += 1
            return None
        s.matched += 1
        source_topic, source_partition = entry.source_topic, entry.source_partition
        assert source_topic is not None and source_partition is not None
        previous = entry.replay_count
        if previous >= o.max_replays:
            s.max_replays_skipped.append(
                Problem(
                    entry.coordinates(), _source_of(entry), f"replayed {previous} times already"
                )
            )
            s.skipped[f"replayed {previous} times already (--max-replays {o.max_replays})"] += 1
            return None
        key, value, headers = entry.key, entry.value, entry.original_headers()
        if entry.headers_only:
            offset = entry.source_offset
            msg: Any
            reason: str | None
            if offset is None:
                msg, reason, gone = None, "no __dlq.errors.offset header", True
            else:
                msg, reason, gone = self._fetcher_or_new().fetch(
                    source_topic, source_partition, offset
                )
            if msg is None:
                assert reason is not None
                problem = Problem(entry.coordinates(), _source_of(entry), reason)
                if not gone:
                    s.failures.append(problem)
                    return "blocked"
                if o.skip_unrecoverable:
                    s.unrecoverable_skipped.append(problem)
                    s.skipped["unrecoverable (--skip-unrecoverable)"] += 1
                    return None
                s.unrecoverable.append(problem)
                return "blocked"
            key, value = msg.key(), msg.value()
            original = list(msg.headers() or ())
            previous = max(previous, _int(_last(original, H_REPLAY_COUNT)) or 0)
            if previous >= o.max_replays:
                s.skipped[f"replayed {previous} times already (--max-replays {o.max_replays})"] += 1
                s.max_replays_skipped.append(
                    Problem(
                        entry.coordinates(), _source_of(entry), f"replayed {previous} times already"
                    )
                )
                return None
            headers = [(n, v) for n, v in original if not n.startswith(DLQ_HEADER_PREFIX)]
        target = o.target_topic or source_topic
        count = self._partition_count(target)
        plan = _Planned(
            entry=entry,
            topic=target,
            # Back to the same partition of the source topic keeps the key's partition (and its order);
            # another topic uses the producer's partitioner on the key.
            partition=source_partition
            if target == source_topic and count is not None and source_partition < count
            else None,
            key=key,
            value=value,
            headers=[
                *headers,
                (H_REPLAY_NAME, o.name.encode()),
                (H_REPLAY_FROM, entry.coordinates().encode()),
                (H_REPLAY_COUNT, str(previous + 1).encode()),
            ],
        )
        if count is None:
            plan.error = f"target topic {target} does not exist"
        return plan

    def _send(self, plan: _Planned) -> None:
        o = self.options
        where = f"{plan.topic}[{plan.partition}]" if plan.partition is not None else plan.topic
        if plan.error is not None:
            return
        self.planned += 1
        if o.dry_run:
            self.summary.planned.append(
                f"would replay {plan.entry.coordinates()} ({_source_of(plan.entry)}, "
                f"{plan.entry.exception_class or 'no exception class'}) to {where}"
                + (" (read from the source topic)" if plan.entry.headers_only else "")
            )
            return
        assert self._producer is not None
        if self._bucket is not None:
            wait_s = self._bucket.take(time.monotonic())
            end = time.monotonic() + wait_s
            while (left := end - time.monotonic()) > 0:
                self._producer.poll(min(left, 0.05))

        def on_delivery(err: KafkaError | None, _msg: Any) -> None:
            if err is None:
                plan.delivered = True
            else:
                plan.error = f"writing to {where} failed: {err.name()}: {err.str()}"

        kwargs: dict[str, Any] = {
            "key": plan.key,
            "value": plan.value,
            "headers": plan.headers,
            "on_delivery": on_delivery,
        }
        if plan.partition is not None:
            kwargs["partition"] = plan.partition
        while True:
            try:
                self._producer.produce(plan.topic, **kwargs)
                break
            except BufferError:
                self._producer.poll(0.05)
            except KafkaException as exc:
                plan.error = f"writing to {where} failed: {exc}"
                break
        self._producer.poll(0)


def _last(headers: Sequence[Header], name: str) -> bytes | None:
    found: bytes | None = None
    for n, v in headers:
        if n == name:
            found = v
    return found


def _source_of(entry: DlqEntry) -> str:
    return f"{entry.source_topic}[{entry.source_partition}]@{entry.source_offset}"


def replay_dlq(options: ReplayOptions, on_progress: ProgressHook | None = None) -> ReplaySummary:
    """Replay the DLQ records `options` selects; see the module docstring for the guarantees."""
    return Replayer(options, on_progress).run()


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


# ------------------------------------------------------------------------------------- CLI


def _kafka_property(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0: {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {text!r}")
    return value


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap",
        default=None,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP)",
    )
    p.add_argument(
        "-X",
        "--kafka-property",
        type=_kafka_property,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka property for every client (security.protocol, sasl.*, ssl.*); repeatable",
    )
    f = p.add_argument_group("filters (all must match; repeat an option to allow several values)")
    f.add_argument(
        "--source-topic", action="append", default=[], help="the record's __dlq.errors.topic"
    )
    f.add_argument(
        "--source-partition",
        action="append",
        type=_non_negative_int,
        default=[],
        help="the record's __dlq.errors.partition",
    )
    f.add_argument(
        "--exception-class",
        action="append",
        default=[],
        help="the record's __dlq.errors.exception.class.name (exact)",
    )
    f.add_argument(
        "--offset-range",
        default=None,
        metavar="A-B",
        help="source offsets (__dlq.errors.offset), inclusive: A-B, A- or -B",
    )
    f.add_argument(
        "--since",
        default=None,
        help="DLQ record time at or after: ISO 8601 (naive = UTC) or 1h/30m/2d",
    )
    f.add_argument("--until", default=None, help="DLQ record time at or before (same forms)")


def add_dlq_parser(subparsers: Any) -> None:
    """Add `dlq inspect` and `dlq replay` to the `dlq-sidecar` sub-commands (argparse's subparsers)."""
    dlq = subparsers.add_parser(
        "dlq",
        help="inspect and replay dead-letter records",
        description="Inspect DLQ records (headers decoded) and replay them to their source or another topic.",
    )
    sub = dlq.add_subparsers(dest="dlq_command", metavar="ACTION")
    sub.required = True

    inspect = sub.add_parser(
        "inspect",
        help="show DLQ records as a table or JSON lines, with counts",
        description=(
            "Read a DLQ topic from the beginning to its current end (nothing is committed) and show "
            "the records that match the filters, with counts by exception class and source topic."
        ),
    )
    inspect.add_argument("--topic", required=True, help="the DLQ topic")
    _add_common(inspect)
    inspect.add_argument(
        "--limit", type=_non_negative_int, default=None, help="show at most N records"
    )
    inspect.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per record on stdout (bytes as text or base64); counts on stderr",
    )

    replay = sub.add_parser(
        "replay",
        help="send DLQ records back to their source topic (or --to)",
        description=(
            "Replay DLQ records: original key, value and headers (without __dlq.* headers) plus "
            "__dlq.replay.name/from/count markers. The --name is a consumer group on the DLQ topic "
            "(dlq-replay.NAME) that remembers progress, so a rerun replays nothing twice; one name "
            "stands for one filter set. Headers-only records are read back from the source topic."
        ),
    )
    replay.add_argument("--from", dest="from_topic", required=True, help="the DLQ topic")
    replay.add_argument(
        "--to", default=None, help="target topic (default: each record's source topic)"
    )
    replay.add_argument(
        "--name", required=True, help="replay name: remembers progress and the filters"
    )
    _add_common(replay)
    replay.add_argument(
        "--dry-run", action="store_true", help="write and commit nothing; print what would be done"
    )
    replay.add_argument(
        "--rate",
        type=_positive_float,
        default=None,
        metavar="N",
        help="at most N records per second",
    )
    replay.add_argument(
        "--max-replays",
        type=_non_negative_int,
        default=1,
        metavar="N",
        help="skip records already replayed N times (default 1: a record that fails after a replay stays)",
    )
    replay.add_argument(
        "--skip-unrecoverable",
        action="store_true",
        help="commit past headers-only records whose source offset is gone (they are still reported)",
    )
    replay.add_argument(
        "--limit", type=_non_negative_int, default=None, help="replay at most N records this run"
    )


_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")


def filters_from_args(args: argparse.Namespace) -> Filters:
    return Filters(
        source_topics=tuple(args.source_topic),
        source_partitions=tuple(args.source_partition),
        exception_classes=tuple(args.exception_class),
        since=parse_time(args.since) if args.since else None,
        until=parse_time(args.until) if args.until else None,
        offset_range=parse_offset_range(args.offset_range) if args.offset_range else None,
    )


def _bootstrap(args: argparse.Namespace) -> str:
    bootstrap: str | None = args.bootstrap or os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise UsageError("no broker: pass --bootstrap HOST:PORT or set KAFKA_BOOTSTRAP")
    return bootstrap


def cmd_dlq(
    args: argparse.Namespace, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run `dlq inspect` or `dlq replay`: 0 ok, 1 failures (broker, replay), 2 bad arguments."""
    out = stdout or sys.stdout
    err_stream = stderr or sys.stderr
    console = Console(file=out, width=_width(out))
    errors = Console(file=err_stream, width=_width(err_stream))
    try:
        if args.dlq_command == "inspect":
            return _cmd_inspect(args, console, errors)
        if args.dlq_command == "replay":
            return _cmd_replay(args, console)
        raise UsageError(f"unknown dlq action {args.dlq_command!r}")
    except UsageError as exc:
        errors.print(f"dlq-sidecar dlq: {exc}", markup=False, highlight=False, soft_wrap=True)
        return EXIT_USAGE
    except DlqToolError as exc:
        errors.print(f"dlq-sidecar dlq: {exc}", markup=False, highlight=False, soft_wrap=True)
        return EXIT_FAILURE
    except KafkaException as exc:
        errors.print(f"dlq-sidecar dlq: Kafka error: {exc}", markup=False, highlight=False)
        return EXIT_FAILURE


def _width(stream: TextIO) -> int | None:
    """Rich's width: the terminal's, else $COLUMNS, else wide enough that piped tables stay one line a row."""
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return None
    try:
        return int(os.environ.get("COLUMNS", "200"))
    except ValueError:
        return 200


def _cmd_inspect(args: argparse.Namespace, console: Console, errors: Console) -> int:
    filters = filters_from_args(args)
    bootstrap = _bootstrap(args)

    def emit(entry: DlqEntry) -> None:
        console.file.write(json.dumps(entry.to_json(), ensure_ascii=False) + "\n")

    result = inspect_dlq(
        bootstrap,
        args.topic,
        filters,
        limit=args.limit,
        kafka=dict(args.kafka_property),
        on_entry=emit if args.json else None,
    )
    if args.json:
        console.file.flush()
        render_inspect_summary(errors, result)
    else:
        render_inspect(console, result, args.topic)
    return EXIT_OK


def _cmd_replay(args: argparse.Namespace, console: Console) -> int:
    if not _NAME.match(args.name):
        raise UsageError(f"bad --name {args.name!r}: use letters, digits, '.', '_' and '-'")
    options = ReplayOptions(
        bootstrap=_bootstrap(args),
        dlq_topic=args.from_topic,
        name=args.name,
        filters=filters_from_args(args),
        target_topic=args.to,
        dry_run=args.dry_run,
        rate_per_s=args.rate,
        max_replays=args.max_replays,
        skip_unrecoverable=args.skip_unrecoverable,
        limit=args.limit,
        kafka=dict(args.kafka_property),
    )
    replayer = Replayer(options)
    if console.is_terminal:
        progress = Progress(
            TextColumn("[bold]replay[/bold] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        with progress:
            task = progress.add_task(options.dlq_topic, total=None)

            def on_tty_progress(s: ReplaySummary, n: int) -> None:
                progress.update(
                    task,
                    advance=n,
                    total=replayer.total or None,
                    description=f"{options.dlq_topic}: {replayer.planned} "
                    + ("planned" if s.dry_run else "sent"),
                )

            replayer.on_progress = on_tty_progress
            summary = replayer.run()
    else:
        last = [time.monotonic()]

        def on_plain_progress(s: ReplaySummary, _n: int) -> None:
            now = time.monotonic()
            if now - last[0] >= 1.0:
                last[0] = now
                console.print(
                    f"replay {options.dlq_topic}: {s.scanned}/{replayer.total} read, "
                    f"{replayer.planned} {'planned' if s.dry_run else 'sent'}",
                    markup=False,
                    highlight=False,
                )

        replayer.on_progress = on_plain_progress
        summary = replayer.run()
    render_replay_summary(console, summary, options)
    return EXIT_OK if summary.ok else EXIT_FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m sidecar.dlqtool ...`: the same commands without the rest of the CLI."""
    parser = argparse.ArgumentParser(prog="dlq-sidecar")
    add_dlq_parser(parser.add_subparsers(dest="command", required=True))
    return cmd_dlq(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
