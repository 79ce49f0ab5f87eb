"""The scale bench's verdict on a run: the app's journal of deliveries against what Kafka holds.

Pure: lines of the bench app's journal (``bench.benchapp``, journal mode: ``topic partition offset
count answer wall_ns``), the source topics' end offsets and the source coordinates of the DLQ records
in; figures out. A record is *done* when the app accepted it or its DLQ record exists; the app's fate
for each offset is known (``reject_bucket``), so a DLQ record of any other offset is innocent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

Coord = tuple[str, int, int]  # topic, partition, offset

# The bench app's journal mode (bench.benchapp.rollout_fate): its buckets of offsets.
REJECT_PERCENT = 2
RELEASE_PERCENT = 2


def bucket(partition: int, offset: int) -> int:
    return (offset * 7919 + partition * 104729) % 100


def reject_bucket(partition: int, offset: int) -> bool:
    return bucket(partition, offset) < REJECT_PERCENT


def release_bucket(partition: int, offset: int) -> bool:
    b = bucket(partition, offset)
    return REJECT_PERCENT <= b < REJECT_PERCENT + RELEASE_PERCENT


@dataclass(frozen=True, slots=True)
class Seen:
    count: int  # the delivery count the app was given (0: the contract carries none)
    answer: str
    wall_ns: int


@dataclass(slots=True)
class Journal:
    """Deliveries by record and by partition, in the order the app answered them."""

    by_coord: dict[Coord, list[Seen]] = field(default_factory=lambda: defaultdict(list))
    by_partition: dict[tuple[str, int], list[int]] = field(
        default_factory=lambda: defaultdict(list)
    )

    @classmethod
    def parse(cls, lines: Iterable[str], topic: str | None = None) -> Journal:
        """``topic`` names the records of a contract that carries no topic (journaled as ``-``)."""
        journal = cls()
        for line in lines:
            parts = line.split()
            if len(parts) != 6:
                continue  # a line cut by a flush in progress
            t, p, o, c, answer, ns = parts
            name = topic if t == "-" and topic else t
            seen = Seen(int(c), answer, int(ns))
            journal.by_coord[(name, int(p), int(o))].append(seen)
            journal.by_partition[(name, int(p))].append(int(ns))
        return journal

    def first_delivery_ns(self) -> dict[tuple[str, int], int]:
        return {tp: min(times) for tp, times in self.by_partition.items() if times}


@dataclass(frozen=True, slots=True)
class Verdict:
    produced: int
    deliveries: int
    lost: int
    innocent_dead_lettered: int
    counts_backwards: int
    # Deliveries beyond what each record's answers asked for (1, or 2 for a record released once).
    duplicate_deliveries: int
    records_duplicated: int
    duplicated_times: dict[int, int]  # extra deliveries -> records
    dlq_records: int
    dlq_duplicates: int
    longest_silence_s: float  # the longest time any partition delivered nothing, in the window
    silent_partition: str
    lost_sample: tuple[Coord, ...] = ()
    innocent_sample: tuple[Coord, ...] = ()
    # Each delivery beyond a record's answers: (partition, offset, its wall ns, the count it had,
    # the answer the record had before it). Where the duplicates came from (``by_stop``).
    extra: tuple[tuple[int, int, int, int, str], ...] = ()

    def as_dict(self) -> dict[str, object]:
        out = {k: getattr(self, k) for k in self.__slots__ if k != "extra"}
        out["lost_sample"] = [list(c) for c in self.lost_sample]
        out["innocent_sample"] = [list(c) for c in self.innocent_sample]
        out["duplicated_times"] = {str(k): v for k, v in sorted(self.duplicated_times.items())}
        return out


def judge(
    journal: Journal,
    ends: Mapping[tuple[str, int], int],
    dlq_sources: Iterable[Coord],
    window_ns: tuple[int, int],
    *,
    reject_is_done: bool = False,
) -> Verdict:
    """The verdict: ``ends`` every source partition's end offset (every offset below was produced,
    from 0), ``dlq_sources`` each DLQ record's source, ``window_ns`` the wall-clock span in which a
    partition's silence counts (the rollout; records were produced throughout it).
    ``reject_is_done``: a record the app rejected is done without a DLQ record (Dapr's DROP, which
    its subscription logs and drops)."""
    dlq_count: dict[Coord, int] = defaultdict(int)
    for coord in dlq_sources:
        dlq_count[coord] += 1
    produced = 0
    lost: list[Coord] = []
    backwards = 0
    extra_total = 0
    extra_hist: dict[int, int] = defaultdict(int)
    extras: list[tuple[int, int, int, int, str]] = []
    for (topic, partition), end in ends.items():
        for offset in range(end):
            produced += 1
            coord = (topic, partition, offset)
            seen = journal.by_coord.get(coord, [])
            final = ("accept", "reject") if reject_is_done else ("accept",)
            if coord not in dlq_count and not any(s.answer in final for s in seen):
                lost.append(coord)
            top = 0
            for s in seen:
                if s.count and s.count < top:
                    backwards += 1
                    break
                top = max(top, s.count)
            wanted = 2 if release_bucket(partition, offset) else 1
            extra = len(seen) - wanted
            if extra > 0:
                extra_total += extra
                extra_hist[extra] += 1
                ordered = sorted(seen, key=lambda s: s.wall_ns)
                for i in range(len(ordered) - extra, len(ordered)):
                    before = ordered[i - 1].answer if i else "-"
                    extras.append((partition, offset, ordered[i].wall_ns, ordered[i].count, before))
    innocent = sorted(c for c in dlq_count if not reject_bucket(c[1], c[2]))
    start, stop = window_ns
    silence, where = 0, "-"
    for (topic, partition), times in journal.by_partition.items():
        inside = sorted(t for t in times if start <= t <= stop)
        marks = [start, *inside, stop]
        gap = max(b - a for a, b in pairwise(marks))
        if gap > silence:
            silence, where = gap, f"{topic}[{partition}]"
    return Verdict(
        produced=produced,
        deliveries=sum(len(v) for v in journal.by_coord.values()),
        lost=len(lost),
        innocent_dead_lettered=len(innocent),
        counts_backwards=backwards,
        duplicate_deliveries=extra_total,
        records_duplicated=sum(extra_hist.values()),
        duplicated_times=dict(extra_hist),
        dlq_records=sum(dlq_count.values()),
        dlq_duplicates=sum(n - 1 for n in dlq_count.values() if n > 1),
        longest_silence_s=silence / 1e9,
        silent_partition=where,
        lost_sample=tuple(lost[:10]),
        innocent_sample=tuple(innocent[:10]),
        extra=tuple(extras),
    )


@dataclass(frozen=True, slots=True)
class StopState:
    """What a member held when it was stopped: its partitions' last confirmed commit (``None``: none
    in this process), when it started and when it was gone (wall ns)."""

    committed: Mapping[int, int | None]  # partition -> last committed offset
    started_ns: int
    gone_ns: int
    # Answers the app gives this long after the member was gone are still its own: requests it
    # had sent (at the app, or queued in the app's socket) before it died. The next owner of its
    # partitions delivers nothing before the group reassigns them (a classic member's session,
    # seconds later), except under static membership, where what the restarted member delivers
    # in that time widens this figure, never the other way.
    answered_grace_ns: int = 1_000_000_000


def not_durable(journal: Journal, topic: str, stop: StopState) -> set[Coord]:
    """The records a stopped member had taken past what its commits held: answered (by the app's
    journal, before the member was gone or within ``answered_grace_ns`` of it) at or beyond its
    partition's last committed offset, or, on a partition with no commit of its own, answered
    since it started. Killed at that moment, it leaves exactly these to be delivered again
    (at-least-once)."""
    out: set[Coord] = set()
    end = stop.gone_ns + stop.answered_grace_ns
    for (t, partition, offset), seen in journal.by_coord.items():
        if t != topic or partition not in stop.committed:
            continue
        committed = stop.committed[partition]
        if committed is not None and offset < committed:
            continue
        start = stop.started_ns if committed is None else 0
        if any(start <= s.wall_ns <= end for s in seen):
            out.add((t, partition, offset))
    return out


def unexplained(
    extra: Iterable[tuple[int, int, int, int, str]],
    topic: str,
    held: list[tuple[int, set[Coord]]],
) -> list[tuple[int, int]]:
    """The deliveries beyond their answers that no earlier stop explains: ``held`` is each stop's
    wall ns and its `not_durable` records; a delivery again of one of those after that stop is the
    stop's (at-least-once), any other is a duplicate of the sidecar's own making."""
    out: list[tuple[int, int]] = []
    for partition, offset, ns, _count, _answer in extra:
        coord = (topic, partition, offset)
        if not any(at <= ns and coord in records for at, records in held):
            out.append((partition, offset))
    return out


def by_stop(
    extra: Iterable[tuple[int, int, int, int, str]], stops_ns: list[int]
) -> list[dict[str, Any]]:
    """The deliveries beyond their answers, by the last stop before each (-1: before the first):
    how many, on which partitions, and the answer each record had before it."""
    deliveries: dict[int, int] = defaultdict(int)
    partitions: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    before: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for partition, _offset, ns, _count, answer in extra:
        i = sum(1 for t in stops_ns if t <= ns) - 1
        deliveries[i] += 1
        partitions[i][partition] += 1
        before[i][answer] += 1
    return [
        {
            "stop": i,
            "deliveries": deliveries[i],
            "partitions": dict(sorted(partitions[i].items())),
            "before": dict(before[i]),
        }
        for i in sorted(deliveries)
    ]
