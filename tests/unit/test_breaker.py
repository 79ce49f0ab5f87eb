"""The DLQ circuit breaker's state machine (sidecar.core.breaker): plain asserts and Hypothesis.

Invariants of the stateful test, checked after every step against a brute-force model of the
window (every finished record with its bucket):
- while closed, a dead-letter is written exactly when the window with it stays within the policy,
  and the breaker trips exactly when it would not;
- while open or half-open, no dead-letter is ever written;
- at most one probe is out, only while half-open, and ``room`` says so;
- it leaves OPEN only after the cool-down (or an explicit close), and closing empties the window.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sidecar.core.breaker import (
    BreakerPolicy,
    BreakerState,
    CircuitBreaker,
    IllegalBreakerCall,
)

POLICY = BreakerPolicy(ratio=0.5, window_ms=10_000, min_records=10, cooldown_ms=5_000)


def tripped(now: int = 0) -> CircuitBreaker:
    """A breaker that has just tripped: 4 accepted, then dead-letters until it opens."""
    b = CircuitBreaker(POLICY, now)
    for _ in range(4):
        b.succeeded(now)
    while b.dead_letter(now).write:
        pass
    assert b.state is BreakerState.OPEN
    return b


def test_trips_only_over_the_ratio_with_enough_records() -> None:
    b = CircuitBreaker(POLICY, 0)
    for _ in range(9):
        assert b.dead_letter(0).write  # 9 finished < min_records: never trips
    assert b.state is BreakerState.CLOSED
    verdict = b.dead_letter(0)  # the 10th: 10 of 10 dead-lettered
    assert not verdict.write
    assert verdict.transition is not None
    assert verdict.transition.before is BreakerState.CLOSED
    assert verdict.transition.after is BreakerState.OPEN
    assert (verdict.transition.finished, verdict.transition.dead_lettered) == (10, 10)
    assert b.status(0).trips == 1
    assert "10 of the 10 records" in (b.status(0).reason or "")


def test_exactly_the_ratio_does_not_trip() -> None:
    b = CircuitBreaker(POLICY, 0)
    for _ in range(5):
        b.succeeded(0)
    for _ in range(5):
        assert b.dead_letter(0).write  # 5 of 10: not more than 50 %
    assert b.state is BreakerState.CLOSED
    assert not b.dead_letter(0).write  # 6 of 11
    assert b.state is BreakerState.OPEN


def test_old_records_leave_the_window() -> None:
    b = CircuitBreaker(POLICY, 0)
    for _ in range(9):
        assert b.dead_letter(0).write
    # 10 s later the 9 dead-letters are out of the window: one more is 1 of 1.
    assert b.dead_letter(10_000).write
    assert b.status(10_000).finished == 1
    assert b.state is BreakerState.CLOSED


def test_the_window_stays_bounded_when_everything_succeeds() -> None:
    # Before the fix only dead-letters pruned the window: a day of accepts kept every bucket.
    b = CircuitBreaker(POLICY, 0)
    for t in range(0, 3_600_000, 50):
        b.succeeded(t)
    assert len(b._buckets) <= 101
    assert b.status(3_600_000).finished <= 10_000 // 50 + 2


def test_open_holds_every_dead_letter_and_lets_nothing_out() -> None:
    b = tripped()
    assert b.room() == 0
    for t in range(0, 4_999, 500):
        verdict = b.dead_letter(t)
        assert not verdict.write
        assert verdict.transition is None
        assert b.tick(t) is None
    assert b.status(4_999).half_open_at_ms == 5_000


def test_cool_down_then_one_probe_whose_success_closes_it() -> None:
    b = tripped()
    transition = b.tick(5_000)
    assert transition is not None
    assert transition.after is BreakerState.HALF_OPEN
    assert b.room() == 1
    b.probe_sent(5_001)
    assert b.room() == 0
    with pytest.raises(IllegalBreakerCall):
        b.probe_sent(5_002)
    closed = b.probe_succeeded(5_100)
    assert closed.after is BreakerState.CLOSED
    assert b.room() is None
    status = b.status(5_100)
    assert (status.finished, status.dead_lettered, status.reason) == (0, 0, None)
    assert b.dead_letter(5_200).write  # a fresh window: the old dead-letters do not count


def test_a_failed_probe_opens_it_again_for_another_cool_down() -> None:
    b = tripped()
    b.tick(5_000)
    b.probe_sent(5_000)
    reopened = b.probe_failed(5_500)
    assert reopened.after is BreakerState.OPEN
    assert b.room() == 0
    assert b.tick(10_499) is None
    assert b.tick(10_500) is not None
    assert b.status(10_500).trips == 1  # a re-open is not a new trip
    assert "first tripped because" in (b.status(10_500).reason or "")


def test_a_void_probe_lets_another_go() -> None:
    b = tripped()
    b.tick(5_000)
    b.probe_sent(5_000)
    b.probe_void(5_010)
    assert b.room() == 1
    b.probe_sent(5_020)
    assert b.state is BreakerState.HALF_OPEN


def test_a_dead_letter_while_half_open_reopens_and_is_held() -> None:
    b = tripped()
    b.tick(5_000)
    verdict = b.dead_letter(5_001)
    assert not verdict.write
    assert verdict.transition is not None and verdict.transition.after is BreakerState.OPEN


def test_explicit_close_from_open_and_when_closed() -> None:
    b = tripped()
    transition = b.close(100, "closed by the operator")
    assert transition is not None and transition.before is BreakerState.OPEN
    assert b.state is BreakerState.CLOSED
    assert b.close(200, "again") is None


def test_illegal_probe_calls_leave_it_unchanged() -> None:
    b = CircuitBreaker(POLICY, 0)
    for call in (b.probe_succeeded, b.probe_failed, b.probe_void):
        with pytest.raises(IllegalBreakerCall):
            call(0)
    with pytest.raises(IllegalBreakerCall):
        b.probe_sent(0)
    assert b.state is BreakerState.CLOSED
    assert b.room() is None


def test_a_clock_stepping_back_reads_as_the_last_value() -> None:
    b = tripped(now=1_000)
    assert b.tick(500) is None  # not 5 s before its opening
    assert b.tick(6_000) is not None


def test_bad_policies_are_refused() -> None:
    for kwargs in (
        {"ratio": 1.0},
        {"ratio": -0.1},
        {"ratio": float("nan")},
        {"window_ms": 0},
        {"min_records": 0},
        {"cooldown_ms": -1},
    ):
        with pytest.raises(ValueError):
            BreakerPolicy(**kwargs)  # type: ignore[arg-type]


class BreakerMachine(RuleBasedStateMachine):
    """Random inputs against a brute-force model of the window."""

    def __init__(self) -> None:
        super().__init__()
        self.policy = BreakerPolicy(ratio=0.3, window_ms=1_000, min_records=5, cooldown_ms=200)
        self.now = 0
        self.breaker = CircuitBreaker(self.policy, 0)
        self.model: list[tuple[int, bool]] = []  # (bucket, dead-lettered) while closed
        self.opened_at: int | None = None

    def _window(self) -> tuple[int, int]:
        b = self.policy.bucket_ms
        oldest = (self.now - self.policy.window_ms) // b
        live = [dead for bucket, dead in self.model if bucket > oldest]
        return len(live), sum(live)

    @rule(ms=st.integers(0, 400))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @rule(back=st.integers(1, 50))
    def clock_steps_back(self, back: int) -> None:
        # The breaker reads it as the last value seen; the model's clock does not move either.
        self.tick()
        before = self.breaker.state
        self.breaker.tick(self.now - back)
        assert self.breaker.state is before

    @rule()
    def succeeded(self) -> None:
        self.breaker.succeeded(self.now)
        if self.breaker.state is BreakerState.CLOSED:
            self.model.append((self.now // self.policy.bucket_ms, False))

    @rule()
    def dead_letter(self) -> None:
        state = self.breaker.state
        finished, dead = self._window()
        verdict = self.breaker.dead_letter(self.now)
        if state is not BreakerState.CLOSED:
            assert not verdict.write
            assert self.breaker.state is BreakerState.OPEN
            if state is BreakerState.HALF_OPEN:
                self.opened_at = self.now
            return
        trips = self.policy.over(finished + 1, dead + 1)
        assert verdict.write is not trips
        assert (verdict.transition is not None) is trips
        self.model.append((self.now // self.policy.bucket_ms, True))
        if trips:
            assert self.breaker.state is BreakerState.OPEN
            self.opened_at = self.now

    @rule()
    def tick(self) -> None:
        state = self.breaker.state
        transition = self.breaker.tick(self.now)
        if transition is not None:
            assert state is BreakerState.OPEN
            assert self.opened_at is not None
            assert self.now >= self.opened_at + self.policy.cooldown_ms
        elif state is BreakerState.OPEN:
            assert self.opened_at is not None
            assert self.now < self.opened_at + self.policy.cooldown_ms

    @precondition(lambda self: self.breaker.room() == 1)
    @rule()
    def send_probe(self) -> None:
        self.breaker.probe_sent(self.now)

    @precondition(lambda self: self.breaker.status(self.now).probe_out)
    @rule(verdict=st.sampled_from(["accepted", "dead-lettered", "void"]))
    def probe_answer(self, verdict: str) -> None:
        if verdict == "accepted":
            self.breaker.probe_succeeded(self.now)
            self.model.clear()
        elif verdict == "dead-lettered":
            self.breaker.probe_failed(self.now)
            self.opened_at = self.now
        else:
            self.breaker.probe_void(self.now)

    @rule()
    def operator_closes(self) -> None:
        if self.breaker.close(self.now, "test") is not None:
            self.model.clear()
        else:
            assert self.breaker.state is BreakerState.CLOSED

    @invariant()
    def window_matches_the_model(self) -> None:
        status = self.breaker.status(self.now)
        if status.state is BreakerState.CLOSED:
            assert (status.finished, status.dead_lettered) == self._window()
            assert status.reason is None

    @invariant()
    def room_and_probe_agree_with_the_state(self) -> None:
        status = self.breaker.status(self.now)
        room = self.breaker.room()
        if status.state is BreakerState.CLOSED:
            assert room is None and not status.probe_out
        elif status.state is BreakerState.OPEN:
            assert room == 0 and not status.probe_out
            assert status.reason is not None
        else:
            assert room == (0 if status.probe_out else 1)


BreakerMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
test_breaker_machine = BreakerMachine.TestCase
