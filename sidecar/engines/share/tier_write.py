"""The share engine's write to a retry tier: which answered releases go to one, and write-then-ACCEPT.

Used by :class:`~sidecar.engines.share.decisions.Decisions` when retry tiers are configured
(`sidecar.engines.tiered_share` reads them back). :class:`TierDelay` applies the consumer engine's
rule (the backoff's delay, or the app's Retry-After, above `errors.retry.tier.threshold.ms`) to a
release the share group would redeliver; :func:`to_tier_then_accept` writes the record through the
tier step and ACCEPTs it once written, RELEASEs it otherwise (the sidecar is stopping: never a
drop). Must not import either engine's adapter, the pipeline, or confluent-kafka.
"""

from __future__ import annotations

from typing import Any

from sidecar.core.backoff import RetryPolicy
from sidecar.core.deadletter import ArchiveOutcome
from sidecar.core.outcome import Ack, error_info
from sidecar.engines.interfaces import Delivery, EngineParts, Settled, TierWriter
from sidecar.engines.share.batch import Acquired
from sidecar.kafka.dlq import DlqWriter
from sidecar.kafka.message import Message


class TierDelay:
    """Which answered share deliveries go to a retry tier, and their delay (the backoff's, or the
    app's Retry-After), as the consumer engine's ledger decides it."""

    def __init__(self, parts: EngineParts[Any]) -> None:
        d = parts.config.delivery
        tiers = parts.config.errors.tiers
        self._threshold = tiers.threshold_ms if tiers.enabled else None
        self._policy = RetryPolicy(
            initial_ms=d.retry_delay_initial_ms,
            max_ms=d.retry_delay_max_ms,
            multiplier=d.retry_delay_multiplier,
            jitter=d.retry_delay_jitter,
        )

    def of(self, d: Delivery[Acquired]) -> int | None:
        """The tier delay of `d` (answered, released below the limit), or None: not tiered."""
        if self._threshold is None or d.settled is not Settled.REDELIVERED or d.answer is None:
            return None
        if d.answer.ack != Ack.RELEASE.value:
            return None
        delay = self._policy.delay_ms(d.delivery_count, 0.5, d.answer.retry_after_ms)
        return delay if delay > self._threshold else None


async def to_tier_then_accept(
    tiers: TierWriter,
    sink: DlqWriter,
    d: Delivery[Acquired],
    delay_ms: int,
    out: list[tuple[Message, Ack]],
) -> None:
    """Write `d` to its tier, then ACCEPT it; not written (the sidecar stops): RELEASE."""
    assert d.answer is not None
    outcome = await tiers.write(
        d.tracked, d.delivery_count, delay_ms, error_info(d.answer.error), sink=sink
    )
    out.append((d.ref.msg, Ack.ACCEPT if outcome is ArchiveOutcome.WRITTEN else Ack.RELEASE))


__all__ = ["TierDelay", "to_tier_then_accept"]
