"""Retry tiers, the pure parts: the tier record's headers and the original read back from them, the
ledger's handling of a long release and of a tier record not yet due, and `dlq inspect`'s reading."""

from __future__ import annotations

import pytest

from sidecar.core import ledger as L
from sidecar.core.deadletter import FailedRecord
from sidecar.core.outcome import Ack, ArchiveReason, ErrorInfo
from sidecar.core.record import SourceRecord
from sidecar.core.tiers import TIERS_HEADER, TierWrite, read_tier_record
from sidecar.kafka.dlq.record import build_dlq_record
from sidecar.kafka.dlq.tier_record import build_tier_record
from sidecar.ops.dlq.formats import decode_context


def failed(**extra: object) -> FailedRecord:
    base: dict[str, object] = {
        "topic": "orders",
        "partition": 4,
        "offset": 17,
        "key": b"k",
        "value": b"v",
        "headers": (("h", b"1"), ("__dlq.retry.due", b"1"), ("traceparent", b"00-ab-cd-01")),
        "group": "g",
        "delivery_count": 2,
        "cause": "",
        "exception_class": "com.example.Busy",
        "exception_message": "later",
    }
    return FailedRecord(**{**base, **extra})  # type: ignore[arg-type]


def test_a_tier_record_reads_back_as_its_original() -> None:
    tier = TierWrite(
        due_ms=1_700_000_000_123, tiers=("1m", "10m"), timestamp_ms=42, timestamp_type="create"
    )
    rec = build_tier_record(failed(tier=tier), "dlq.orders.retry.10m", 3)
    assert (rec.topic, rec.partition, rec.key, rec.value) == ("dlq.orders.retry.10m", 1, b"k", b"v")
    as_read = SourceRecord(
        "dlq.orders.retry.10m", 1, 99, rec.key, rec.value, rec.headers, 5, "log-append"
    )
    read = read_tier_record(as_read)
    assert read is not None
    assert read.record == SourceRecord(
        "orders",
        4,
        17,
        b"k",
        b"v",
        (("h", b"1"), ("traceparent", b"00-ab-cd-01")),
        42,
        "create",
        "00-ab-cd-01",
    )
    assert read.delivery_count == 2
    assert read.trail.tiers == ("1m", "10m") and read.trail.due_ms == 1_700_000_000_123
    assert (read.trail.topic, read.trail.partition, read.trail.offset) == (
        "dlq.orders.retry.10m",
        1,
        99,
    )
    assert read.error == ErrorInfo("com.example.Busy", "later")
    ctx = decode_context(rec.headers)
    assert (ctx.format, ctx.source_topic, ctx.source_partition, ctx.source_offset) == (
        "dlq",
        "orders",
        4,
        17,
    )
    assert ctx.delivery_count == 2 and ctx.reason == "retry tier"
    assert ctx.detail == "retry tier record: tiers 1m,10m, due 2023-11-14T22:13:20.123+00:00"


def test_a_record_without_our_headers_is_not_a_tier_record() -> None:
    plain = SourceRecord("t", 0, 1, None, b"x", (("__dlq.retry.topic", b"orders"),), None, "none")
    assert read_tier_record(plain) is None


def test_a_dlq_record_after_tiers_names_them() -> None:
    rec = build_dlq_record(failed(tiers_passed=("1m", "10m")), "dlq.orders", 1, False, 100)
    assert (TIERS_HEADER, b"1m,10m") in rec.headers
    assert decode_context(rec.headers).detail == "after retry tiers 1m,10m"


def test_the_ledger_archives_a_long_release_for_its_tier_and_holds_a_tier_record_until_due() -> (
    None
):
    config = L.LedgerConfig(delivery_count_limit=5, tier_threshold_ms=1000, lock_duration_ms=10_000)
    ledger = L.PartitionLedger("orders", 0, 0, config)
    ledger.add(0, b"k", "item", 0)
    (attempt,) = ledger.acquire(0, 10)
    result = ledger.answer(attempt.attempt_id, Ack.RELEASE, 1, retry_after_ms=5000)
    assert result.state is L.RecordState.ARCHIVING and result.reason is ArchiveReason.RETRY_TIER
    (req,) = ledger.to_archive()
    assert (req.reason, req.delay_ms, req.delivery_count) == (ArchiveReason.RETRY_TIER, 5000, 1)
    ledger.dlq_written(0)
    assert ledger.committable_offset() == 1  # done: the source offset moves on
    assert ledger.statistics().archived_total == 0  # not a dead letter

    tier = L.PartitionLedger("dlq.orders.retry.10s", 0, 0, config)
    tier.add(0, b"k", "item", 100, base_count=1, not_before_ms=10_000)
    assert tier.should_pause() and not tier.may_resume()
    assert tier.acquire(9_999, 10) == []  # not before it is due
    (again,) = tier.acquire(10_000, 10)
    assert again.delivery_count == 2  # the count goes on
    assert tier.may_resume()
    # A short release stays in memory, as without tiers.
    result = tier.answer(again.attempt_id, Ack.RELEASE, 10_001, retry_after_ms=500)
    assert result.state is L.RecordState.AVAILABLE


def test_a_tier_partition_fetches_on_once_what_it_holds_falls_due_within_a_fetch_wait() -> None:
    # A partition resumed waits for the broker's answer to the fetch already under way (up to
    # fetch.wait.max.ms): it fetches on while every record it holds is due within that long.
    config = L.LedgerConfig(tier_fetch_ahead_ms=500)
    tier = L.PartitionLedger("dlq.orders.retry.2s", 0, 0, config)
    tier.add(0, b"k", "item", 0, base_count=1, not_before_ms=1_000)
    assert tier.should_pause() and not tier.may_resume()  # due 1,000 ms from now
    tier.add(1, b"j", "item", 499, base_count=1, not_before_ms=1_000)  # the clock moves to 499
    assert tier.should_pause()  # 501 ms to go
    tier.add(2, b"i", "item", 500, base_count=1, not_before_ms=1_000)
    assert not tier.should_pause() and tier.may_resume()  # due within 500 ms: fetch on
    # Without the allowance, only once the last record it holds is due.
    exact = L.PartitionLedger("dlq.orders.retry.2s", 0, 0, L.LedgerConfig(tier_fetch_ahead_ms=0))
    exact.add(0, b"k", "item", 999, base_count=1, not_before_ms=1_000)
    assert exact.should_pause() and not exact.may_resume()
    with pytest.raises(ValueError, match="tier_fetch_ahead_ms"):
        L.LedgerConfig(tier_fetch_ahead_ms=-1)


def test_a_copy_is_skipped_and_committed_past() -> None:
    ledger = L.PartitionLedger("dlq.orders.retry.10s", 0, 0)
    assert ledger.skip(0, 1)
    assert ledger.committable_offset() == 1
    assert not ledger.skip(0, 1)
