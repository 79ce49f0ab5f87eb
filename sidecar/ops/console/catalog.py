"""Which topics are DLQs: by the prefix rule (`dlq.` by default, the sidecar's
`errors.deadletterqueue.topic.name.prefix`) and by format detection (the newest record of a partition
carries a known writer's context headers).

Owns `find_dlq_topics` (the bounded probe: its docstring) and `Catalog`.

Imports: the standard library, `sidecar.kafka.tools` and the `sidecar.ops.dlq.*` modules.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from sidecar.core.tiers import RETRY_HEADER_PREFIX
from sidecar.kafka.tools import ReadConsumer, TopicAdmin
from sidecar.ops.dlq.entries import entry_from_record

MAX_TOPICS_PROBED = 1000
MAX_PARTITIONS_PROBED = 8
SAMPLE_PER_PARTITION = 3
# Kafka's own topics and the sidecar's replay groups never hold dead letters.
_INTERNAL_PREFIXES = ("__", "_confluent", "_schemas")
# The default retry tier topic's tail (`.retry.{tier}`, a duration label: 1m, 10m, 1h, 1500ms).
_TIER_NAME = re.compile(r"\.retry\.[0-9]+(?:ms|s|m|h|d)$")


@dataclass(frozen=True, slots=True)
class DlqTopic:
    name: str
    found_by: str  # "prefix" or "format"
    partitions: int
    records: int
    writers: Counter[str] = field(default_factory=Counter)  # format -> records in the sample


@dataclass(frozen=True, slots=True)
class Catalog:
    topics: list[DlqTopic]
    probed: int  # topics looked at
    skipped: int  # topics past MAX_TOPICS_PROBED, not looked at


def find_dlq_topics(admin: TopicAdmin, consumer: ReadConsumer, prefix: str) -> Catalog:
    """The DLQ topics of the cluster, by name, then by their newest records (read in one pass).

    Each DLQ is shown with its record count (the watermarks' difference, transaction markers included) and
    the writers seen in the sample of newest records. The probe reads, in one pass (one assignment), at most `SAMPLE_PER_PARTITION` records of
    at most `MAX_PARTITIONS_PROBED` partitions of every topic the prefix names and of at most
    `MAX_TOPICS_PROBED` others, through the DLQ tools'
    reader (`sidecar.kafka.tools.ReadConsumer`, read_committed) and decoder (`sidecar.ops.dlq.entries`).

    A retry tier topic (`dlq.{topic}.retry.{tier}` by default) matches the prefix but is no DLQ:
    its records carry `__dlq.retry.*` headers (or, empty, its name ends in `.retry.<duration>`).
    """
    counts = admin.topics()
    names = sorted(
        n for n, parts in counts.items() if parts and not n.startswith(_INTERNAL_PREFIXES)
    )
    probed = names[:MAX_TOPICS_PROBED]
    # Every partition's watermarks in one pass (a round trip per partition would take minutes
    # on a cluster of a thousand topics); a topic the broker cannot answer for now has none.
    every = admin.watermarks([(name, p) for name in probed for p in range(counts[name])])
    marks: dict[str, dict[int, tuple[int, int]]] = {name: {} for name in probed}
    for (name, p), ends in every.items():
        marks[name][p] = ends
    sample = {
        (name, p): (max(lo, hi - SAMPLE_PER_PARTITION), hi)
        for name in probed
        for p, (lo, hi) in sorted(marks[name].items())[:MAX_PARTITIONS_PROBED]
        if hi > lo
    }
    writers: dict[str, Counter[str]] = {name: Counter() for name in probed}
    tiers: set[str] = set()  # topics whose sampled records are retry tier records
    for batch in consumer.read_ranges(sample, stall_timeout_s=10):
        for record in batch:
            if any(name.startswith(RETRY_HEADER_PREFIX) for name, _ in record.headers):
                tiers.add(record.topic)
                continue
            entry = entry_from_record(record)
            if entry.is_dlq_record:
                writers[record.topic][entry.format] += 1
    out = [
        DlqTopic(
            name=name,
            found_by="prefix" if prefix and name.startswith(prefix) else "format",
            partitions=counts[name],
            records=sum(hi - lo for lo, hi in marks[name].values()),
            writers=writers[name],
        )
        for name in probed
        if marks[name]
        and ((prefix and name.startswith(prefix)) or writers[name])
        and not (not writers[name] and (name in tiers or _TIER_NAME.search(name)))
    ]
    return Catalog(topics=out, probed=len(probed), skipped=len(names) - len(probed))


__all__ = ["Catalog", "DlqTopic", "find_dlq_topics"]
