"""`PartitionLedger.dlq_withheld`: a DLQ write the circuit breaker held goes back for one more delivery."""

from __future__ import annotations

import pytest

from sidecar.core.backoff import RetryPolicy
from sidecar.core.ledger import (
    Ack,
    CrashAccounting,
    IllegalTransition,
    LedgerConfig,
    Ordering,
    PartitionLedger,
    RecordState,
)

FLAT = RetryPolicy(initial_ms=1000, multiplier=2.0, jitter=0.0)


def make(mode: CrashAccounting, ordering: Ordering = Ordering.KEY) -> PartitionLedger:
    config = LedgerConfig(
        ordering=ordering, retry=FLAT, delivery_count_limit=2, crash_accounting=mode
    )
    ledger = PartitionLedger("orders", 0, 100, config)
    for offset in (100, 101):
        assert ledger.add(offset, b"k", f"item-{offset}", 0)
    if mode is CrashAccounting.HORIZON:
        ledger.committed(ledger.commit_point(), 0)  # the horizon covers the hand-outs
    return ledger


def stored(ledger: PartitionLedger, mode: CrashAccounting, now: int) -> None:
    """Horizon mode: the counts raised so far committed (a redelivery waits for that)."""
    if mode is CrashAccounting.HORIZON:
        ledger.committed(ledger.commit_point(), now)


@pytest.mark.parametrize("mode", list(CrashAccounting))
def test_an_exhausted_record_held_goes_out_once_more_and_blocks_the_commit(
    mode: CrashAccounting,
) -> None:
    ledger = make(mode)
    for now in (0, 1000):
        stored(ledger, mode, now)
        (attempt,) = ledger.acquire(now, 10)
        ledger.answer(attempt.attempt_id, Ack.RELEASE, now)
    (request,) = ledger.to_archive()
    assert request.delivery_count == 2
    ledger.dlq_withheld(100, 2000)
    stats = ledger.statistics()
    assert (stats.archiving, stats.available) == (0, 2)
    assert ledger.committable_offset() == 100  # still not done
    stored(ledger, mode, 2000)
    # At the limit, yet delivered again (not archived at once), its count going on: 3.
    (again,) = ledger.acquire(2000, 10)
    assert (again.offset, again.delivery_count) == (100, 3)
    ledger.answer(again.attempt_id, Ack.ACCEPT, 2000)
    assert ledger.committable_offset() == 101
    # The next record of the key goes out now, in order.
    (nxt,) = ledger.acquire(2000, 10)
    assert nxt.offset == 101


def test_a_held_record_failing_again_is_archived_again() -> None:
    ledger = make(CrashAccounting.WRITE_AHEAD)
    (attempt,) = ledger.acquire(0, 10)
    ledger.answer(attempt.attempt_id, Ack.REJECT, 0)
    (request,) = ledger.to_archive()
    ledger.dlq_withheld(request.offset, 10)
    (again,) = ledger.acquire(10, 10)
    assert again.delivery_count == 2
    result = ledger.answer(again.attempt_id, Ack.RELEASE, 10)
    assert result.state is RecordState.ARCHIVING  # the limit is reached: the DLQ, as usual
    (request,) = ledger.to_archive()
    assert request.delivery_count == 2
    ledger.dlq_written(request.offset)
    assert ledger.committable_offset() == 101


def test_only_a_record_waiting_for_its_dlq_write_can_be_withheld() -> None:
    ledger = make(CrashAccounting.WRITE_AHEAD)
    with pytest.raises(IllegalTransition):
        ledger.dlq_withheld(100, 0)
    (attempt,) = ledger.acquire(0, 10)
    with pytest.raises(IllegalTransition):
        ledger.dlq_withheld(100, 0)  # in flight
    ledger.answer(attempt.attempt_id, Ack.REJECT, 0)
    with pytest.raises(IllegalTransition):
        ledger.dlq_withheld(100, 0)  # not handed out by to_archive yet
    assert ledger.statistics().archiving == 1
