"""The consumer-group engine's retry tier intake: a tier topic's record becomes the original again.

Owns `TierIntake` (a part of `ConsumerGroupEngine`): a tier record back to its original, count, due
time and last error before it enters its ledger; the bounded table of originals taken (copies of an
at-least-once tier write are skipped); the tier counters. Told in its docstring.

Must not import the pipeline, the share engine, or confluent-kafka.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import NamedTuple

from sidecar.config import Config
from sidecar.core.outcome import ErrorInfo
from sidecar.core.record import SourceRecord, Tracked
from sidecar.core.tiers import read_tier_record
from sidecar.engines.consumer.partitions import now_ms
from sidecar.engines.interfaces import Counters
from sidecar.engines.tier_step import wall_ms

log = logging.getLogger("sidecar.engine")

#: How many originals taken from tiers `take` remembers to recognise a copy of one.
SEEN_MAX = 100_000


class TierTaken(NamedTuple):
    """A tier record as its ledger takes it."""

    tracked: Tracked
    delivery_count: int
    not_before_ms: int  # the engine's clock (`now_ms`)
    error: ErrorInfo | None


class TierIntake:
    """Tier records back to their originals.

    A part of :class:`~sidecar.engines.consumer.group.ConsumerGroupEngine`,
    built by it. The engine subscribes to its tier topics with its source topics; a record fetched
    from a tier topic is handed here (`take`) before it enters its tier partition's ledger, and comes
    out as the original (topic, partition, offset, key, value, headers; `sidecar.core.tiers`), its
    delivery count so far, its due time on the engine's clock, and the last error. The ledger holds
    it until it is due (`PartitionLedger.add`'s `not_before_ms`) and asks for the tier partition to
    be paused until then; the scheduler's flow control pauses and resumes it (a source partition is
    never paused for a tier). Its answer is applied as any record's: accepted (done in the tier
    partition), released again (memory or the next tier), or dead-lettered under its original name.

    A tier record written by another group (two groups reading one source topic, one tier topic) is
    skipped: its own group's sidecar delivers it.
    """

    def __init__(self, config: Config, counters: Counters, *, group: str) -> None:
        """`group`: the group whose tier records these are (the others' are skipped)."""
        tiers = config.errors.tiers
        self._counters = counters
        self._group = group
        # tier topic -> its label
        self.topics: dict[str, str] = {
            tiers.topic(t, i): tiers.label(i)
            for t in config.source.topics
            for i in range(len(tiers.delays_ms))
        }
        # (original topic, partition, offset) -> (count, tier topic, partition, offset)
        self._seen: OrderedDict[tuple[str, int, int], tuple[int, str, int, int]] = OrderedDict()

    def take(self, record: SourceRecord) -> TierTaken | None:
        """The original behind `record` (fetched from a tier topic), or None to skip it: a copy
        of one already taken. One that is not a tier record of ours is delivered as it is."""
        read = read_tier_record(record)
        if read is None:
            log.warning(
                "%s[%d]@%d has no retry tier headers; delivered as it is",
                record.topic,
                record.partition,
                record.offset,
            )
            return TierTaken(Tracked(record), 0, 0, None)
        original = read.record
        if read.group is not None and read.group != self._group:
            # Another group's retry of the same source topic (a tier topic named without the
            # group): its own sidecar delivers it; here it is done.
            self._counters.tier_foreign += 1
            return None
        here = (record.topic, record.partition, record.offset)
        seen = self._seen.get(original.coordinates)
        if seen is not None and seen[0] >= read.delivery_count and seen[1:] != here:
            self._counters.tier_duplicates += 1
            log.info(
                "%s[%d]@%d is a copy of a retry of %s[%d]@%d already taken (count %d); skipped",
                *here,
                *original.coordinates,
                read.delivery_count,
            )
            return None
        self._seen[original.coordinates] = (read.delivery_count, *here)
        self._seen.move_to_end(original.coordinates)
        if len(self._seen) > SEEN_MAX:
            self._seen.popitem(last=False)
        label = self.topics.get(record.topic, "")
        self._counters.bump(self._counters.tier_delivered, label)
        # Due on the wall clock; the ledger's clock is monotonic: moved across once, here, the
        # wall clock read first: a pause between the two reads (another thread holding the GIL,
        # a busy core) then makes the record due later, never earlier.
        remaining = read.trail.due_ms - wall_ms()
        not_before = now_ms() + max(0, remaining) + 1  # + 1: both clocks are cut to whole ms
        return TierTaken(
            Tracked(original, tier=read.trail), read.delivery_count, max(not_before, 1), read.error
        )


__all__ = ["SEEN_MAX", "TierIntake", "TierTaken"]
