"""Which topics are DLQs: by the prefix rule (`dlq.` by default, the sidecar's
`errors.deadletterqueue.topic.name.prefix`) and by format detection (the newest record of a partition
carries a known writer's context headers: Spring's `TOPIC-dlt`, a Connect or Streams DLQ, a share
group's DLQ under any name).

Each DLQ is shown with its record count (the watermarks' difference, transaction markers included) and
the writers seen in the sample of newest records. The probe reads at most `SAMPLE_PER_PARTITION` records of
at most `MAX_PARTITIONS_PROBED` partitions of at most `MAX_TOPICS_PROBED` topics, through the DLQ tools'
reader (`sidecar.kafka.tools.ReadConsumer`, read_committed) and decoder (`sidecar.ops.dlq_entries`).

Imports: the standard library, `sidecar.kafka.tools` and the `sidecar.ops.dlq_*` modules.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sidecar.kafka.tools import ReadConsumer, TopicAdmin
from sidecar.ops.dlq_entries import entry_from_record

MAX_TOPICS_PROBED = 200
MAX_PARTITIONS_PROBED = 8
SAMPLE_PER_PARTITION = 3
# Kafka's own topics and the sidecar's replay groups never hold dead letters.
_INTERNAL_PREFIXES = ("__", "_confluent", "_schemas")


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
    """The DLQ topics of the cluster, by name first, then by their newest records."""
    names = sorted(n for n in admin.topics() if not n.startswith(_INTERNAL_PREFIXES))
    probed = names[:MAX_TOPICS_PROBED]
    out: list[DlqTopic] = []
    for name in probed:
        by_prefix = bool(prefix) and name.startswith(prefix)
        parts = consumer.partitions(name)
        if not parts:
            continue
        marks = consumer.watermarks(name, parts)
        records = sum(hi - lo for lo, hi in marks.values())
        writers: Counter[str] = Counter()
        ranges = {
            p: (max(lo, hi - SAMPLE_PER_PARTITION), hi)
            for p, (lo, hi) in sorted(marks.items())[:MAX_PARTITIONS_PROBED]
            if hi > lo
        }
        for batch in consumer.read_range(name, ranges, stall_timeout_s=10):
            for record in batch:
                entry = entry_from_record(record)
                if entry.is_dlq_record:
                    writers[entry.format] += 1
        if by_prefix or writers:
            out.append(
                DlqTopic(
                    name=name,
                    found_by="prefix" if by_prefix else "format",
                    partitions=len(parts),
                    records=records,
                    writers=writers,
                )
            )
    return Catalog(topics=out, probed=len(probed), skipped=len(names) - len(probed))


__all__ = ["Catalog", "DlqTopic", "find_dlq_topics"]
