"""`dlq replay`: send DLQ records back to their source topic (or another topic), exactly once per name.

Owns `Replayer` (progress under a replay name, the filter set's fingerprint, loop protection,
headers-only records, pacing: its docstring), `TokenBucket` and `replay_dlq`. A blocking tool (no
trio): every broker call has a timeout.

Imports the standard library, `sidecar.kafka.tools` (no confluent-kafka) and the `sidecar.ops.dlq.*`
modules below it; never the rendering, the command layer, the engines or the daemon.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sidecar.kafka.dlq import DLQ_HEADER_PREFIX
from sidecar.kafka.tools import OffsetFetcher, ReadConsumer, ReadRecord, ToolProducer
from sidecar.ops.dlq.entries import (
    H_REPLAY_AT,
    H_REPLAY_BY,
    H_REPLAY_COUNT,
    H_REPLAY_FROM,
    H_REPLAY_NAME,
    DlqEntry,
    Header,
    entry_from_record,
    int_or_none,
)
from sidecar.ops.dlq.errors import UsageError
from sidecar.ops.dlq.filters import Filters
from sidecar.ops.dlq.reader import client_properties, dlq_partitions

REPLAY_GROUP_PREFIX = "dlq-replay."
# What a replay name may be (it becomes the consumer group `dlq-replay.<name>`).
REPLAY_NAME = re.compile(r"^[A-Za-z0-9._-]{1,200}$")
# Commit metadata: "<version>;<fingerprint>;<filters as JSON>". The JSON is only for error messages.
_METADATA_VERSION = "dlqreplay1"
_METADATA_MAX_CHARS = 3000  # well under the broker's offset.metadata.max.bytes default of 4096


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
    filters: Filters = field(default_factory=Filters)
    target_topic: str | None = None  # None: each record's source topic
    dry_run: bool = False
    rate_per_s: float | None = None
    max_replays: int = 1
    skip_unrecoverable: bool = False
    limit: int | None = None
    kafka: Mapping[str, str] = field(default_factory=dict)
    fetch_timeout_s: float = 15.0
    by: str | None = None  # who replays: `__dlq.replay.by` (and `.at`) on every replayed record
    # Records with schemas (`sidecar.ops.dlq.payloads.PayloadReader`): values decoded for the dry
    # run's lines and for `--field` filters. None: no registry named.
    payloads: Any = None

    @property
    def group(self) -> str:
        return REPLAY_GROUP_PREFIX + self.name

    def fingerprint_fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "filters": self.filters.describe(),
            "to": self.target_topic or "(source topic)",
            "max_replays": self.max_replays,
        }
        if self.payloads is not None and self.payloads.fields:
            out["fields"] = [f"{path}={value}" for path, value in self.payloads.fields]
        return out

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


ProgressHook = Callable[[ReplaySummary, int], None]


class Replayer:
    """Runs one `dlq replay`: read, decide, send at the given rate, confirm, commit.

    Works on every format `sidecar.ops.dlq.formats` knows (dlq-sidecar and share groups, Kafka Streams, Kafka
    Connect, Spring Kafka): the source comes from the writer's context headers, which are dropped from the
    replayed record; a record whose format names no source (a Kafka Streams punctuator's) needs `--to`.
    Owns replaying and its bookkeeping:

    - progress: the replay name is a consumer group on the DLQ topic, `dlq-replay.<name>`; the DLQ offsets are
      committed only after the replayed records were confirmed (acks=all, idempotent producer), and a commit never
      passes a record that was not handled, so a second run with the same name replays nothing twice;
    - the filter set is part of the name: its fingerprint is stored in the commit metadata, and a run with the same
      name but other filters is refused (records a filter skipped were committed past, so another filter under the
      same name would silently miss them);
    - loop protection: replayed records carry `__dlq.replay.*` markers; the DLQ writer keeps them
      (`sidecar.kafka.dlq.REPLAY_HEADER_PREFIX`), and a record whose replay count reached `--max-replays` is skipped;
    - headers-only DLQ records are replayed from the source topic (`sidecar.kafka.tools.OffsetFetcher`);
    - pacing: `--rate` through `TokenBucket` (pure, the caller passes the clock).

    A blocking tool (no trio): every broker call has a timeout.
    """

    def __init__(self, options: ReplayOptions, on_progress: ProgressHook | None = None) -> None:
        self.options = options
        self.summary = ReplaySummary(dry_run=options.dry_run)
        self._props = client_properties(options.bootstrap, options.kafka)
        self.on_progress = on_progress
        self._blocked: set[int] = set()
        self._target_partitions: dict[str, int | None] = {}
        self._bucket = TokenBucket(options.rate_per_s) if options.rate_per_s else None
        self._fetcher: OffsetFetcher | None = None
        self._producer: ToolProducer | None = None
        self._stamp: list[Header] = []
        if options.by is not None:
            at = datetime.now(UTC).isoformat(timespec="seconds")
            self._stamp = [(H_REPLAY_BY, options.by.encode()), (H_REPLAY_AT, at.encode())]
        self.total = 0  # DLQ records this run will scan at most (for progress bars)
        self.planned = 0  # records handed to the producer (or planned, in a dry run)

    # -- setup --------------------------------------------------------------------------------------

    def prepare(self) -> tuple[ReadConsumer, dict[int, tuple[int, int]]]:
        """Check the arguments against the cluster and find the offset range each DLQ partition replays."""
        o = self.options
        if o.target_topic is not None and o.target_topic == o.dlq_topic:
            raise UsageError("--to must not be the DLQ topic itself: that would replay in a loop")
        consumer = ReadConsumer(self._props, group=o.group)
        try:
            parts = dlq_partitions(consumer, o.dlq_topic)
            marks = consumer.watermarks(o.dlq_topic, parts)
            committed = consumer.committed(o.dlq_topic, parts)
            ranges: dict[int, tuple[int, int]] = {}
            for partition, (offset, metadata) in committed.items():
                lo, hi = marks[partition]
                if offset >= 0:
                    self._check_metadata(partition, offset, metadata)
                    start = max(offset, lo)
                else:
                    start = lo
                ranges[partition] = (start, hi)
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
            count = probe.partition_count(topic)
            self._target_partitions[topic] = count if isinstance(count, int) else None
        return self._target_partitions[topic]

    def _fetcher_or_new(self) -> OffsetFetcher:
        if self._fetcher is None:
            self._fetcher = OffsetFetcher(self._props, self.options.fetch_timeout_s)
        return self._fetcher

    # -- run ----------------------------------------------------------------------------------------

    def run(self) -> ReplaySummary:
        started = time.monotonic()
        consumer, ranges = self.prepare()
        try:
            if not self.options.dry_run:
                self._producer = ToolProducer(self._props, linger_ms=5, message_timeout_ms=30000)
            batch = 500
            if self._bucket is not None:
                # Commit about once a second at low rates, so an interrupted run repeats little.
                batch = max(1, min(500, int(self._bucket.rate_per_s)))
            for records in consumer.read_range(
                self.options.dlq_topic,
                ranges,
                stop=self._limit_reached,
                skip_partition=lambda p: p in self._blocked,
                batch=batch,
            ):
                self._replay_batch(consumer, records)
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

    def _replay_batch(self, consumer: ReadConsumer, records: list[ReadRecord]) -> None:
        o, s = self.options, self.summary
        now_ms = int(time.time() * 1000)
        # Per DLQ partition, in offset order: (offset, plan or None when the record is skipped).
        decided: dict[int, list[tuple[int, _Planned | None]]] = {}
        for record in records:
            p = record.partition
            if p in self._blocked or self._limit_reached():
                continue
            entry = entry_from_record(record)
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
        commits: dict[int, int] = {}
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
                commits[p] = next_offset
                s.committed[p] = next_offset
        if commits:
            consumer.commit(o.dlq_topic, commits, self.options.commit_metadata())

    def _decide(self, entry: DlqEntry, now_ms: int) -> _Planned | str | None:
        """A plan to send, None to skip (and commit past), or "blocked" (stop this DLQ partition here)."""
        o, s = self.options, self.summary
        if not entry.is_dlq_record:
            s.skipped[
                "not a DLQ record (no __dlq.errors.*, __streams.errors.*, __connect.errors.* or "
                "kafka_dlt-* context headers)"
            ] += 1
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
        source_topic, source_partition = entry.source_topic, entry.source_partition
        # A headers-only record is decoded from its source record: read once, here, and sent below.
        prefetched = None
        if (
            o.payloads is not None
            and entry.headers_only
            and source_topic is not None
            and source_partition is not None
            and entry.source_offset is not None
        ):
            prefetched = self._fetcher_or_new().fetch(
                source_topic, source_partition, entry.source_offset
            )
        if o.payloads is not None and not o.payloads.read(
            entry, None if prefetched is None else prefetched.record
        ):
            s.skipped["filtered out by --field"] += 1
            return None
        s.matched += 1
        if source_topic is None or source_partition is None:
            # A Kafka Streams punctuator's record (no input record), or a writer that left the source out.
            why = None
            if o.target_topic is None:
                why = f"the {entry.context.writer} record names no source topic: replay it with --to TOPIC"
            elif entry.headers_only:
                why = (
                    f"the {entry.context.writer} record holds no key or value and names no source "
                    "topic to read them from"
                )
            if why is not None:
                return self._unrecoverable(Problem(entry.coordinates(), _source_of(entry), why))
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
            fetched: ReadRecord | None
            reason: str | None
            if offset is None:
                fetched, reason, gone = (
                    None,
                    f"no source offset in the {entry.format} headers",
                    True,
                )
            else:
                assert source_topic is not None and source_partition is not None
                fetched, reason, gone = prefetched or self._fetcher_or_new().fetch(
                    source_topic, source_partition, offset
                )
            if fetched is None:
                assert reason is not None
                problem = Problem(entry.coordinates(), _source_of(entry), reason)
                if not gone:
                    s.failures.append(problem)
                    return "blocked"
                return self._unrecoverable(problem)
            key, value = fetched.key, fetched.value
            original = list(fetched.headers)
            previous = max(previous, int_or_none(_last(original, H_REPLAY_COUNT)) or 0)
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
        assert target is not None
        count = self._partition_count(target)
        plan = _Planned(
            entry=entry,
            topic=target,
            # Back to the same partition of the source topic keeps the key's partition (and its order);
            # another topic uses the producer's partitioner on the key.
            partition=source_partition
            if target == source_topic
            and source_partition is not None
            and count is not None
            and source_partition < count
            else None,
            key=key,
            value=value,
            headers=[
                *headers,
                (H_REPLAY_NAME, o.name.encode()),
                (H_REPLAY_FROM, entry.coordinates().encode()),
                (H_REPLAY_COUNT, str(previous + 1).encode()),
                *self._stamp,
            ],
        )
        if count is None:
            plan.error = f"target topic {target} does not exist"
        return plan

    def _unrecoverable(self, problem: Problem) -> _Planned | str | None:
        """Stop the partition at a record that cannot be replayed, or pass it with --skip-unrecoverable."""
        s = self.summary
        if self.options.skip_unrecoverable:
            s.unrecoverable_skipped.append(problem)
            s.skipped["unrecoverable (--skip-unrecoverable)"] += 1
            return None
        s.unrecoverable.append(problem)
        return "blocked"

    def _send(self, plan: _Planned) -> None:
        o = self.options
        where = f"{plan.topic}[{plan.partition}]" if plan.partition is not None else plan.topic
        if plan.error is not None:
            return
        self.planned += 1
        if o.dry_run:
            self.summary.planned.append(
                f"would replay {plan.entry.coordinates()} ({plan.entry.format}, "
                f"{_source_of(plan.entry)}, "
                f"{plan.entry.exception_class or 'no exception class'}) to {where}"
                + (" (read from the source topic)" if plan.entry.headers_only else "")
                + _decoded_of(plan.entry)
            )
            return
        assert self._producer is not None
        if self._bucket is not None:
            self._producer.wait_s(self._bucket.take(time.monotonic()))

        def on_done(failure: str | None) -> None:
            if failure is None:
                plan.delivered = True
            else:
                plan.error = f"writing to {where} failed: {failure}"

        refused = self._producer.send(
            plan.topic,
            key=plan.key,
            value=plan.value,
            headers=plan.headers,
            partition=plan.partition,
            on_done=on_done,
        )
        if refused is not None:
            plan.error = f"writing to {where} failed: {refused}"


def _last(headers: Sequence[Header], name: str) -> bytes | None:
    found: bytes | None = None
    for n, v in headers:
        if n == name:
            found = v
    return found


def _decoded_of(entry: DlqEntry) -> str:
    """The dry run's view of a value read through the registry: decoded, or why not."""
    payload = entry.payload
    if payload is None:
        return ""
    if payload.schema is not None:
        return f"; value {payload.preview()}"
    return f"; value not decoded: {payload.reason}"


def _source_of(entry: DlqEntry) -> str:
    if entry.source_topic is None:
        return "no source named"
    return f"{entry.source_topic}[{entry.source_partition}]@{entry.source_offset}"


def replay_dlq(options: ReplayOptions, on_progress: ProgressHook | None = None) -> ReplaySummary:
    """Replay the DLQ records `options` selects."""
    return Replayer(options, on_progress).run()
