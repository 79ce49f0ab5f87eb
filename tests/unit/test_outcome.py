"""The outcome vocabulary and the attempt decision (sidecar.core.outcome): plain asserts and Hypothesis.

The consumer-group engine's ledger makes the same decision inside its state machine; the property at
the end holds the two together, so the engines cannot drift apart on it again.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core import outcome as O
from sidecar.core.backoff import RetryPolicy
from sidecar.core.ledger import LedgerConfig, PartitionLedger, RecordState
from sidecar.core.wire import AppError


def test_cause_texts_are_kafka_4_4s() -> None:
    assert O.ArchiveReason.REJECTED.cause == "Offset rejected by client."
    assert (
        O.ArchiveReason.DELIVERY_COUNT_EXCEEDED.cause
        == "Offset delivery count exceeded the threshold."
    )
    assert O.ArchiveReason.REJECTED.cause == O.CAUSE_REJECTED
    assert O.ArchiveReason.DELIVERY_COUNT_EXCEEDED.cause == O.CAUSE_DELIVERY_COUNT
    assert [r.label for r in O.ArchiveReason] == [
        "rejected",
        "delivery_count_exceeded",
        "retry_tier",
    ]


def test_the_sidecars_error_classes_are_its_own_namespace() -> None:
    names = [
        v for k, v in vars(O).items() if k.isupper() and isinstance(v, str) and "sidecar." in v
    ]
    assert len(names) == len(set(names)) == 10
    assert (
        O.LOCK_TIMEOUT == "sidecar.LockTimeout"
    )  # both engines (the share engine said LockExpired)
    assert O.http_status_class(503) == "sidecar.HttpStatus503"


def test_the_wire_contracts_copy_of_its_class_name_agrees() -> None:
    # The wire re-exports the class name from its one home (sidecar.core.outcome).
    from sidecar.core import wire

    assert wire.MALFORMED_ANSWER == O.MALFORMED_ANSWER


def test_ack_words_are_the_contracts() -> None:
    assert {a.value for a in O.Ack} == {"accept", "release", "reject", "renew"}


def test_error_info_is_the_one_conversion_from_the_wire() -> None:
    assert O.error_info(None) is None
    assert O.error_info(AppError("", "")) == O.ErrorInfo(None, None, None)
    assert O.error_info(AppError("app.Boom", "it broke", "tb")) == O.ErrorInfo(
        "app.Boom", "it broke", "tb"
    )
    info = O.ErrorInfo("x", None)
    assert O.error_info(info) is info


def test_a_limit_reached_without_an_error_gets_the_sidecars() -> None:
    err = O.dead_letter_error(O.ArchiveReason.DELIVERY_COUNT_EXCEEDED, None)
    assert err is not None and err.class_name == O.DELIVERY_COUNT_EXCEEDED
    assert O.dead_letter_error(O.ArchiveReason.REJECTED, None) is None
    boom = O.ErrorInfo("app.Boom")
    assert O.dead_letter_error(O.ArchiveReason.DELIVERY_COUNT_EXCEEDED, boom) is boom


def test_decide_table() -> None:
    policy = RetryPolicy(initial_ms=100, max_ms=1000, multiplier=2.0, jitter=0.0)
    assert O.decide(O.Ack.ACCEPT, 5, 5) == O.Accept()
    assert O.decide(O.Ack.RENEW, 5, 5) == O.KeepLock()
    assert O.decide(O.Ack.REJECT, 1, 5) == O.DeadLetter(O.ArchiveReason.REJECTED)
    assert O.decide(O.Ack.RELEASE, 5, 5) == O.DeadLetter(O.ArchiveReason.DELIVERY_COUNT_EXCEEDED)
    assert O.decide(O.Ack.RELEASE, 7, 5) == O.DeadLetter(O.ArchiveReason.DELIVERY_COUNT_EXCEEDED)
    assert O.decide(O.Ack.RELEASE, 1, 5) == O.Redeliver(0)  # no policy: the broker times it
    assert O.decide(O.Ack.RELEASE, 3, 5, retry=policy) == O.Redeliver(400)
    assert O.decide(O.Ack.RELEASE, 3, 5, retry=policy, retry_after_ms=7) == O.Redeliver(7)


@pytest.mark.parametrize(("count", "limit"), [(0, 5), (1, 0), (-1, -1)])
def test_decide_refuses_impossible_counts(count: int, limit: int) -> None:
    with pytest.raises(ValueError):
        O.decide(O.Ack.RELEASE, count, limit)


@given(
    ack=st.sampled_from(list(O.Ack)),
    count=st.integers(1, 50),
    limit=st.integers(1, 50),
    rand=st.floats(0.0, 0.999),
)
def test_decide_never_redelivers_at_the_limit_and_never_dead_letters_an_accept(
    ack: O.Ack, count: int, limit: int, rand: float
) -> None:
    verdict = O.decide(ack, count, limit, retry=RetryPolicy(), rand=rand)
    if isinstance(verdict, O.Redeliver):
        assert ack is O.Ack.RELEASE and count < limit and verdict.delay_ms >= 0
    if isinstance(verdict, O.DeadLetter):
        assert ack is O.Ack.REJECT or count >= limit
    assert isinstance(verdict, O.Accept) == (ack is O.Ack.ACCEPT)


@given(
    limit=st.integers(1, 6),
    releases=st.integers(0, 5),
    ack=st.sampled_from(list(O.Ack)),
    retry_after_ms=st.none() | st.integers(0, 10_000),
)
def test_the_ledger_decides_as_decide_does(
    limit: int, releases: int, ack: O.Ack, retry_after_ms: int | None
) -> None:
    policy = RetryPolicy(initial_ms=50, max_ms=5000, multiplier=2.0, jitter=0.0)
    ledger = PartitionLedger("t", 0, 0, LedgerConfig(delivery_count_limit=limit, retry=policy))
    ledger.add(0, None, "item", 0)
    now = 0
    for _ in range(min(releases, limit - 1)):
        (attempt,) = ledger.acquire(now, 1)
        ledger.answer(attempt.attempt_id, O.Ack.RELEASE, now)
        now += 10_000
    (attempt,) = ledger.acquire(now, 1)
    result = ledger.answer(attempt.attempt_id, ack, now, retry_after_ms=retry_after_ms)
    verdict = O.decide(
        ack, attempt.delivery_count, limit, retry=policy, retry_after_ms=retry_after_ms
    )
    match verdict:
        case O.Accept():
            assert result.state is RecordState.ACKNOWLEDGED
        case O.KeepLock():
            assert result.state is RecordState.ACQUIRED
        case O.DeadLetter(reason):
            assert result.state is RecordState.ARCHIVING and result.reason is reason
        case O.Redeliver(delay_ms):
            assert result.state is RecordState.AVAILABLE
            assert result.retry_at_ms == now + delay_ms
