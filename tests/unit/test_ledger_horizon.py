"""PartitionLedger in horizon mode: hand-outs ahead of commits, suspects, the isolation pass.

Plain synchronous asserts, as in test_ledger.py; an illegal call raises and changes nothing.
"""

from __future__ import annotations

import pytest

from sidecar.core import compiled
from sidecar.core.backoff import RetryPolicy
from sidecar.core.commitstate import CommitState, decode, encode
from sidecar.core.ledger import (
    Ack,
    ArchiveReason,
    Attempt,
    CommitPoint,
    CrashAccounting,
    ExpiredAttempt,
    IllegalTransition,
    IsolationCharge,
    IsolationPhase,
    LedgerClosed,
    LedgerConfig,
    Ordering,
    PartitionLedger,
    RecordState,
)

FLAT = RetryPolicy(initial_ms=1000, multiplier=2.0, jitter=0.0)
HORIZON = CrashAccounting.HORIZON
WINDOW = 10


def config(ordering: Ordering = Ordering.NONE, **kwargs: object) -> LedgerConfig:
    kwargs.setdefault("horizon_window", WINDOW)
    return LedgerConfig(
        ordering=ordering,
        retry=FLAT,
        crash_accounting=HORIZON,
        **kwargs,  # type: ignore[arg-type]
    )


def make(
    start: int = 100, restored: CommitState | None = None, **kwargs: object
) -> PartitionLedger:
    return PartitionLedger("orders", 3, start, config(**kwargs), restored)


def fill(ledger: PartitionLedger, offsets: range | list[int], key: bytes | None = None) -> None:
    for offset in offsets:
        assert ledger.add(offset, key, f"item-{offset}", 0)


def commit(ledger: PartitionLedger, now: int = 0) -> tuple[CommitPoint, Attempt | None]:
    point = ledger.commit_point()
    return point, ledger.committed(point, now)


def settle(ledger: PartitionLedger, now: int = 0) -> None:
    """The isolated attempt's outcome is known: it is committed before anything else goes out."""
    assert ledger.horizon_status().isolation is IsolationPhase.SETTLING
    assert ledger.horizon_wanted() is not None
    assert ledger.acquire(now, 10) == []
    _, attempt = commit(ledger)
    assert attempt is None
    assert ledger.horizon_status().isolation is not IsolationPhase.SETTLING


def snapshot(ledger: PartitionLedger) -> object:
    return (
        ledger.commit_state(),
        ledger.statistics(),
        ledger.horizon_status(),
        ledger.next_deadline_ms(),
    )


def restart(ledger: PartitionLedger, point: CommitPoint, **kwargs: object) -> PartitionLedger:
    """The process dies; the next owner starts from the last confirmed commit."""
    restored = decode(point.metadata)
    assert restored is not None
    return PartitionLedger(
        "orders", 3, point.offset, ledger.config, restored, epoch=ledger.epoch + 1
    )


# -- normal delivery ----------------------------------------------------------------------------


def test_the_first_hand_out_waits_for_the_first_horizon_then_none_waits() -> None:
    ledger = make()
    fill(ledger, range(100, 104))
    assert ledger.acquire(0, 10) == []  # nothing committed yet: held
    status = ledger.horizon_status()
    assert status.held and status.horizon_committed == 99
    assert status.horizon_wanted == 100 + WINDOW
    point, attempt = commit(ledger)
    assert point.horizon == 100 + WINDOW and attempt is None
    assert point.metadata.startswith("dlq2:")
    attempts = ledger.acquire(0, 10)
    assert [a.offset for a in attempts] == [100, 101, 102, 103]
    assert [a.delivery_count for a in attempts] == [1, 1, 1, 1]
    # Half the window is not used yet: no commit wanted, and records up to H go straight out.
    assert ledger.horizon_wanted() is None
    fill(ledger, range(104, 111))
    assert [a.offset for a in ledger.acquire(0, 10)] == [104, 105, 106, 107, 108, 109, 110]
    assert not ledger.horizon_status().held


def test_a_horizon_commit_is_wanted_before_the_hand_outs_reach_it() -> None:
    ledger = make()
    fill(ledger, range(100, 106))
    point, _ = commit(ledger)
    assert point.horizon == 100 + WINDOW  # the next record in line, plus the window
    assert len(ledger.acquire(0, 10)) == 6  # handed up to 105: 105 + 5 is not past 110
    assert ledger.horizon_wanted() is None
    fill(ledger, [106])
    assert len(ledger.acquire(0, 10)) == 1
    wanted = ledger.horizon_wanted()
    assert wanted == 106 + WINDOW
    fill(ledger, range(107, 111))
    # The commit is under way; hand-outs up to the committed horizon go on meanwhile.
    point = ledger.commit_point()
    assert point.horizon == 107 + WINDOW  # 107 is next in line now
    assert [a.offset for a in ledger.acquire(0, 10)] == [107, 108, 109, 110]
    fill(ledger, [111])
    assert ledger.acquire(0, 10) == []  # 111 > 110: the horizon commit fell behind
    assert ledger.horizon_status().held
    assert ledger.committed(point, 0) is None
    assert [a.offset for a in ledger.acquire(0, 10)] == [111]


def test_commit_points_never_take_the_horizon_back() -> None:
    ledger = make()
    fill(ledger, range(100, 120))
    horizons = []
    for _ in range(6):
        point, _ = commit(ledger)
        horizons.append(point.horizon)
        for attempt in ledger.acquire(0, 3):
            ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    assert horizons == sorted(horizons)
    state = ledger.commit_state()
    assert state.horizon is not None and state.horizon >= max(h for h in horizons if h)


def test_hand_outs_are_not_counted_until_their_outcome_is_known() -> None:
    ledger = make()
    fill(ledger, range(100, 103))
    commit(ledger)
    a, b, c = ledger.acquire(0, 10)
    assert ledger.commit_state().counts == {}  # in flight: a death charges none of them
    released = ledger.answer(b.attempt_id, Ack.RELEASE, 5)
    assert released.delivery_count == 1 and released.state is RecordState.AVAILABLE
    assert ledger.commit_state().counts == {101: 1}
    assert ledger.answer(a.attempt_id, Ack.ACCEPT, 5).delivery_count == 1
    renewed = ledger.answer(c.attempt_id, Ack.RENEW, 5)
    assert renewed.delivery_count == 1
    assert ledger.commit_state().counts == {101: 1}
    # The redelivery waits for a commit of the count it raised, and then the ledger wants one.
    assert ledger.acquire(1005, 10) == []
    assert ledger.horizon_wanted() is not None
    commit(ledger, 1005)
    (again,) = ledger.acquire(1005, 10)
    assert again.offset == 101 and again.delivery_count == 2
    assert ledger.commit_state().counts == {101: 1}
    ledger.expire(1005 + 30_000)  # both c and b time out: charged now
    assert ledger.commit_state().counts == {101: 2, 102: 1}


def test_a_redelivery_waits_for_the_commit_of_its_count() -> None:
    """A death after a redelivery must not restore a count below the one the app saw: the raised
    count is committed (a point made after the outcome, confirmed) before the record goes again."""
    ledger = make()
    fill(ledger, range(100, 102))
    commit(ledger)
    a, b = ledger.acquire(0, 10)
    ledger.answer(a.attempt_id, Ack.RELEASE, 5)
    ledger.answer(b.attempt_id, Ack.ACCEPT, 5)
    made = ledger.commit_point()  # made after the outcome, not confirmed yet
    assert ledger.horizon_wanted() is None  # the periodic commit may carry it within the backoff
    assert ledger.acquire(2000, 10) == []
    assert ledger.horizon_wanted() is not None  # ready and held: wanted now
    stale = ledger.commit_point()
    ledger.committed(made, 2000)
    assert ledger.horizon_wanted() is None
    assert made.metadata and decode(made.metadata).counts == {100: 1}
    (again,) = ledger.acquire(2000, 10)
    assert again.offset == 100 and again.delivery_count == 2
    ledger.committed(stale, 2000)
    # Another release raises the count again: held until a newer point is confirmed.
    ledger.answer(again.attempt_id, Ack.RELEASE, 2000)
    ledger.committed(stale, 4000)  # made before the outcome: does not carry it
    assert ledger.acquire(4000, 10) == []
    commit(ledger, 4000)
    (third,) = ledger.acquire(4000, 10)
    assert third.delivery_count == 3


def test_a_redelivery_waits_for_its_own_count_not_for_later_outcomes() -> None:
    """Outcomes that raise other records' counts after a point carrying this record's raised count
    do not hold its redelivery back: under a steady stream of releases it goes once that point is
    confirmed, not when the stream pauses (a wait for the partition's latest raise starved it)."""
    ledger = make()
    fill(ledger, range(100, 110))
    commit(ledger)
    first, *rest = ledger.acquire(0, 10)
    ledger.answer(first.attempt_id, Ack.RELEASE, 5)  # 100's count raised to 1
    carrying = ledger.commit_point()  # made after that raise
    for attempt in rest[:4]:  # later outcomes raise other counts before the point is confirmed
        ledger.answer(attempt.attempt_id, Ack.RELEASE, 6)
    ledger.committed(carrying, 2000)
    out = ledger.acquire(2000, 10)
    # 100 goes at once; 101.. raised after the confirmed point wait for a newer one.
    assert [(a.offset, a.delivery_count) for a in out] == [(100, 2)]
    assert ledger.horizon_wanted() is not None
    commit(ledger, 2000)
    again = ledger.acquire(2000, 10)
    assert [(a.offset, a.delivery_count) for a in again] == [(o, 2) for o in range(101, 105)]


def test_not_attempted_charges_nothing() -> None:
    ledger = make()
    fill(ledger, range(100, 102))
    commit(ledger)
    a, _ = ledger.acquire(0, 10)
    result = ledger.not_attempted(a.attempt_id, 0)
    assert result.delivery_count == 0 and result.state is RecordState.AVAILABLE
    assert ledger.commit_state().counts == {}
    assert ledger.statistics().attempts_total == 1
    assert ledger.acquire(0, 10)[0].delivery_count == 1


def test_reject_and_release_at_the_limit_are_charged() -> None:
    ledger = make(delivery_count_limit=2)
    fill(ledger, range(100, 102))
    commit(ledger)
    a, b = ledger.acquire(0, 10)
    assert ledger.answer(a.attempt_id, Ack.REJECT, 0).delivery_count == 1
    ledger.answer(b.attempt_id, Ack.RELEASE, 0)
    commit(ledger, 1000)  # the raised count, committed before the redelivery
    (b2,) = ledger.acquire(1000, 10)
    result = ledger.answer(b2.attempt_id, Ack.RELEASE, 1000)
    assert result.state is RecordState.ARCHIVING
    assert result.reason is ArchiveReason.DELIVERY_COUNT_EXCEEDED
    assert [(r.offset, r.delivery_count) for r in ledger.to_archive()] == [(100, 1), (101, 2)]


def test_write_ahead_mode_has_no_horizon() -> None:
    ledger = PartitionLedger("orders", 3, 100, LedgerConfig(retry=FLAT))
    fill(ledger, range(100, 102))
    assert len(ledger.acquire(0, 10)) == 2  # no horizon to wait for: the caller commits first
    assert ledger.commit_state().counts == {100: 1, 101: 1}
    assert ledger.horizon_wanted() is None
    status = ledger.horizon_status()
    assert status.mode is CrashAccounting.WRITE_AHEAD
    assert status.horizon_committed is None and status.isolation is IsolationPhase.NONE
    point = ledger.commit_point()
    assert point.horizon is None and point.metadata.startswith("dlq1:")
    assert ledger.committed(point, 0) is None
    before = snapshot(ledger)
    with pytest.raises(IllegalTransition, match="HORIZON"):
        ledger.isolate(0)
    assert snapshot(ledger) == before


# -- restart and isolation ----------------------------------------------------------------------


def crashed_with_three_in_flight() -> tuple[PartitionLedger, CommitPoint]:
    ledger = make()
    fill(ledger, range(100, 106))
    commit(ledger)
    attempts = ledger.acquire(0, 10)
    ledger.answer(attempts[0].attempt_id, Ack.ACCEPT, 0)  # 100 done
    ledger.answer(attempts[1].attempt_id, Ack.RELEASE, 0)  # 101: count 1, backoff
    ledger.answer(attempts[5].attempt_id, Ack.ACCEPT, 0)  # 105 done
    point, _ = commit(ledger)
    # 102, 103, 104 are in flight: the process dies.
    return ledger, point


def test_after_a_death_the_suspects_are_isolated_one_at_a_time() -> None:
    dead, point = crashed_with_three_in_flight()
    assert decode(point.metadata) == CommitState(101, ((105, 106),), {101: 1}, 110)
    ledger = restart(dead, point)
    fill(ledger, [101, 102, 103, 104])
    status = ledger.horizon_status()
    assert status.isolation is IsolationPhase.READY
    assert status.suspects_left == status.suspects_total == 4
    assert ledger.statistics().isolation_active
    assert ledger.acquire(0, 10) == []  # the pass goes first
    seen = []
    while ledger.wants_isolation:
        charge = ledger.isolate(0)
        assert isinstance(charge, IsolationCharge)
        assert ledger.acquire(0, 10) == []
        assert ledger.horizon_status().isolation is IsolationPhase.CHARGED
        point = ledger.commit_point()
        assert point.charged == charge.offset
        restored = decode(point.metadata)
        assert restored is not None and restored.count(charge.offset) == charge.delivery_count
        attempt = ledger.committed(point, 0)
        assert attempt is not None and attempt.offset == charge.offset
        assert attempt.delivery_count == charge.delivery_count
        assert ledger.horizon_status().isolation is IsolationPhase.IN_FLIGHT
        seen.append((attempt.offset, attempt.delivery_count))
        ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
        settle(ledger)
    assert seen == [(101, 2), (102, 1), (103, 1), (104, 1)]
    status = ledger.horizon_status()
    assert status.isolation is IsolationPhase.NONE and not status.pass_active
    assert status.suspects_left == 0 and status.isolated_total == 4
    # Records above the horizon were never delivered: normal delivery resumes.
    fill(ledger, [111, 112])
    commit(ledger)
    assert [a.offset for a in ledger.acquire(0, 10)] == [111, 112]


def test_records_at_or_below_the_horizon_fetched_later_are_suspects_too() -> None:
    dead, point = crashed_with_three_in_flight()
    ledger = restart(dead, point)
    fill(ledger, [101])
    charge = ledger.isolate(0)
    _, attempt = commit(ledger)
    assert attempt is not None
    ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    settle(ledger)
    assert not ledger.horizon_status().pass_active
    fill(ledger, [102, 108, 111])  # 102 and 108 <= H = 110, 111 is not
    assert ledger.horizon_status().suspects_left == 2
    assert charge.offset == 101
    assert ledger.isolate(0).offset == 102


def test_isolate_refuses_while_anything_of_the_partition_is_in_flight() -> None:
    dead, point = crashed_with_three_in_flight()
    ledger = restart(dead, point)
    fill(ledger, [101, 102])
    ledger.isolate(0)
    before = snapshot(ledger)
    with pytest.raises(IllegalTransition, match="being isolated already"):
        ledger.isolate(0)
    assert snapshot(ledger) == before
    _, attempt = commit(ledger)
    assert attempt is not None
    before = snapshot(ledger)
    with pytest.raises(IllegalTransition, match="being isolated already"):
        ledger.isolate(0)
    assert snapshot(ledger) == before
    ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    fresh = make()
    fill(fresh, [100])
    commit(fresh)
    fresh.acquire(0, 1)
    before = snapshot(fresh)
    with pytest.raises(IllegalTransition, match="in flight"):
        fresh.isolate(0)
    assert snapshot(fresh) == before
    idle = make()
    before = snapshot(idle)
    with pytest.raises(IllegalTransition, match="no suspect"):
        idle.isolate(0)
    assert snapshot(idle) == before


def test_committed_refuses_points_it_did_not_issue() -> None:
    ledger = make()
    before = snapshot(ledger)
    with pytest.raises(IllegalTransition, match="never issued"):
        ledger.committed(CommitPoint("orders", 3, 100, "", 10**6), 0)
    with pytest.raises(IllegalTransition, match="commit point of"):
        ledger.committed(CommitPoint("orders", 4, 100, "", None), 0)
    assert snapshot(ledger) == before


def test_the_charge_is_handed_out_only_by_a_point_that_carries_it() -> None:
    dead, point = crashed_with_three_in_flight()
    ledger = restart(dead, point)
    fill(ledger, [101, 102])
    early = ledger.commit_point()  # made before the charge
    charge = ledger.isolate(0)
    assert ledger.committed(early, 0) is None
    carrying = ledger.commit_point()
    attempt = ledger.committed(carrying, 7)
    assert attempt is not None and attempt.offset == charge.offset
    assert attempt.lock_deadline_ms == 7 + ledger.config.lock_duration_ms
    assert ledger.committed(carrying, 8) is None  # once


def test_a_charge_not_sent_is_taken_back() -> None:
    dead, point = crashed_with_three_in_flight()
    ledger = restart(dead, point)
    fill(ledger, [101, 102])
    charge = ledger.isolate(0)
    _, attempt = commit(ledger)
    assert attempt is not None and charge.delivery_count == 2
    result = ledger.not_attempted(attempt.attempt_id, 0)
    settle(ledger)
    assert result.delivery_count == 1
    assert ledger.commit_state().count(101) == 1
    assert ledger.horizon_status().isolation is IsolationPhase.READY  # still a suspect
    assert ledger.isolate(0).offset == 101


def test_an_isolated_release_or_expiry_settles_the_suspect() -> None:
    dead, point = crashed_with_three_in_flight()
    ledger = restart(dead, point)
    fill(ledger, [101, 102, 103])
    ledger.isolate(0)
    _, attempt = commit(ledger)
    assert attempt is not None
    result = ledger.answer(attempt.attempt_id, Ack.RELEASE, 0)
    settle(ledger)
    assert result.delivery_count == 2  # charged once, not twice
    assert result.retry_at_ms == 2000
    assert ledger.commit_state().count(101) == 2
    ledger.isolate(0)
    _, attempt = commit(ledger, 10)
    assert attempt is not None and attempt.offset == 102
    (expired,) = ledger.expire(10 + ledger.config.lock_duration_ms)
    settle(ledger)
    assert expired.delivery_count == 1 and expired.state is RecordState.AVAILABLE
    status = ledger.horizon_status()
    assert status.suspects_left == 1 and status.isolated_total == 2


def test_a_suspect_restored_at_the_limit_is_archived_without_a_delivery() -> None:
    restored = CommitState(100, (), {100: 3, 101: 1}, horizon=105)
    ledger = make(restored=restored, delivery_count_limit=3)
    fill(ledger, [100, 101])
    (request,) = ledger.to_archive()
    assert request.offset == 100 and request.delivery_count == 3
    assert request.reason is ArchiveReason.DELIVERY_COUNT_EXCEEDED
    assert ledger.horizon_status().suspects_left == 1
    assert ledger.isolate(0).offset == 101


def test_key_order_holds_and_a_suspect_waiting_for_a_retry_does_not_hold_the_partition() -> None:
    restored = CommitState(100, (), {}, horizon=103)
    ledger = make(restored=restored, ordering=Ordering.KEY)
    for offset, key in [(100, b"a"), (101, b"b"), (102, b"a"), (103, b"b"), (104, b"c")]:
        assert ledger.add(offset, key, None, 0)
    ledger.isolate(0)
    _, attempt = commit(ledger)
    assert attempt is not None and attempt.offset == 100
    ledger.answer(attempt.attempt_id, Ack.RELEASE, 0)  # a waits 1 s; 102 (a) behind it
    settle(ledger)
    assert ledger.isolate(0).offset == 101
    _, attempt = commit(ledger)
    assert attempt is not None
    ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    settle(ledger)
    assert ledger.isolate(0).offset == 103
    _, attempt = commit(ledger)
    assert attempt is not None
    ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    settle(ledger)
    status = ledger.horizon_status()
    assert status.isolation is IsolationPhase.WAITING and status.suspects_left == 1
    # 104 (c) goes in normal delivery meanwhile; 100 (settled) comes back uncharged after 1 s.
    commit(ledger)
    (other,) = ledger.acquire(0, 10)
    assert other.offset == 104
    ledger.answer(other.attempt_id, Ack.ACCEPT, 0)
    (retry,) = ledger.acquire(1000, 10)
    assert retry.offset == 100 and retry.delivery_count == 2
    ledger.answer(retry.attempt_id, Ack.ACCEPT, 1000)
    # Now 102 is the head of key a, and a suspect: isolated, alone.
    assert ledger.acquire(1000, 10) == []
    assert ledger.isolate(1000).offset == 102


# -- revoke ---------------------------------------------------------------------------------------


def test_a_clean_revoke_leaves_no_pass_for_the_next_owner() -> None:
    ledger = make()
    fill(ledger, range(100, 105))
    commit(ledger)
    for attempt in ledger.acquire(0, 10):
        ledger.answer(attempt.attempt_id, Ack.RELEASE if attempt.offset == 102 else Ack.ACCEPT, 0)
    state = ledger.revoke()
    assert state == CommitState(102, ((103, 105),), {102: 1}, horizon=101)
    assert ledger.commit_state() == state
    text = ledger.encode_metadata()
    assert decode(text) == state
    nxt = PartitionLedger("orders", 3, 102, ledger.config, decode(text))
    fill(nxt, [102, 105])
    assert nxt.horizon_status().isolation is IsolationPhase.NONE
    commit(nxt)
    assert [a.offset for a in nxt.acquire(5000, 10)] == [102, 105]


def test_a_revoke_with_answers_lost_covers_them_and_nothing_is_charged() -> None:
    ledger = make()
    fill(ledger, range(100, 106))
    commit(ledger)
    attempts = ledger.acquire(0, 10)
    for attempt in attempts:
        if attempt.offset not in (101, 103):
            ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    state = ledger.revoke()
    assert state == CommitState(101, ((102, 103), (104, 106)), {}, horizon=103)
    assert ledger.revoke() == state  # idempotent
    before = snapshot(ledger)
    with pytest.raises(ExpiredAttempt):
        ledger.answer(attempts[1].attempt_id, Ack.ACCEPT, 0)
    with pytest.raises(LedgerClosed):
        ledger.isolate(0)
    with pytest.raises(LedgerClosed):
        ledger.committed(ledger.commit_point(), 0)
    assert snapshot(ledger) == before
    assert ledger.horizon_wanted() is None


def test_revoke_takes_back_a_charge_not_sent_and_keeps_unsettled_suspects() -> None:
    dead, point = crashed_with_three_in_flight()
    ledger = restart(dead, point)
    fill(ledger, [101, 102])
    ledger.isolate(0)
    state = ledger.revoke()
    assert state == CommitState(101, ((105, 106),), {101: 1}, horizon=110)
    assert not ledger.wants_isolation
    assert ledger.horizon_status().isolation is IsolationPhase.WAITING  # suspects left, fenced


def test_revoke_during_an_isolated_delivery_keeps_its_charge() -> None:
    dead, point = crashed_with_three_in_flight()
    ledger = restart(dead, point)
    fill(ledger, [101, 102])
    ledger.isolate(0)
    _, attempt = commit(ledger)
    assert attempt is not None
    state = ledger.revoke()
    assert state == CommitState(101, ((105, 106),), {101: 2}, horizon=110, charged=101)


# -- versions -------------------------------------------------------------------------------------


def test_a_version_1_state_in_horizon_mode_means_counts_as_stored_and_no_pass() -> None:
    v1 = decode(encode(CommitState(100, ((102, 103),), {100: 2, 101: 1}), 4096) or "")
    assert v1 is not None and v1.horizon is None
    ledger = make(restored=v1)
    fill(ledger, [100, 101, 103])
    assert ledger.horizon_status().isolation is IsolationPhase.NONE
    commit(ledger)
    attempts = ledger.acquire(0, 10)
    assert [(a.offset, a.delivery_count) for a in attempts] == [(100, 3), (101, 2), (103, 1)]


def test_a_version_2_state_in_write_ahead_mode_means_counts_as_stored() -> None:
    v2 = CommitState(100, (), {100: 2}, horizon=120, charged=100)
    ledger = PartitionLedger("orders", 3, 100, LedgerConfig(retry=FLAT), v2)
    fill(ledger, [100, 101])
    assert [(a.offset, a.delivery_count) for a in ledger.acquire(0, 10)] == [(100, 3), (101, 1)]
    assert ledger.commit_state().horizon is None


def test_the_window_defaults_to_the_lock_limit_and_is_validated() -> None:
    assert LedgerConfig(max_record_locks=300).window == 300
    assert LedgerConfig(horizon_window=50).window == 50
    with pytest.raises(ValueError, match="horizon_window"):
        LedgerConfig(horizon_window=1)
    # A wrong type: ValueError from __post_init__ pure, TypeError from the native attribute compiled.
    with pytest.raises(TypeError if compiled() else ValueError, match="CrashAccounting"):
        LedgerConfig(crash_accounting="horizon")  # type: ignore[arg-type]


# -- retry tier partitions ------------------------------------------------------------------------


def tier_ledger(start: int = 100, restored: CommitState | None = None) -> PartitionLedger:
    return PartitionLedger("dlq.orders.retry.5s", 0, start, config(), restored, tier=True)


def add_due(ledger: PartitionLedger, offsets: range, due_ms: int) -> None:
    """Tier records released once before, each due at `due_ms` (the ledger's clock)."""
    for offset in offsets:
        assert ledger.add(offset, None, f"item-{offset}", 0, base_count=1, not_before_ms=due_ms)


def tier_restart(point: CommitPoint) -> PartitionLedger:
    restored = decode(point.metadata)
    assert restored is not None
    return tier_ledger(point.offset, restored)


def test_a_death_while_tier_records_wait_for_their_due_time_leaves_no_suspect() -> None:
    ledger = tier_ledger()
    add_due(ledger, range(100, 130), 5000)  # 30 records fetched, due in 5 s
    assert ledger.acquire(1000, 100) == []
    assert ledger.horizon_wanted() is None  # nothing due: no horizon to run ahead
    point, _ = commit(ledger, 1000)
    assert point.horizon == 99  # no window beyond what is due: none of them was handed out
    # The process dies while they wait; the next owner delivers them when due, not one at a time.
    again = tier_restart(point)
    add_due(again, range(100, 130), 5000)
    status = again.horizon_status()
    assert status.suspects_total == 0 and not status.pass_active
    assert not again.wants_isolation
    assert again.acquire(5000, 100) == []  # due: one commit covers every record due together
    assert again.horizon_wanted() == 129
    commit(again, 5000)
    attempts = again.acquire(5000, 100)
    assert [a.offset for a in attempts] == list(range(100, 130))
    assert {a.delivery_count for a in attempts} == {2}


def test_a_death_with_tier_records_in_flight_makes_suspects_of_those_due_only() -> None:
    ledger = tier_ledger()
    add_due(ledger, range(100, 110), 1000)
    add_due(ledger, range(110, 130), 9000)
    assert ledger.acquire(1000, 100) == []
    point, _ = commit(ledger, 1000)
    assert point.horizon == 109  # the ten due now, not the twenty still waiting
    attempts = ledger.acquire(1000, 100)
    assert [a.offset for a in attempts] == list(range(100, 110))
    for attempt in attempts[:5]:
        ledger.answer(attempt.attempt_id, Ack.ACCEPT, 1000)
    point, _ = commit(ledger, 1000)
    # Dies with 105..109 at the app: they are isolated, the twenty waiting are not.
    again = tier_restart(point)
    add_due(again, range(105, 110), 1000)
    add_due(again, range(110, 130), 9000)
    status = again.horizon_status()
    assert status.suspects_total == 5
    charge = again.isolate(1000)
    assert (charge.offset, charge.delivery_count) == (105, 2)


# -- the killer -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ordering", list(Ordering))
@pytest.mark.parametrize("limit", [1, 3, 5])
def test_a_killer_reaches_the_dlq_after_limit_plus_one_deaths_and_takes_no_one(
    ordering: Ordering, limit: int
) -> None:
    killer = 104
    keys = {o: [b"a", b"b", b"c"][o % 3] for o in range(100, 130)}
    cfg = config(ordering, delivery_count_limit=limit, horizon_window=8)
    ledger = PartitionLedger("orders", 3, 100, cfg)
    confirmed: CommitPoint = ledger.commit_point()
    deaths = 0
    archived: dict[int, int] = {}
    accepted: set[int] = set()
    for _ in range(500):
        for offset in range(100, 130):
            ledger.add(offset, keys[offset], None, 0)
        died = False
        for request in ledger.to_archive():
            archived[request.offset] = request.delivery_count
            ledger.dlq_written(request.offset)
        while not died and not ledger.is_idle:
            if ledger.wants_isolation and ledger.in_flight == 0:
                ledger.isolate(0)
            point = ledger.commit_point()
            attempt = ledger.committed(point, 0)
            confirmed = point
            attempts = ([attempt] if attempt else []) + ledger.acquire(0, 3)
            if any(a.offset == killer for a in attempts):
                died = True
                break
            for a in attempts:
                ledger.answer(a.attempt_id, Ack.ACCEPT, 0)
                accepted.add(a.offset)
            for request in ledger.to_archive():
                archived[request.offset] = request.delivery_count
                ledger.dlq_written(request.offset)
        if not died:
            break
        deaths += 1
        restored = decode(confirmed.metadata)
        assert restored is not None
        for offset, count in restored.counts.items():
            assert offset == killer, f"innocent {offset} charged {count} by a death"
        ledger = PartitionLedger("orders", 3, confirmed.offset, cfg, restored, epoch=deaths)
    assert archived == {killer: limit}
    assert deaths == limit + 1
    assert accepted == set(range(100, 130)) - {killer}


def test_nothing_goes_out_before_an_isolated_outcome_is_committed() -> None:
    # Found by the stateful test: with limit 1, an innocent suspect accepted in isolation, then a
    # death before its accept was committed, would come back at its limit and be dead-lettered.
    restored = CommitState(100, (), {}, horizon=101)
    ledger = make(restored=restored, delivery_count_limit=1)
    fill(ledger, [100, 101, 102])
    ledger.isolate(0)
    _, attempt = commit(ledger)
    assert attempt is not None
    in_flight = ledger.commit_point()  # a periodic commit under way while 100 is with the app
    ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    ledger.isolate(0)  # 101 may be charged meanwhile: one commit will carry both
    assert ledger.committed(in_flight, 0) is None  # made before the accept: 101 waits
    assert ledger.horizon_status().isolation is IsolationPhase.CHARGED
    assert ledger.statistics().isolation_active
    point, attempt = commit(ledger)
    assert decode(point.metadata) == CommitState(101, (), {101: 1}, horizon=112, charged=101)
    assert attempt is not None and attempt.offset == 101
    ledger.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    assert ledger.horizon_status().isolation is IsolationPhase.SETTLING
    assert ledger.acquire(0, 10) == []  # 102 waits for the accept of 101 to be committed
    point, _ = commit(ledger)
    assert decode(point.metadata) == CommitState(102, (), {}, horizon=112)
    assert not ledger.horizon_status().pass_active
    assert [a.offset for a in ledger.acquire(0, 10)] == [102]


def test_committed_refuses_a_point_serial_it_never_made() -> None:
    ledger = make()
    point = ledger.commit_point()
    forged = CommitPoint("orders", 3, point.offset, point.metadata, point.horizon, serial=5)
    before = snapshot(ledger)
    with pytest.raises(IllegalTransition, match="never made"):
        ledger.committed(forged, 0)
    assert snapshot(ledger) == before
