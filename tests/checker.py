"""The reliability checker: did a run keep "no record lost, bounded redelivery, DLQ written once"?

Owns the run journal format and the verdict. A journal is a file of JSON lines written by the test harness
(tests/faults): one `run` line (group, topics, DLQ topic, delivery limit, modes), one `produced` line per record
the producer got a delivery report for (coordinates, kind, digests of key and value), one `delivery` line per
request the test app saw (coordinates, delivery count, the answer it gave) and one `fault` line per injected
fault. The checker compares it with what Kafka holds afterwards — the DLQ topic and the group's committed
offsets — and reports:

- lost: produced, never accepted by the app and not in the DLQ;
- duplicate DLQ records (the same source coordinates dead-lettered twice; allowed only at-least-once);
- commits ahead: a committed offset past a record that is not done;
- deliveries beyond the bound (`limit + crashes`: docs/guarantees.md allows one lost attempt per crash);
- DLQ mismatches: wrong headers, payload not the original (copy mode) or present when it must not be;
- unexpected DLQ records: dead-lettered although the app never refused the record;
- counts charged by a crash (`crash_charged`, informational): a delivery whose count is above one plus
  the earlier answers that count an attempt (anything but accept, or an answer the sidecar's death
  swallowed: `unanswered`, `killed`). docs/guarantees.md promises none except for the record that kills the sidecar;
  a scenario whose app answers are all seen by the sidecar asserts the list holds that record alone;
- the distribution of deliveries per record.

`check()` is pure: journal plus observed Kafka state in, `Report` out. `observe()` reads the Kafka side with
confluent-kafka. It is a test oracle and lives with the tests, outside the shipped package. Must not import
the engine, the ledger or any other sidecar module: it judges them from the outside.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Coord = tuple[str, int, int]  # source topic, partition, offset

# What a fault line's kind must be for it to widen the delivery bound: a crash of the sidecar loses at
# most one attempt's worth of state (docs/guarantees.md); other faults (broker, network, app) must not.
CRASH_FAULTS = frozenset({"sidecar_kill"})

CAUSE_REJECTED = "Offset rejected by client."
CAUSE_DELIVERY_COUNT = "Offset delivery count exceeded the threshold."

H_TOPIC = "__dlq.errors.topic"
H_PARTITION = "__dlq.errors.partition"
H_OFFSET = "__dlq.errors.offset"
H_GROUP = "__dlq.errors.group"
H_DELIVERY_COUNT = "__dlq.errors.delivery.count"
H_MESSAGE = "__dlq.errors.message"
H_COPY_DROPPED = "__dlq.errors.copy.dropped"

ACCEPT = "accept"
# Journal answers that do not count an attempt: accepted, or never answered because the sidecar died
# (a deferred delivery left open, or the delivery that killed it).
UNCHARGED_ANSWERS = frozenset({ACCEPT, "unanswered", "killed"})


def digest(data: bytes | None) -> str | None:
    """The journal's fingerprint of a key or value: None stays None (null is not empty)."""
    return None if data is None else hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------------------------------ journal


@dataclass(frozen=True, slots=True)
class RunInfo:
    group: str
    topics: tuple[str, ...]
    dlq_topic: str | None  # None: no DLQ configured
    limit: int
    copy_record: bool = False
    transactional: bool = False


@dataclass(frozen=True, slots=True)
class Produced:
    id: str
    topic: str
    partition: int
    offset: int
    kind: str  # what the app will answer: "ok", "poison" (reject), "release" (always release), ...
    key_sha: str | None
    value_sha: str | None

    @property
    def coord(self) -> Coord:
        return (self.topic, self.partition, self.offset)


@dataclass(frozen=True, slots=True)
class Delivery:
    id: str
    topic: str
    partition: int
    offset: int
    count: int
    answer: str  # accept / reject / release / garbage / hang / ...
    value_sha: str | None = "-"  # what the app received, when it journals it ("-" = not recorded)

    @property
    def coord(self) -> Coord:
        return (self.topic, self.partition, self.offset)


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    at_s: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Journal:
    run: RunInfo
    produced: tuple[Produced, ...]
    deliveries: tuple[Delivery, ...]
    faults: tuple[Fault, ...]


class JournalError(ValueError):
    """The journal is malformed (no run line, a line that is not JSON, a missing field)."""


def parse_journal(lines: Iterable[str]) -> Journal:
    run: RunInfo | None = None
    produced: list[Produced] = []
    deliveries: list[Delivery] = []
    faults: list[Fault] = []
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            ev = json.loads(line)
            kind = ev["ev"]
            if kind == "run":
                run = RunInfo(
                    group=str(ev["group"]),
                    topics=tuple(ev["topics"]),
                    dlq_topic=ev.get("dlq_topic"),
                    limit=int(ev["limit"]),
                    copy_record=bool(ev.get("copy_record", False)),
                    transactional=bool(ev.get("transactional", False)),
                )
            elif kind == "produced":
                produced.append(
                    Produced(
                        str(ev["id"]),
                        str(ev["topic"]),
                        int(ev["partition"]),
                        int(ev["offset"]),
                        str(ev["kind"]),
                        ev.get("key_sha"),
                        ev.get("value_sha"),
                    )
                )
            elif kind == "delivery":
                deliveries.append(
                    Delivery(
                        str(ev["id"]),
                        str(ev["topic"]),
                        int(ev["partition"]),
                        int(ev["offset"]),
                        int(ev["count"]),
                        str(ev["answer"]),
                        ev.get("value_sha", "-"),
                    )
                )
            elif kind == "fault":
                faults.append(
                    Fault(str(ev["kind"]), float(ev.get("t", 0.0)), str(ev.get("detail", "")))
                )
            # Unknown event kinds are notes for humans (e.g. "phase"): ignored.
        except (ValueError, KeyError, TypeError) as exc:
            # A line cut short by a kill -9 of the writer can only be the last one.
            raise JournalError(f"journal line {n}: {exc}: {line[:200]!r}") from exc
    if run is None:
        raise JournalError("journal has no run line")
    return Journal(run, tuple(produced), tuple(deliveries), tuple(faults))


def read_journal(path: str | Path) -> Journal:
    with open(path, encoding="utf-8") as f:
        return parse_journal(f)


# ------------------------------------------------------------------------------------------ observed


@dataclass(frozen=True, slots=True)
class DlqEntry:
    """One record read back from the DLQ topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]

    def header(self, name: str) -> str | None:
        values = [v for n, v in self.headers if n == name]
        if len(values) != 1 or values[0] is None:
            return None
        return values[0].decode("utf-8", errors="replace")

    def header_count(self, name: str) -> int:
        return sum(1 for n, _ in self.headers if n == name)


@dataclass(frozen=True, slots=True)
class Observed:
    dlq: tuple[DlqEntry, ...]
    # Committed offset per source partition; None when the group has none.
    committed: Mapping[tuple[str, int], int | None]


# ------------------------------------------------------------------------------------------ verdict


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    coord: Coord | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "coord": list(self.coord) if self.coord else None,
            "detail": self.detail,
        }


VIOLATION_KINDS = (
    "lost",
    "commit_ahead",
    "dlq_duplicate",
    "over_bound",
    "dlq_mismatch",
    "unexpected_dlq",
    "unknown_delivery",
    "app_payload_mismatch",
)


@dataclass(slots=True)
class Report:
    produced: int = 0
    accepted: int = 0
    dead_lettered: int = 0  # distinct source records in the DLQ
    dlq_records: int = 0  # records in the DLQ topic (duplicates included)
    deliveries: int = 0
    crashes: int = 0
    bound: int = 0
    max_delivery_count: int = 0
    dlq_duplicates: int = 0
    dlq_copies_dropped: int = 0  # DLQ records written headers-only because the copy was too large
    duplicates_allowed: bool = True
    redelivered_after_accept: int = (
        0  # at-least-once: seen again after an accept (a crash ate the commit)
    )
    count_repeats: int = 0  # a delivery count seen twice for one record (lost write-ahead state)
    # Records whose delivery count went up with no answer counting an attempt (a crash charged them).
    crash_charged: list[Coord] = field(default_factory=list)
    distribution: dict[int, int] = field(default_factory=dict)  # deliveries per record -> records
    faults: dict[str, int] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def by_kind(self, kind: str) -> list[Finding]:
        return [f for f in self.findings if f.kind == kind]

    @property
    def violations(self) -> list[Finding]:
        return [
            f
            for f in self.findings
            if f.kind in VIOLATION_KINDS
            and (f.kind != "dlq_duplicate" or not self.duplicates_allowed)
        ]

    @property
    def ok(self) -> bool:
        return not self.violations

    def counts(self) -> dict[str, int]:
        return {k: len(self.by_kind(k)) for k in VIOLATION_KINDS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "produced": self.produced,
            "accepted": self.accepted,
            "dead_lettered": self.dead_lettered,
            "dlq_records": self.dlq_records,
            "deliveries": self.deliveries,
            "crashes": self.crashes,
            "bound": self.bound,
            "max_delivery_count": self.max_delivery_count,
            "dlq_duplicates": self.dlq_duplicates,
            "dlq_copies_dropped": self.dlq_copies_dropped,
            "duplicates_allowed": self.duplicates_allowed,
            "redelivered_after_accept": self.redelivered_after_accept,
            "count_repeats": self.count_repeats,
            "crash_charged": [list(c) for c in self.crash_charged[:200]],
            "distribution": {str(k): v for k, v in sorted(self.distribution.items())},
            "faults": dict(sorted(self.faults.items())),
            "violations": self.counts(),
            "findings": [f.to_dict() for f in self.findings[:200]],
        }

    def table(self) -> str:
        rows = [
            ("produced", self.produced),
            ("accepted", self.accepted),
            ("dead-lettered (distinct)", self.dead_lettered),
            ("DLQ records", self.dlq_records),
            ("app deliveries", self.deliveries),
            ("crashes (sidecar kills)", self.crashes),
            ("delivery bound (limit + crashes)", self.bound),
            ("max delivery count seen", self.max_delivery_count),
            (
                "DLQ duplicates" + (" (allowed: at-least-once)" if self.duplicates_allowed else ""),
                self.dlq_duplicates,
            ),
            ("DLQ copies dropped (too large)", self.dlq_copies_dropped),
            ("redelivered after accept", self.redelivered_after_accept),
            ("delivery count repeats", self.count_repeats),
            ("counts charged by a crash", len(self.crash_charged)),
        ]
        rows += [(f"VIOLATION {k}", n) for k, n in self.counts().items()]
        width = max(len(r[0]) for r in rows)
        out = [f"{name:<{width}}  {value}" for name, value in rows]
        dist = ", ".join(f"{k}x: {v}" for k, v in sorted(self.distribution.items()))
        out.append(f"{'deliveries per record':<{width}}  {dist}")
        if self.faults:
            fl = ", ".join(f"{k}: {v}" for k, v in sorted(self.faults.items()))
            out.append(f"{'faults':<{width}}  {fl}")
        out.append(f"{'verdict':<{width}}  {'OK' if self.ok else 'VIOLATIONS'}")
        for f in self.violations[:20]:
            where = f"{f.coord[0]}[{f.coord[1]}]@{f.coord[2]}" if f.coord else "-"
            out.append(f"  {f.kind}: {where}: {f.detail}")
        return "\n".join(out)


def check(journal: Journal, observed: Observed, *, extra_allowance: int = 0) -> Report:
    """Judge one run. `extra_allowance` widens the delivery bound for faults the journal cannot count."""
    run = journal.run
    report = Report()
    report.faults = dict(Counter(f.kind for f in journal.faults))
    report.crashes = sum(1 for f in journal.faults if f.kind in CRASH_FAULTS)
    report.bound = run.limit + report.crashes + extra_allowance
    report.duplicates_allowed = not run.transactional

    produced: dict[Coord, Produced] = {}
    for p in journal.produced:
        produced[p.coord] = p
    report.produced = len(produced)

    by_coord: dict[Coord, list[Delivery]] = defaultdict(list)
    for d in journal.deliveries:
        by_coord[d.coord].append(d)
        src = produced.get(d.coord)
        if src is None:
            report.findings.append(
                Finding(
                    "unknown_delivery", d.coord, f"the app saw a record never produced (id {d.id})"
                )
            )
        elif d.value_sha not in ("-", src.value_sha):
            report.findings.append(
                Finding(
                    "app_payload_mismatch",
                    d.coord,
                    f"delivery {d.count} of id {d.id}: the app got other bytes than were produced",
                )
            )
    report.deliveries = len(journal.deliveries)

    accepted = {c for c, ds in by_coord.items() if any(d.answer == ACCEPT for d in ds)}
    report.accepted = len(accepted & produced.keys())

    # -- the DLQ side
    dlq_by_coord: dict[Coord, list[DlqEntry]] = defaultdict(list)
    for e in observed.dlq:
        report.dlq_records += 1
        topic, part, off = e.header(H_TOPIC), e.header(H_PARTITION), e.header(H_OFFSET)
        if topic is None or part is None or off is None or not part.isdigit() or not off.isdigit():
            report.findings.append(
                Finding(
                    "dlq_mismatch",
                    None,
                    f"DLQ record p{e.partition}@{e.offset} lacks source coordinates",
                )
            )
            continue
        dlq_by_coord[(topic, int(part), int(off))].append(e)
    report.dead_lettered = len(dlq_by_coord.keys() & produced.keys())

    for coord, entries in sorted(dlq_by_coord.items()):
        if len(entries) > 1:
            report.dlq_duplicates += len(entries) - 1
            report.findings.append(
                Finding(
                    "dlq_duplicate",
                    coord,
                    f"{len(entries)} DLQ records for one source record: "
                    + ", ".join(
                        f"p{e.partition}@{e.offset} (delivery count {e.header(H_DELIVERY_COUNT)})"
                        for e in entries
                    ),
                )
            )
        src = produced.get(coord)
        if src is None:
            report.findings.append(
                Finding("dlq_mismatch", coord, "DLQ record for a record never produced")
            )
            continue
        ds = by_coord.get(coord, [])
        for e in entries:
            if e.header(H_COPY_DROPPED) is not None:
                report.dlq_copies_dropped += 1
            for problem in _dlq_problems(e, src, run, report.bound):
                report.findings.append(Finding("dlq_mismatch", coord, problem))
        causes = {e.header(H_MESSAGE) for e in entries}
        refused = [d for d in ds if d.answer != ACCEPT]
        if not refused:
            report.findings.append(
                Finding("unexpected_dlq", coord, "dead-lettered although the app never refused it")
            )
        elif CAUSE_REJECTED in causes and not any(d.answer == "reject" for d in ds):
            report.findings.append(
                Finding("unexpected_dlq", coord, "DLQ says rejected but the app never rejected it")
            )

    # -- lost, and what is done
    done = accepted | dlq_by_coord.keys()
    for coord, p in sorted(produced.items()):
        if coord not in done:
            seen = len(by_coord.get(coord, []))
            report.findings.append(
                Finding(
                    "lost",
                    coord,
                    f"id {p.id} ({p.kind}): seen {seen}x, never accepted, not in the DLQ",
                )
            )

    # -- committed offsets never pass a record that is not done
    first_not_done: dict[tuple[str, int], int] = {}
    for coord in produced:
        if coord not in done:
            tp = (coord[0], coord[1])
            first_not_done[tp] = min(first_not_done.get(tp, coord[2]), coord[2])
    for tp, committed in sorted(observed.committed.items()):
        if committed is None:
            continue
        hole = first_not_done.get(tp)
        if hole is not None and committed > hole:
            report.findings.append(
                Finding(
                    "commit_ahead",
                    (tp[0], tp[1], hole),
                    f"committed offset {committed} passes offset {hole}, which is not done",
                )
            )

    # -- redelivery bound and the distribution
    dist: Counter[int] = Counter()
    for coord in produced:
        ds = by_coord.get(coord, [])
        dist[len(ds)] += 1
        counts = [d.count for d in ds]
        if counts:
            report.max_delivery_count = max(report.max_delivery_count, *counts)
        if len(ds) > report.bound or any(c > report.bound for c in counts):
            report.findings.append(
                Finding(
                    "over_bound",
                    coord,
                    f"{len(ds)} deliveries, counts {counts[:12]}, bound {report.bound}",
                )
            )
        if len(counts) != len(set(counts)):
            report.count_repeats += 1
        charged = 0  # earlier answers that count an attempt
        for d in ds:
            if d.count > charged + 1:
                report.crash_charged.append(coord)
                report.findings.append(
                    Finding(
                        "crash_charged",
                        coord,
                        f"delivery count {d.count} after {charged} answers that count an attempt",
                    )
                )
                break
            if d.answer not in UNCHARGED_ANSWERS:
                charged += 1
        first_accept = next((i for i, d in enumerate(ds) if d.answer == ACCEPT), None)
        if first_accept is not None and first_accept < len(ds) - 1:
            report.redelivered_after_accept += 1
    report.distribution = dict(dist)
    return report


def _dlq_problems(e: DlqEntry, src: Produced, run: RunInfo, bound: int) -> list[str]:
    out: list[str] = []
    for name in (H_TOPIC, H_PARTITION, H_OFFSET, H_GROUP, H_DELIVERY_COUNT, H_MESSAGE):
        if e.header_count(name) != 1:
            out.append(f"header {name} appears {e.header_count(name)} times")
    if e.header(H_GROUP) != run.group:
        out.append(f"group header {e.header(H_GROUP)!r}, expected {run.group!r}")
    cause = e.header(H_MESSAGE)
    if cause not in (CAUSE_REJECTED, CAUSE_DELIVERY_COUNT):
        out.append(f"cause {cause!r} is not a Kafka 4.4 cause text")
    count_text = e.header(H_DELIVERY_COUNT) or ""
    if not count_text.isdigit():
        out.append(f"delivery count header {count_text!r} is not a decimal number")
    else:
        count = int(count_text)
        if not 1 <= count <= bound:
            out.append(f"delivery count {count} outside 1..{bound}")
        if cause == CAUSE_DELIVERY_COUNT and count < run.limit:
            out.append(f"count-exceeded cause at delivery count {count} < limit {run.limit}")
    dropped = e.header(H_COPY_DROPPED) is not None
    if run.copy_record and not dropped:
        if digest(e.value) != src.value_sha:
            out.append("DLQ value is not the original value")
        if digest(e.key) != src.key_sha:
            out.append("DLQ key is not the original key")
    elif e.key is not None or e.value is not None:
        out.append("headers-only DLQ record carries a key or value")
    return out


# ------------------------------------------------------------------------------------------ Kafka side


def observe(bootstrap: str, run: RunInfo, timeout_s: float = 30.0) -> Observed:
    """Read the DLQ topic (read_committed, every partition to its end) and the group's committed offsets."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": f"dlq-checker-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",  # aborted transactional writes are not DLQ records
        "enable.partition.eof": True,
    }
    consumer = Consumer(conf)
    try:
        entries: list[DlqEntry] = []
        dlq = run.dlq_topic
        md = consumer.list_topics(timeout=timeout_s)
        # Committed offsets first, the DLQ second: a record's DLQ write is confirmed before any commit
        # passes it, so every DLQ record behind an observed commit is in the DLQ read that follows.
        # (The other order races a running sidecar: a DLQ write and a commit landing between the two
        # reads would look like a commit ahead of a record that is not done.)
        committed: dict[tuple[str, int], int | None] = {}
        group_consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": run.group})
        try:
            tps = [
                TopicPartition(t, p)
                for t in run.topics
                if t in md.topics
                for p in sorted(md.topics[t].partitions)
            ]
            for tp in _committed_stable(group_consumer, tps, timeout_s) if tps else []:
                committed[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
        finally:
            group_consumer.close()
        if dlq and dlq in md.topics:
            parts = sorted(md.topics[dlq].partitions)
            ends = {}
            for p in parts:
                lo, hi = consumer.get_watermark_offsets(TopicPartition(dlq, p), timeout=timeout_s)
                ends[p] = (lo, hi)
            todo = {p for p, (lo, hi) in ends.items() if hi > lo}
            if todo:
                consumer.assign([TopicPartition(dlq, p, ends[p][0]) for p in sorted(todo)])
                deadline = time.monotonic() + timeout_s
                while todo and time.monotonic() < deadline:
                    for msg in consumer.consume(1000, 0.5):
                        err = msg.error()
                        p = int(msg.partition() or 0)
                        if err is not None:
                            if err.code() == KafkaError._PARTITION_EOF:
                                todo.discard(p)
                                continue
                            raise KafkaException(err)
                        headers = _headers(msg.headers())
                        offset = int(msg.offset() or 0)
                        entries.append(
                            DlqEntry(
                                p, offset, _as_bytes(msg.key()), _as_bytes(msg.value()), headers
                            )
                        )
                        # The high watermark may sit past aborted records and control markers.
                        if offset + 1 >= ends[p][1]:
                            todo.discard(p)
                if todo:
                    raise TimeoutError(
                        f"DLQ partitions {sorted(todo)} not read to the end in {timeout_s}s"
                    )
        return Observed(tuple(entries), committed)
    finally:
        consumer.close()


def _committed_stable(
    consumer: Any, tps: list[Any], timeout_s: float, attempts: int = 4
) -> list[Any]:
    """Committed offsets, waiting out a pending transaction.

    While a transactional offset commit is pending (e.g. its producer was just killed), the broker
    answers "unstable offset" until the transaction is aborted (by the producer's next incarnation or
    at transaction.timeout.ms) and librdkafka reports a time-out: ask again.
    """
    from confluent_kafka import KafkaError, KafkaException

    for attempt in range(attempts):
        try:
            return list(consumer.committed(tps, timeout=timeout_s))
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if attempt == attempts - 1 or not (
                isinstance(err, KafkaError) and err.code() == KafkaError._TIMED_OUT
            ):
                raise
    raise AssertionError("unreachable")


def _headers(raw: Any) -> tuple[tuple[str, bytes | None], ...]:
    if not raw:
        return ()
    items = raw.items() if isinstance(raw, dict) else raw
    return tuple((str(n), _as_bytes(v)) for n, v in items)


def _as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data


# ------------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.checker",
        description="Check a reliability run's journal against the DLQ topic and committed offsets.",
    )
    parser.add_argument("journal", help="the run's journal (JSON lines)")
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--extra-allowance", type=int, default=0, help="widen the delivery bound")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--timeout-s", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        journal = read_journal(args.journal)
    except (OSError, JournalError) as exc:
        print(f"checker: {exc}", file=sys.stderr)
        return 2
    observed = observe(args.bootstrap, journal.run, args.timeout_s)
    # Read again after observing Kafka: a run still in progress has journaled every answer that the
    # observed DLQ records and commits depend on only by now.
    journal = read_journal(args.journal)
    report = check(journal, observed, extra_allowance=args.extra_allowance)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.table())
    return 0 if report.ok else 1


__all__ = [
    "CRASH_FAULTS",
    "Delivery",
    "DlqEntry",
    "Fault",
    "Finding",
    "Journal",
    "JournalError",
    "Observed",
    "Produced",
    "Report",
    "RunInfo",
    "check",
    "digest",
    "main",
    "observe",
    "parse_journal",
    "read_journal",
]

if __name__ == "__main__":
    sys.exit(main())
