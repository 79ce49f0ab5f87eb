"""PartitionLedger: every transition, every illegal call, ordering, flow control, persistence.

Plain synchronous asserts in the style of h11's test_state.py: an illegal call raises a clear error
and leaves the ledger exactly as it was.
"""

from __future__ import annotations

import random

import pytest

from sidecar.core import compiled
from sidecar.core.backoff import RetryPolicy
from sidecar.core.commitstate import MAX_OFFSET, CommitState, decode
from sidecar.core.ledger import (
    Ack,
    AnswerResult,
    ArchiveReason,
    Attempt,
    ErrorInfo,
    ExpiredAttempt,
    IllegalTransition,
    LedgerClosed,
    LedgerConfig,
    LedgerError,
    Ordering,
    PartitionLedger,
    RecordState,
    UnknownAttempt,
)

LOCK = 30_000
FLAT = RetryPolicy(initial_ms=1000, multiplier=2.0, jitter=0.0)
BOOM = ErrorInfo("app.Boom", "it broke", "Traceback ...")


def make(ordering: Ordering = Ordering.KEY, start: int = 100, **kwargs: object) -> PartitionLedger:
    config = LedgerConfig(ordering=ordering, retry=FLAT, **kwargs)  # type: ignore[arg-type]
    return PartitionLedger("orders", 3, start, config)


def fill(ledger: PartitionLedger, keyed: list[tuple[int, bytes | None]], now: int = 0) -> None:
    for offset, key in keyed:
        assert ledger.add(offset, key, f"item-{offset}", now)


def offsets(attempts: list[Attempt]) -> list[int]:
    return [a.offset for a in attempts]


def snapshot(ledger: PartitionLedger) -> object:
    return (
        ledger.commit_state(),
        ledger.statistics(),
        ledger.next_deadline_ms(),
        ledger.in_flight,
        ledger.buffered,
    )


# -- acquisition ---------------------------------------------------------------------------------


def test_acquire_hands_out_attempts_with_fresh_ids() -> None:
    ledger = make()
    fill(ledger, [(100, b"a"), (101, b"b")])
    attempts = ledger.acquire(5, 10)
    assert attempts == [
        Attempt("orders", 3, 100, attempts[0].attempt_id, 1, 5 + LOCK, b"a", "item-100"),
        Attempt("orders", 3, 101, attempts[1].attempt_id, 1, 5 + LOCK, b"b", "item-101"),
    ]
    assert attempts[0].attempt_id != attempts[1].attempt_id
    assert attempts[0].attempt_id.startswith("orders/3/100/")
    assert ledger.in_flight == 2
    assert ledger.acquire(5, 10) == []  # nothing else may go


def test_attempts_and_results_are_values() -> None:
    ledger = make()
    fill(ledger, [(100, b"a")])
    (attempt,) = ledger.acquire(0, 1)
    result = ledger.answer(attempt.attempt_id, Ack.ACCEPT, 1)
    assert result == AnswerResult(
        attempt.attempt_id, 100, Ack.ACCEPT, RecordState.ACKNOWLEDGED, 1, None, None, None
    )
    again = Attempt(*[getattr(attempt, name) for name in Attempt._FIELDS])
    assert again == attempt
    assert hash(again) == hash(attempt)
    # Immutable: tests/unit/test_ledger_machine.py::test_the_hot_path_values_are_immutable


def test_max_n_and_max_record_locks_bound_the_hand_out() -> None:
    ledger = make(Ordering.NONE, max_record_locks=3)
    fill(ledger, [(o, None) for o in range(100, 110)])
    assert offsets(ledger.acquire(0, 2)) == [100, 101]
    assert offsets(ledger.acquire(0, 10)) == [102]  # three locks in total
    assert ledger.acquire(0, 10) == []
    assert ledger.acquire(0, 0) == []


def test_add_rejects_old_duplicate_and_out_of_range_offsets() -> None:
    ledger = make()
    assert not ledger.add(99, b"k", "x", 0)  # below the committed offset
    assert ledger.add(100, b"k", "x", 0)
    assert not ledger.add(100, b"k", "x", 0)  # a re-fetch keeps nothing
    assert ledger.add(105, b"k", "x", 0)  # gaps are fine
    assert not ledger.add(103, b"k", "x", 0)
    assert ledger.buffered == 2
    with pytest.raises(ValueError, match="out of range"):
        ledger.add(MAX_OFFSET + 1, b"k", "x", 0)


# -- answers -------------------------------------------------------------------------------------


def test_accept_makes_the_record_done_and_moves_the_committable_offset() -> None:
    ledger = make(Ordering.NONE)
    fill(ledger, [(100, None), (104, None), (107, None)])
    a100, a104, a107 = ledger.acquire(0, 10)
    assert ledger.committable_offset() == 100
    ledger.answer(a104.attempt_id, Ack.ACCEPT, 1)
    assert ledger.committable_offset() == 100  # never passes 100, which is not done
    ledger.answer(a100.attempt_id, Ack.ACCEPT, 1)
    assert ledger.committable_offset() == 107
    ledger.answer(a107.attempt_id, Ack.ACCEPT, 1)
    assert ledger.committable_offset() == 108
    assert ledger.is_idle
    assert ledger.buffered == 0  # done records are not kept


def test_release_waits_for_the_backoff_then_redelivers_with_a_higher_count() -> None:
    ledger = make(Ordering.NONE)
    fill(ledger, [(100, None)])
    (first,) = ledger.acquire(0, 1)
    result = ledger.answer(first.attempt_id, Ack.RELEASE, 10, error=BOOM)
    assert result.state is RecordState.AVAILABLE
    assert result.retry_at_ms == 1010
    assert ledger.next_deadline_ms() == 1010
    assert ledger.acquire(1009, 1) == []
    (second,) = ledger.acquire(1010, 1)
    assert second.delivery_count == 2
    assert second.attempt_id != first.attempt_id
    result = ledger.answer(second.attempt_id, Ack.RELEASE, 1020)
    assert result.retry_at_ms == 1020 + 2000  # exponential


def test_release_honours_the_apps_retry_after() -> None:
    ledger = make(Ordering.NONE)
    fill(ledger, [(100, None)])
    (attempt,) = ledger.acquire(0, 1)
    result = ledger.answer(attempt.attempt_id, Ack.RELEASE, 0, retry_after_ms=50)
    assert result.retry_at_ms == 50
    assert offsets(ledger.acquire(50, 1)) == [100]


def test_release_with_zero_backoff_is_available_at_once() -> None:
    ledger = PartitionLedger("t", 0, 0, LedgerConfig(retry=RetryPolicy(initial_ms=0, max_ms=0)))
    ledger.add(0, b"k", None, 0)
    (attempt,) = ledger.acquire(0, 1)
    ledger.answer(attempt.attempt_id, Ack.RELEASE, 0)
    assert ledger.acquire(0, 1)[0].delivery_count == 2


def test_release_at_the_limit_archives_with_the_last_error() -> None:
    ledger = make(Ordering.NONE, delivery_count_limit=2)
    fill(ledger, [(100, b"k")])
    (attempt,) = ledger.acquire(0, 1)
    ledger.answer(attempt.attempt_id, Ack.RELEASE, 0, error=BOOM)
    (attempt,) = ledger.acquire(1000, 1)
    result = ledger.answer(attempt.attempt_id, Ack.RELEASE, 1000)
    assert result.state is RecordState.ARCHIVING
    assert result.reason is ArchiveReason.DELIVERY_COUNT_EXCEEDED
    (request,) = ledger.to_archive()
    assert (request.offset, request.key, request.item) == (100, b"k", "item-100")
    assert request.delivery_count == 2
    assert request.reason is ArchiveReason.DELIVERY_COUNT_EXCEEDED
    assert request.error == BOOM  # the release without an error keeps the earlier one
    assert ledger.to_archive() == []  # handed out once
    assert ledger.committable_offset() == 100  # not done until the DLQ write is confirmed
    ledger.dlq_written(100)
    assert ledger.committable_offset() == 101
    assert ledger.statistics().archived_total == 1


def test_reject_archives_at_once_with_the_error() -> None:
    ledger = make()
    fill(ledger, [(100, b"k")])
    (attempt,) = ledger.acquire(0, 1)
    result = ledger.answer(attempt.attempt_id, Ack.REJECT, 0, error=BOOM)
    assert result.state is RecordState.ARCHIVING
    assert result.reason is ArchiveReason.REJECTED
    (request,) = ledger.to_archive()
    assert request.reason.cause == "Offset rejected by client."
    assert request.error == BOOM
    assert request.delivery_count == 1


def test_cause_texts_match_kafka() -> None:
    assert ArchiveReason.REJECTED.cause == "Offset rejected by client."
    assert (
        ArchiveReason.DELIVERY_COUNT_EXCEEDED.cause
        == "Offset delivery count exceeded the threshold."
    )


def test_renew_restarts_the_lock_and_keeps_the_state() -> None:
    ledger = make()
    fill(ledger, [(100, b"k")])
    (attempt,) = ledger.acquire(0, 1)
    result = ledger.answer(attempt.attempt_id, Ack.RENEW, 20_000)
    assert result.state is RecordState.ACQUIRED
    assert result.lock_deadline_ms == 20_000 + LOCK
    assert result.delivery_count == 1
    assert ledger.next_deadline_ms() == 20_000 + LOCK
    assert ledger.expire(LOCK) == []  # the old deadline no longer applies
    ledger.answer(attempt.attempt_id, Ack.ACCEPT, LOCK + 1)
    assert ledger.committable_offset() == 101


def test_renew_keeps_expiry_in_deadline_order() -> None:
    ledger = make(Ordering.NONE)
    fill(ledger, [(100, None), (101, None)])
    a, _ = ledger.acquire(0, 2)
    ledger.answer(a.attempt_id, Ack.RENEW, 10)
    expired = ledger.expire(LOCK)
    assert [r.offset for r in expired] == [101]
    assert [r.offset for r in ledger.expire(LOCK + 10)] == [100]


# -- expiry --------------------------------------------------------------------------------------


def test_lock_expiry_releases_and_the_late_answer_is_expired() -> None:
    ledger = make()
    fill(ledger, [(100, b"k")])
    (attempt,) = ledger.acquire(0, 1)
    assert ledger.next_deadline_ms() == LOCK
    assert ledger.expire(LOCK - 1) == []
    (result,) = ledger.expire(LOCK)
    assert result.ack is None
    assert result.state is RecordState.AVAILABLE
    assert result.retry_at_ms == LOCK + 1000
    with pytest.raises(ExpiredAttempt):
        ledger.answer(attempt.attempt_id, Ack.ACCEPT, LOCK + 1)
    (again,) = ledger.acquire(LOCK + 1000, 1)
    assert again.delivery_count == 2


def test_answer_after_the_deadline_is_expired_even_before_expire_runs() -> None:
    ledger = make()
    fill(ledger, [(100, b"k")])
    (attempt,) = ledger.acquire(0, 1)
    before = snapshot(ledger)
    for ack in Ack:
        with pytest.raises(ExpiredAttempt):
            ledger.answer(attempt.attempt_id, ack, LOCK)
    with pytest.raises(ExpiredAttempt):
        ledger.not_attempted(attempt.attempt_id, LOCK)
    assert snapshot(ledger) == before
    assert len(ledger.expire(LOCK)) == 1


def test_expiry_at_the_limit_archives_as_a_lock_timeout() -> None:
    ledger = make(delivery_count_limit=1)
    fill(ledger, [(100, b"k")])
    ledger.acquire(0, 1)
    (result,) = ledger.expire(LOCK)
    assert result.state is RecordState.ARCHIVING
    (request,) = ledger.to_archive()
    assert request.reason is ArchiveReason.DELIVERY_COUNT_EXCEEDED
    assert request.error is not None
    assert request.error.class_name == "sidecar.LockTimeout"


# -- illegal calls -------------------------------------------------------------------------------


def test_unknown_attempt_ids_raise_and_change_nothing() -> None:
    ledger = make()
    fill(ledger, [(100, b"k")])
    (attempt,) = ledger.acquire(0, 1)
    before = snapshot(ledger)
    foreign = [
        "nonsense",
        "",
        "payments/3/100/0.0",  # another topic
        "orders/4/100/0.0",  # another partition
        "orders/3/100/1.0",  # another assignment (epoch)
        "orders/3/100/0.99",  # never issued
        "orders/3/100/0.x",
    ]
    for attempt_id in foreign:
        with pytest.raises(UnknownAttempt):
            ledger.answer(attempt_id, Ack.ACCEPT, 1)
        with pytest.raises(UnknownAttempt):
            ledger.not_attempted(attempt_id, 1)
    assert snapshot(ledger) == before
    assert issubclass(UnknownAttempt, LedgerError)
    ledger.answer(attempt.attempt_id, Ack.ACCEPT, 1)


@pytest.mark.parametrize("first", [Ack.ACCEPT, Ack.RELEASE, Ack.REJECT])
@pytest.mark.parametrize("second", list(Ack))
def test_a_second_answer_is_expired_and_changes_nothing(first: Ack, second: Ack) -> None:
    ledger = make()
    fill(ledger, [(100, b"k"), (101, b"k")])
    (attempt,) = ledger.acquire(0, 1)
    ledger.answer(attempt.attempt_id, first, 1)
    before = snapshot(ledger)
    with pytest.raises(ExpiredAttempt, match="no longer live"):
        ledger.answer(attempt.attempt_id, second, 2)
    with pytest.raises(ExpiredAttempt):
        ledger.not_attempted(attempt.attempt_id, 2)
    assert snapshot(ledger) == before


def test_a_superseded_attempt_is_expired() -> None:
    ledger = make()
    fill(ledger, [(100, b"k")])
    (first,) = ledger.acquire(0, 1)
    ledger.expire(LOCK)
    (second,) = ledger.acquire(LOCK + 1000, 1)
    with pytest.raises(ExpiredAttempt):
        ledger.answer(first.attempt_id, Ack.ACCEPT, LOCK + 1001)
    ledger.answer(second.attempt_id, Ack.ACCEPT, LOCK + 1001)


def test_dlq_calls_for_records_not_being_archived_are_illegal() -> None:
    ledger = make()
    fill(ledger, [(100, b"k"), (101, b"j")])
    a, _ = ledger.acquire(0, 2)
    ledger.answer(a.attempt_id, Ack.REJECT, 1)
    before = snapshot(ledger)
    for offset in (100, 101, 102, 99):  # not handed out yet, acquired, unknown, below
        with pytest.raises(IllegalTransition):
            ledger.dlq_written(offset)
        with pytest.raises(IllegalTransition):
            ledger.dlq_failed(offset)
    assert snapshot(ledger) == before
    ledger.to_archive()
    ledger.dlq_written(100)
    with pytest.raises(IllegalTransition):
        ledger.dlq_written(100)


def test_dlq_failure_hands_the_record_out_again() -> None:
    ledger = make()
    fill(ledger, [(100, b"k")])
    (attempt,) = ledger.acquire(0, 1)
    ledger.answer(attempt.attempt_id, Ack.REJECT, 1, error=BOOM)
    (first,) = ledger.to_archive()
    ledger.dlq_failed(100)
    assert ledger.committable_offset() == 100
    (second,) = ledger.to_archive()
    assert second == first
    ledger.dlq_written(100)
    assert ledger.committable_offset() == 101


# -- not attempted -------------------------------------------------------------------------------


def test_not_attempted_does_not_count() -> None:
    ledger = make()
    fill(ledger, [(100, b"k")])
    (attempt,) = ledger.acquire(0, 1)
    result = ledger.not_attempted(attempt.attempt_id, 5)
    assert result.state is RecordState.AVAILABLE
    assert result.delivery_count == 0
    assert ledger.commit_state().counts == {}
    assert ledger.statistics().attempts_total == 0
    with pytest.raises(ExpiredAttempt):
        ledger.answer(attempt.attempt_id, Ack.ACCEPT, 6)
    (again,) = ledger.acquire(5, 1)
    assert again.delivery_count == 1


def test_not_attempted_many_times_never_archives() -> None:
    ledger = make(delivery_count_limit=1)
    fill(ledger, [(100, b"k")])
    for now in range(50):
        (attempt,) = ledger.acquire(now, 1)
        ledger.not_attempted(attempt.attempt_id, now)
    assert ledger.to_archive() == []


def test_not_attempted_with_a_delay() -> None:
    ledger = make()
    fill(ledger, [(100, b"k")])
    (attempt,) = ledger.acquire(0, 1)
    ledger.not_attempted(attempt.attempt_id, 0, delay_ms=250)
    assert ledger.next_deadline_ms() == 250
    assert ledger.acquire(249, 1) == []
    (attempt,) = ledger.acquire(250, 1)
    assert attempt.offset == 100
    before = snapshot(ledger)
    with pytest.raises(ValueError, match="delay_ms"):
        ledger.not_attempted(attempt.attempt_id, 250, delay_ms=-1)
    assert snapshot(ledger) == before


# -- ordering ------------------------------------------------------------------------------------


def test_key_order_one_in_flight_per_key_in_offset_order() -> None:
    ledger = make(Ordering.KEY)
    fill(ledger, [(100, b"a"), (101, b"a"), (102, b"b"), (103, b"a")])
    first = ledger.acquire(0, 10)
    assert offsets(first) == [100, 102]
    ledger.answer(first[0].attempt_id, Ack.ACCEPT, 1)
    assert offsets(ledger.acquire(1, 10)) == [101]


def test_key_order_backoff_blocks_only_its_key() -> None:
    ledger = make(Ordering.KEY)
    fill(ledger, [(100, b"a"), (101, b"a"), (102, b"b"), (103, b"b")])
    a, b = ledger.acquire(0, 10)
    ledger.answer(a.attempt_id, Ack.RELEASE, 0)  # key a backs off until 1000
    ledger.answer(b.attempt_id, Ack.ACCEPT, 0)
    assert offsets(ledger.acquire(1, 10)) == [103]  # key b goes on, 101 waits behind 100
    assert offsets(ledger.acquire(1000, 10)) == [100]


def test_key_order_waits_for_the_dlq_write() -> None:
    ledger = make(Ordering.KEY)
    fill(ledger, [(100, b"a"), (101, b"a")])
    (a,) = ledger.acquire(0, 10)
    ledger.answer(a.attempt_id, Ack.REJECT, 0)
    assert ledger.acquire(1, 10) == []  # archiving is not done
    ledger.to_archive()
    ledger.dlq_written(100)
    assert offsets(ledger.acquire(2, 10)) == [101]


def test_null_keys_are_not_ordered_in_key_mode() -> None:
    ledger = make(Ordering.KEY)
    fill(ledger, [(100, None), (101, None), (102, b"a"), (103, b"a")])
    assert offsets(ledger.acquire(0, 10)) == [100, 101, 102]


def test_partition_order_one_at_a_time_and_backoff_blocks_all() -> None:
    ledger = make(Ordering.PARTITION)
    fill(ledger, [(100, b"a"), (101, b"b"), (102, None)])
    (a,) = ledger.acquire(0, 10)
    assert a.offset == 100
    ledger.answer(a.attempt_id, Ack.RELEASE, 0)
    assert ledger.acquire(500, 10) == []
    (a,) = ledger.acquire(1000, 10)
    assert a.offset == 100
    ledger.answer(a.attempt_id, Ack.ACCEPT, 1000)
    assert offsets(ledger.acquire(1000, 10)) == [101]


def test_no_order_lets_others_pass_a_backoff() -> None:
    ledger = make(Ordering.NONE)
    fill(ledger, [(100, b"a"), (101, b"a"), (102, b"a")])
    attempts = ledger.acquire(0, 10)
    assert offsets(attempts) == [100, 101, 102]
    ledger.answer(attempts[0].attempt_id, Ack.RELEASE, 0)
    ledger.answer(attempts[1].attempt_id, Ack.ACCEPT, 0)
    ledger.answer(attempts[2].attempt_id, Ack.ACCEPT, 0)
    assert ledger.committable_offset() == 100
    state = ledger.commit_state()
    assert state == CommitState(100, ((101, 103),), {100: 1})


# -- flow control --------------------------------------------------------------------------------


def test_pause_on_buffered_records_with_hysteresis() -> None:
    ledger = make(Ordering.NONE, max_buffered_records=10)
    fill(ledger, [(o, None) for o in range(100, 109)])
    assert not ledger.update_paused()
    ledger.add(109, None, None, 0)
    assert ledger.should_pause()
    assert ledger.update_paused()
    assert ledger.statistics().paused
    attempts = ledger.acquire(0, 10)
    for attempt in attempts[:4]:
        ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    assert ledger.update_paused()  # 6 held: not yet down to half
    ledger.answer(attempts[4].attempt_id, Ack.ACCEPT, 0)
    assert ledger.may_resume()
    assert not ledger.update_paused()


def test_pause_when_all_locks_are_taken() -> None:
    ledger = make(Ordering.NONE, max_record_locks=2)
    fill(ledger, [(100, None), (101, None), (102, None)])
    ledger.acquire(0, 10)
    assert ledger.should_pause()
    assert not ledger.may_resume()


def scatter(ledger: PartitionLedger, seed: int) -> list[Attempt]:
    """Acquire in small batches, accepting a random half: an irregular, incompressible state.

    Returns the attempts left in flight once ``acquire`` hands out nothing more."""
    rng = random.Random(seed)
    in_flight: list[Attempt] = []
    while attempts := ledger.acquire(0, 7):
        for attempt in attempts:
            if rng.random() < 0.5:
                ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
            else:
                in_flight.append(attempt)
    return in_flight


def test_pause_before_the_metadata_outgrows_its_budget() -> None:
    ledger = make(Ordering.NONE, metadata_max_bytes=128, max_record_locks=5000)
    fill(ledger, [(o, None) for o in range(100, 1100)])
    in_flight = scatter(ledger, 1)
    assert ledger.statistics().available > 500  # it stopped early: the metadata is nearly full
    assert ledger.should_pause()
    assert not ledger.may_resume()
    assert ledger.update_paused()
    metadata = ledger.encode_metadata()
    assert len(metadata) <= 128
    assert decode(metadata) == ledger.commit_state()  # nothing had to be truncated
    for attempt in in_flight:
        ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    assert not ledger.should_pause()
    assert not ledger.update_paused()


def test_near_the_metadata_budget_counted_and_lowest_records_still_go() -> None:
    ledger = make(Ordering.NONE, metadata_max_bytes=96, max_record_locks=5000)
    fill(ledger, [(o, None) for o in range(100, 1100)])
    in_flight = scatter(ledger, 2)
    assert ledger.acquire(0, 100) == []
    released = in_flight[-1]
    ledger.answer(released.attempt_id, Ack.RELEASE, 0, retry_after_ms=0)
    (again,) = ledger.acquire(0, 100)  # a counted record adds nothing to the metadata
    assert (again.offset, again.delivery_count) == (released.offset, 2)
    assert decode(ledger.encode_metadata()) == ledger.commit_state()
    # Once everything in flight is done, the lowest record always may go.
    ledger.answer(again.attempt_id, Ack.ACCEPT, 0)
    for attempt in in_flight[:-1]:
        ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    lowest = ledger.committable_offset()
    assert offsets(ledger.acquire(0, 1)) == [lowest]


def test_next_deadline_is_the_earliest_lock_or_backoff() -> None:
    ledger = make(Ordering.NONE)
    assert ledger.next_deadline_ms() is None
    fill(ledger, [(100, None), (101, None)])
    assert ledger.next_deadline_ms() is None  # ready records do not need a timer
    a, _ = ledger.acquire(0, 10)
    assert ledger.next_deadline_ms() == LOCK
    ledger.answer(a.attempt_id, Ack.RELEASE, 100)
    assert ledger.next_deadline_ms() == 1100


# -- persistence ---------------------------------------------------------------------------------


def test_encode_metadata_round_trips_the_commit_state() -> None:
    ledger = make(Ordering.NONE)
    fill(ledger, [(o, None) for o in range(100, 120)])
    for attempt in ledger.acquire(0, 20):
        if attempt.offset % 2:
            ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    state = ledger.commit_state()
    assert state.base_offset == ledger.committable_offset() == 100
    assert decode(ledger.encode_metadata()) == state
    assert all(state.is_done(o) for o in range(101, 120, 2))
    assert state.counts == {o: 1 for o in range(100, 120, 2)}


def test_revoke_fences_attempts_and_keeps_their_counts() -> None:
    ledger = make(Ordering.NONE)
    fill(ledger, [(100, None), (101, None), (102, None)])
    a, b, c = ledger.acquire(0, 10)
    ledger.answer(b.attempt_id, Ack.ACCEPT, 1)
    state = ledger.revoke()
    assert state == CommitState(100, ((101, 102),), {100: 1, 102: 1})
    for attempt in (a, c):
        with pytest.raises(ExpiredAttempt):
            ledger.answer(attempt.attempt_id, Ack.ACCEPT, 2)
    with pytest.raises(LedgerClosed):
        ledger.add(103, None, None, 2)
    with pytest.raises(LedgerClosed):
        ledger.acquire(2, 1)
    assert ledger.revoke() == state
    assert ledger.revoked


def test_restore_skips_done_records_and_continues_counts() -> None:
    first = make(Ordering.NONE)
    fill(first, [(o, None) for o in range(100, 106)])
    attempts = first.acquire(0, 10)
    first.answer(attempts[1].attempt_id, Ack.ACCEPT, 1)  # 101 done
    first.answer(attempts[3].attempt_id, Ack.RELEASE, 1)  # 103 counted once
    first.answer(attempts[4].attempt_id, Ack.ACCEPT, 1)  # 104 done
    metadata = first.encode_metadata()
    committed = first.committable_offset()
    first.revoke()

    restored = decode(metadata)
    assert restored is not None
    second = PartitionLedger("orders", 3, committed, first.config, restored, epoch=1)
    added = [o for o in range(100, 106) if second.add(o, None, None, 10)]
    assert added == [100, 102, 103, 105]
    counts = {a.offset: a.delivery_count for a in second.acquire(10, 10)}
    assert counts == {100: 2, 102: 2, 103: 2, 105: 2}
    # The old assignment's ids mean nothing to the new one.
    with pytest.raises(UnknownAttempt):
        second.answer(attempts[0].attempt_id, Ack.ACCEPT, 11)


def test_restored_done_ranges_move_the_committable_offset_past_them() -> None:
    restored = CommitState(100, ((101, 150),), {100: 1})
    ledger = PartitionLedger("t", 0, 100, LedgerConfig(ordering=Ordering.NONE), restored)
    ledger.add(100, None, None, 0)
    (attempt,) = ledger.acquire(0, 1)
    assert attempt.delivery_count == 2
    ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    assert ledger.committable_offset() == 150
    assert ledger.commit_state() == CommitState(150)
    assert not ledger.add(120, None, None, 0)
    assert ledger.committable_offset() == 150
    assert ledger.add(150, None, None, 0)


def test_restored_state_below_the_start_offset_is_ignored() -> None:
    restored = CommitState(10, ((12, 20),), {10: 3, 25: 2})
    ledger = PartitionLedger("t", 0, 15, LedgerConfig(), restored)
    # 15..19 are done per the restored state: the committable offset starts past them.
    assert ledger.commit_state() == CommitState(20, (), {25: 2})
    assert not ledger.add(16, b"k", None, 0)
    assert ledger.add(20, b"k", None, 0)
    assert ledger.add(25, b"k", None, 0)
    assert ledger.commit_state() == CommitState(20, (), {25: 2})


def test_restore_at_the_limit_archives_instead_of_delivering_again() -> None:
    restored = CommitState(100, (), {100: 5, 101: 4})
    ledger = PartitionLedger("t", 0, 100, LedgerConfig(ordering=Ordering.KEY), restored)
    ledger.add(100, b"k", "poison", 0)
    ledger.add(101, b"k", "next", 0)
    assert ledger.acquire(0, 10) == []
    (request,) = ledger.to_archive()
    assert request.offset == 100
    assert request.reason is ArchiveReason.DELIVERY_COUNT_EXCEEDED
    assert request.error is not None
    assert request.error.class_name == "sidecar.DeliveryCountExhausted"
    ledger.dlq_written(100)
    (attempt,) = ledger.acquire(0, 10)
    assert (attempt.offset, attempt.delivery_count) == (101, 5)


# -- misc ----------------------------------------------------------------------------------------


def test_statistics_count_records_per_state() -> None:
    ledger = make(Ordering.NONE)
    fill(ledger, [(o, None) for o in range(100, 106)])
    a, b, c, *_ = ledger.acquire(0, 4)
    ledger.answer(a.attempt_id, Ack.ACCEPT, 0)
    ledger.answer(b.attempt_id, Ack.REJECT, 0)
    ledger.answer(c.attempt_id, Ack.RELEASE, 0)
    stats = ledger.statistics()
    assert (stats.available, stats.acquired, stats.archiving, stats.buffered) == (3, 1, 1, 5)
    assert (stats.acknowledged_total, stats.archived_total, stats.attempts_total) == (1, 0, 4)
    assert stats.in_flight == 1
    assert stats.committable_offset == 101
    assert not stats.paused


def test_a_clock_that_steps_back_does_not_reorder_deadlines() -> None:
    ledger = make(Ordering.NONE)
    fill(ledger, [(100, None), (101, None)])
    (a,) = ledger.acquire(1000, 1)
    (b,) = ledger.acquire(500, 1)  # clock went back: treated as 1000
    assert b.lock_deadline_ms == a.lock_deadline_ms == 1000 + LOCK
    assert len(ledger.expire(1000 + LOCK)) == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delivery_count_limit": 0}, "delivery_count_limit"),
        ({"lock_duration_ms": 0}, "lock_duration_ms"),
        ({"max_record_locks": 0}, "max_record_locks"),
        ({"max_buffered_records": 0}, "max_buffered_records"),
        ({"metadata_max_bytes": 10}, "metadata_max_bytes"),
    ],
)
def test_invalid_configs_are_rejected(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LedgerConfig(**kwargs)  # type: ignore[arg-type]


def test_a_wrongly_typed_config_field_is_rejected() -> None:
    # Pure Python, __post_init__'s check raises ValueError; compiled, the native attribute refuses
    # the wrong type before it runs (TypeError naming the type expected).
    expected = TypeError if compiled() else ValueError
    with pytest.raises(expected, match="Ordering"):
        LedgerConfig(ordering="key")  # type: ignore[arg-type]


def test_start_offset_must_be_a_kafka_offset() -> None:
    with pytest.raises(ValueError, match="start_offset"):
        PartitionLedger("t", 0, -1)
    ledger = PartitionLedger("t", 0, MAX_OFFSET)
    assert ledger.add(MAX_OFFSET, b"k", None, 0)
    (attempt,) = ledger.acquire(0, 1)
    ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    assert ledger.committable_offset() == MAX_OFFSET + 1
