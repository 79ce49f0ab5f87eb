"""The retry tier record (pure): the original's key, value and headers plus `__dlq.retry.*`.

`build_tier_record` is what the DLQ writer produces for a `FailedRecord` whose `tier` is set (a
release written to a retry tier, sidecar.engines.tier_step) instead of a DLQ record: the payload is
always copied (the record comes back to the app from here), never dropped to headers only (a tier
record too large for its topic is a write failure). Header names: `sidecar.core.tiers`.
"""

from __future__ import annotations

from sidecar.core.deadletter import FailedRecord
from sidecar.core.tiers import tier_headers
from sidecar.kafka.dlq.record import DlqRecord, encodable_name


def build_tier_record(failed: FailedRecord, topic: str, partitions: int) -> DlqRecord:
    """The tier record for `failed` (its `tier` set) in `topic` of `partitions` partitions."""
    assert failed.tier is not None
    headers = tier_headers(
        topic=failed.topic,
        partition=failed.partition,
        offset=failed.offset,
        headers=tuple((encodable_name(n), v) for n, v in failed.headers),
        group=failed.group,
        delivery_count=failed.delivery_count,
        tier=failed.tier,
        error_class=failed.exception_class,
        error_message=failed.exception_message,
    )
    return DlqRecord(
        topic=topic,
        partition=failed.partition % max(1, partitions),
        key=failed.key,
        value=failed.value,
        headers=headers,
    )


__all__ = ["build_tier_record"]
