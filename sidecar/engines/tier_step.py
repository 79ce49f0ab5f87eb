"""The retry tier step of both engines: a long release written to its tier topic (or not, and why).

Owns `TierStep` (the tier chosen, the write built and sent to the adapter's sink, a write failing for
good stopping the sidecar: told in its docstring) and the tier counters. No circuit breaker, no
`errors.tolerance`: a tier write is not a dead letter.

Must not import either engine, the pipeline, the ledger, or confluent-kafka.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from sidecar.config import Config
from sidecar.core.deadletter import ArchiveOutcome, FailedRecord
from sidecar.core.outcome import ErrorInfo
from sidecar.core.record import Tracked
from sidecar.core.tiers import TierWrite
from sidecar.engines.interfaces import Counters, DlqSink
from sidecar.kafka.dlq import DlqFatalError

log = logging.getLogger("sidecar.engine")


def tier_topics(config: Config, sources: Sequence[str] | None = None) -> list[str]:
    """Every tier topic of the configuration (each source topic's, every tier; of `sources` only
    when given), sorted."""
    tiers = config.errors.tiers
    names = config.source.topics if sources is None else sources
    return sorted({tiers.topic(t, i) for t in names for i in range(len(tiers.delays_ms))})


def wall_ms() -> int:
    """The wall clock in epoch ms: what a tier record's due time is written and read in."""
    return time.time_ns() // 1_000_000


class TierStep:
    """Writes long releases to their retry tier.

    A release whose delay is above `errors.retry.tier.threshold.ms` leaves the engine's memory: the
    consumer engine's ledger archives it with reason RETRY_TIER, the share engine hands it here before it
    accepts it. This step picks the tier (the smallest that covers the delay, `RetryTiersConfig.tier_for`),
    builds the write (`FailedRecord` with its `tier` set: due time = now + the tier's delay, the tiers
    passed) and writes it to the `sink` the adapter chose: the DLQ writer, or (transactional consumer
    engine) its committer's transaction, so the tier write and the source offset commit are one
    transaction. A tier write that fails for good stops the sidecar as a failing DLQ write does
    (`DlqFatalError`): the record is never dropped and its offset is not committed. It owns the tier
    counters (`Counters.tier_written`). No circuit breaker, no `errors.tolerance`: a tier write is not a
    dead letter. Must not import either engine, the pipeline, the ledger, or confluent-kafka.
    """

    def __init__(self, config: Config, counters: Counters, fail: Callable[[str], None]) -> None:
        self._config = config
        self._counters = counters
        self._fail = fail

    async def write(
        self,
        tracked: Tracked,
        delivery_count: int,
        delay_ms: int,
        error: ErrorInfo | None,
        *,
        sink: DlqSink,
    ) -> ArchiveOutcome:
        """Write `tracked` to the tier of `delay_ms`: WRITTEN (done), HANDED_OVER (the partition
        went to another owner first) or FAILED (the sidecar stops; not done)."""
        tiers = self._config.errors.tiers
        rec = tracked.record
        tier = tiers.tier_for(delay_ms)
        if tier is None:  # at the threshold or below: the caller keeps it (never happens)
            tier = 0
        label = tiers.label(tier)
        passed = (*(tracked.tier.tiers if tracked.tier is not None else ()), label)
        topic = tiers.topic(rec.topic, tier)
        failed = FailedRecord(
            topic=rec.topic,
            partition=rec.partition,
            offset=rec.offset,
            key=rec.key,
            value=rec.value,
            headers=rec.headers,
            group=self._config.group_id,
            delivery_count=delivery_count,
            cause="",
            exception_class=error.class_name if error else None,
            exception_message=error.message if error else None,
            tiers_passed=passed,
            tier=TierWrite(
                due_ms=wall_ms() + tiers.delays_ms[tier],
                tiers=passed,
                timestamp_ms=rec.timestamp_ms,
                timestamp_type=rec.timestamp_type,
            ),
        )
        try:
            written = await sink.write(failed, topic)
        except DlqFatalError as exc:
            self._counters.tier_failed += 1
            self._fail(f"retry tier write failed: {exc}")
            return ArchiveOutcome.FAILED
        if written is False:
            return ArchiveOutcome.HANDED_OVER
        self._counters.bump(self._counters.tier_written, label)
        return ArchiveOutcome.WRITTEN


__all__ = ["TierStep", "tier_topics", "wall_ms"]
