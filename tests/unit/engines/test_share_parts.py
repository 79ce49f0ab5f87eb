"""The share engine's parts, each built alone from fakes (no broker, no app): what each owns.

Decisions, Isolation, KnownOutcomes and InFlight take the outlet, the share consumers' flags and
the account of deaths as narrow interfaces (`sidecar.engines.share.ports`); the fakes
(`fakes.py`, `share_fakes.py`) record what they were asked. DeathAccount runs on a real journal
in a temporary directory; TierDelay, `isolation_order` and `Batch` are plain values. Where time
matters, trio's MockClock jumps it (`autojump_clock`): no test sleeps.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from sidecar.core.deadletter import ArchiveOutcome
from sidecar.core.outcome import COUNT_EXHAUSTED, LOCK_TIMEOUT, SHUTDOWN, Ack, ArchiveReason
from sidecar.core.wire import Answer, AppError
from sidecar.engines.interfaces import Counters, Delivery, EngineParts, Settled
from sidecar.engines.share.batch import Acquired, Batch, SuspectRun, coordinates, isolation_order
from sidecar.engines.share.decisions import NOT_SENT, Decisions
from sidecar.engines.share.inflight import InFlight
from sidecar.engines.share.isolation import Isolation
from sidecar.engines.share.journal import DEFERRED, RELEASED, UNSENT
from sidecar.engines.share.known import KnownOutcomes
from sidecar.engines.share.recovery import DEAD_SESSION_S, DeathAccount
from sidecar.engines.share.tier_write import TierDelay
from tests.unit.engines.fakes import FakeOutlet, FakeSink, config
from tests.unit.engines.share_fakes import (
    SETTINGS,
    FakeDeaths,
    FakeDeciding,
    FakeFlags,
    FakeKnown,
    FakeMessage,
    FakeTiers,
)

KEY = ("t", 0)
TIERED = {"errors.retry.tiers": ["1m", "10m"], "errors.retry.tier.threshold.ms": 30_000}


def issued(
    outlet: FakeOutlet,
    msg: FakeMessage,
    batch: Batch,
    count: int = 1,
    *,
    answer: Answer | None = None,
    settled: Settled | None = None,
) -> Delivery[Acquired]:
    d: Delivery[Acquired] = outlet.issue(msg.tracked, count, Acquired(msg, batch, msg.coord))  # type: ignore[arg-type]
    d.answer, d.settled = answer, settled
    return d


# ----------------------------------------------------------------------------- KnownOutcomes


def test_known_outcomes_a_record_acquired_again_is_a_suspect_unless_released_here() -> None:
    known = KnownOutcomes()
    assert not known.is_suspect("t", 0, 5, 1)  # a first delivery: nothing was lost
    assert known.is_suspect("t", 0, 5, 2)  # its last outcome unknown to this process
    known.outcome_known(FakeMessage(5))  # type: ignore[arg-type]
    assert not known.is_suspect("t", 0, 5, 2)  # released here: known
    assert known.is_suspect("t", 0, 5, 3)  # known once, then forgotten


def test_known_outcomes_hold_the_breakers_records_once_and_forget_the_oldest() -> None:
    known = KnownOutcomes(known_max=2, held_max=2)
    for offset in (1, 2, 3):
        known.remember_held("t", 0, offset)
        known.outcome_known(FakeMessage(offset))  # type: ignore[arg-type]
    assert known.holds_any()
    assert not known.take_held(("t", 0, 1))  # the oldest, forgotten past the bound
    assert known.take_held(("t", 0, 2)) and not known.take_held(("t", 0, 2))  # taken once
    assert known.take_held(("t", 0, 3)) and not known.holds_any()
    assert known.is_suspect("t", 0, 1, 2)  # its known outcome forgotten too
    assert not known.is_suspect("t", 0, 3, 2)


# ----------------------------------------------------------------------------- InFlight


async def test_in_flight_counts_records_per_partition_and_abandons_batches() -> None:
    flight = InFlight()
    flight.hold({KEY: 2, ("t", 1): 1})
    assert flight.records(KEY) == 2 and flight.records(("t", 1)) == 1
    flight.release({KEY: 1, ("t", 1): 1})
    assert flight.records(KEY) == 1 and flight.records(("t", 1)) == 0
    flight.release({("t", 2): 1})  # never held: nothing goes negative
    assert flight.records(("t", 2)) == 0
    a, b = Batch(0, 1.0), Batch(1, 1.0)
    flight.add(a)
    flight.add(b)
    flight.discard(b)
    assert flight.batches == 1
    flight.abandon()
    assert a.cancel.cancel_called and not a.hard.cancel_called and not b.cancel.cancel_called
    flight.abandon(hard=True)
    assert a.hard.cancel_called
    flight.delivering_started()
    assert flight.delivering == 1
    flight.delivering_ended()
    assert flight.delivering == 0


# ----------------------------------------------------------------------------- Decisions


class Built:
    """A `Decisions` and the fakes it was built from."""

    def __init__(
        self,
        tiered: bool = False,
        tier_outcome: ArchiveOutcome = ArchiveOutcome.WRITTEN,
        journal: object = None,
    ):
        self.outlet = FakeOutlet()
        self.sink = FakeSink()
        self.tiers = FakeTiers(tier_outcome)
        self.flags = FakeFlags()
        self.deaths = FakeDeaths(journal=journal)
        self.known = FakeKnown()
        parts: EngineParts[Any] = EngineParts(
            config=config(**TIERED) if tiered else config(),
            counters=Counters(),
            dlq=self.sink,  # type: ignore[arg-type]
            outlet=self.outlet,  # type: ignore[arg-type]
            tiers=self.tiers,
        )
        self.decisions = Decisions(
            self.outlet,  # type: ignore[arg-type]
            self.sink,  # type: ignore[arg-type]
            self.tiers,
            TierDelay(parts),
            self.flags,
            self.deaths,
            self.known,
        )
        self.decisions.use(SETTINGS)


@pytest.mark.parametrize(
    ("ack", "count", "broker", "settled"),
    [
        (Ack.ACCEPT, 1, 1, Settled.ACCEPTED),
        (Ack.RELEASE, 1, 1, Settled.REDELIVERED),
        (Ack.RELEASE, 3, 3, Settled.DEAD_LETTERED),  # the sidecar's limit (3)
        (Ack.RELEASE, 1, 8, Settled.DEAD_LETTERED),  # the group's last delivery (8)
        (Ack.REJECT, 1, 1, Settled.DEAD_LETTERED),
    ],
)
def test_decisions_settle_an_answer_on_the_sidecars_count_and_the_groups_limit(
    ack: Ack, count: int, broker: int, settled: Settled
) -> None:
    built = Built()
    assert built.decisions.settle(FakeMessage(0, broker), ack, count) is settled  # type: ignore[arg-type]


def test_decisions_an_answer_is_kept_told_and_counted_down_on_its_batch() -> None:
    built = Built(journal=object())  # the journal is told of every answer
    batch = Batch(0, 1.0)
    batch.expect(2)
    m0, m1 = FakeMessage(0), FakeMessage(1)
    d0, d1 = issued(built.outlet, m0, batch), issued(built.outlet, m1, batch)
    release = Answer("release")
    assert built.decisions.answered(d0, Ack.RELEASE, release) is Settled.REDELIVERED
    assert d0.answer is release and d0.settled is Settled.REDELIVERED
    assert built.deaths.answers == [(m0.coord, True)] and not batch.answered.is_set()
    built.decisions.answered(d1, Ack.ACCEPT, Answer("accept"))
    assert batch.answered.is_set() and built.deaths.answers[1] == (m1.coord, False)
    assert d1.settled is Settled.ACCEPTED


def test_decisions_without_a_journal_tell_the_account_no_answer() -> None:
    built = Built()  # the broker's counts: nothing to note
    batch = Batch(0, 1.0)
    batch.expect(1)
    d = issued(built.outlet, FakeMessage(0), batch)
    assert built.decisions.answered(d, Ack.RELEASE, Answer("release")) is Settled.REDELIVERED
    assert built.deaths.answers == [] and batch.answered.is_set()


async def test_decisions_each_answer_to_accept_release_or_a_dlq_write_then_reject() -> None:
    built = Built()
    batch = Batch(0, 1.0)
    o = built.outlet
    m = [FakeMessage(i) for i in range(4)]
    ds = [
        issued(o, m[0], batch, answer=Answer("accept"), settled=Settled.ACCEPTED),
        issued(o, m[1], batch, answer=Answer("release"), settled=Settled.REDELIVERED),
        issued(
            o,
            m[2],
            batch,
            answer=Answer("reject", AppError("E", "bad")),
            settled=Settled.DEAD_LETTERED,
        ),
        issued(o, m[3], batch, answer=NOT_SENT),
    ]
    out: list[tuple[Any, Ack]] = []
    async with trio.open_nursery() as nursery:
        built.decisions.decide_all(nursery, ds, out)
        assert len(out) == 3  # the DLQ write is under way: its REJECT follows it
    assert {msg.offset(): ack for msg, ack in out} == {
        0: Ack.ACCEPT,
        1: Ack.RELEASE,
        2: Ack.REJECT,
        3: Ack.RELEASE,
    }
    assert out[-1] == (m[2], Ack.REJECT)
    (dead,) = o.dead
    assert dead.tracked.record.offset == 2 and dead.reason is ArchiveReason.REJECTED
    assert dead.sink is built.sink and dead.may_hold  # far from the group's limit
    assert built.known.known == [m[1].coord, m[3].coord]  # released here: not suspects later
    assert built.deaths.unsent_ == [(m[3].coord, False)]  # never sent: no attempt to count


async def test_decisions_a_long_release_goes_to_its_tier_then_is_accepted() -> None:
    for outcome, ack in (
        (ArchiveOutcome.WRITTEN, Ack.ACCEPT),
        (ArchiveOutcome.FAILED, Ack.RELEASE),
    ):
        built = Built(tiered=True, tier_outcome=outcome)
        msg = FakeMessage(7)
        later = Answer("release", retry_after_ms=120_000)
        d = issued(built.outlet, msg, Batch(0, 1.0), 2, answer=later, settled=Settled.REDELIVERED)
        out: list[tuple[Any, Ack]] = []
        async with trio.open_nursery() as nursery:
            built.decisions.decide_all(nursery, [d], out)
        assert built.tiers.writes == [(7, 2, 120_000)]
        assert out == [(msg, ack)] and built.known.known == []


async def test_decisions_archive_held_or_not_written() -> None:
    built = Built()
    built.outlet.outcome = ArchiveOutcome.HELD
    held, last = FakeMessage(1, 2), FakeMessage(2, 8)
    out: list[tuple[Any, Ack]] = []
    d = built.decisions
    await d.archive(held, held.tracked, 2, ArchiveReason.REJECTED, None, out)  # type: ignore[arg-type]
    assert out == [(held, Ack.RELEASE)] and built.known.held == [held.coord]
    assert built.known.known == []  # held: it comes back to the app, not as a known outcome
    built.outlet.outcome = ArchiveOutcome.FAILED
    await d.archive(last, last.tracked, 3, ArchiveReason.REJECTED, None, out)  # type: ignore[arg-type]
    assert out[-1] == (last, Ack.RELEASE)  # never a REJECT without the DLQ record
    assert not built.outlet.dead[-1].may_hold  # the group's last delivery: written even held
    assert built.deaths.archived == [(last.coord, 8, "released")]
    assert built.known.known == [last.coord]


async def test_decisions_a_record_acquired_past_the_limit_is_dead_lettered_unsent() -> None:
    built = Built()
    msg = FakeMessage(4, 6)
    out: list[tuple[Any, Ack]] = []
    await built.decisions.dead_letter_exhausted(msg, msg.tracked, 5, out)  # type: ignore[arg-type]
    (dead,) = built.outlet.dead
    assert dead.delivery_count == 4 and dead.reason is ArchiveReason.DELIVERY_COUNT_EXCEEDED
    assert dead.error is not None and dead.error.class_name == COUNT_EXHAUSTED
    assert out == [(msg, Ack.REJECT)] and built.deaths.unsent_ == []
    built.outlet.outcome = ArchiveOutcome.FAILED
    await built.decisions.dead_letter_exhausted(msg, msg.tracked, 5, out)  # type: ignore[arg-type]
    assert out[-1] == (msg, Ack.RELEASE) and built.deaths.unsent_ == [(msg.coord, False)]


def test_decisions_hold_back_releases_what_the_breaker_holds_but_the_groups_last() -> None:
    built = Built()
    first, last, again = FakeMessage(0, 1), FakeMessage(1, 8), FakeMessage(2, 2)
    released, kept = built.decisions.hold_back([first, last, again])  # type: ignore[list-item]
    assert released == [(first, Ack.RELEASE), (again, Ack.RELEASE)]
    assert kept == [last]  # the broker would archive it: processed as usual
    assert built.known.held == [first.coord, again.coord] == built.known.known
    assert built.deaths.unsent_ == [(first.coord, False), (again.coord, False)]


def test_decisions_a_step_is_told_to_the_account_of_deaths_first() -> None:
    built = Built()
    a, b = FakeMessage(0), FakeMessage(1)
    step = built.decisions.step([(a, Ack.ACCEPT), (b, Ack.RELEASE)], flush=True)  # type: ignore[list-item]
    assert built.deaths.settled == [[(a.coord, False), (b.coord, True)]]
    assert step.decisions == [(a, Ack.ACCEPT), (b, Ack.RELEASE)]
    assert step.flush and step.next is None


async def test_decisions_a_missing_answer_at_the_deadline_is_a_release(
    autojump_clock: trio.testing.MockClock,
) -> None:
    built = Built()
    batch = Batch(0, trio.current_time() + 1.0)
    m = [FakeMessage(i) for i in range(3)]
    answered = issued(built.outlet, m[0], batch, answer=Answer("accept"))
    sent = issued(built.outlet, m[1], batch)
    sent.sent = True  # at the app, no answer
    unsent = issued(built.outlet, m[2], batch)  # no room at the app before the lock
    await built.decisions.wait_answers(batch, [answered, sent, unsent])
    assert trio.current_time() == pytest.approx(batch.deadline)  # waited for the lock's margin
    assert built.outlet.sent == [answered, sent, unsent]
    assert answered.answer == Answer("accept")
    assert sent.answer is not None and sent.answer.ack == "release"
    assert sent.answer.error is not None and sent.answer.error.class_name == LOCK_TIMEOUT
    assert unsent.answer is NOT_SENT
    assert [(d, how) for _t, d, how in built.outlet.expired] == [
        (sent, "lock_expired"),
        (unsent, "lock_expired"),
    ]
    built.flags.stop_requested = True  # stopping: an abandoned delivery, not a lock timeout
    late = issued(built.outlet, FakeMessage(9), Batch(0, trio.current_time() + 1.0))
    late.sent = True
    await built.decisions.wait_answers(late.ref.batch, [late])
    assert late.answer is not None and late.answer.error is not None
    assert late.answer.error.class_name == SHUTDOWN
    assert built.outlet.expired[-1][2] == "abandoned"


# ----------------------------------------------------------------------------- Isolation


class Isolated:
    """An `Isolation` and the fakes it was built from."""

    def __init__(self, journal: object = None) -> None:
        self.outlet = FakeOutlet()
        self.flags = FakeFlags()
        self.deaths = FakeDeaths(journal=journal)
        self.in_flight = InFlight()
        self.deciding = FakeDeciding()
        self.isolation = Isolation(
            self.outlet,  # type: ignore[arg-type]
            self.flags,
            self.deaths,
            self.in_flight,
            self.deciding,
        )

    def run(self, n: int, lock_s: float = 30.0) -> tuple[SuspectRun, list[FakeMessage]]:
        """`n` suspects of one batch on consumer 0, found and held in flight."""
        msgs = [FakeMessage(i, 2) for i in range(n)]
        self.in_flight.hold({KEY: n})
        self.isolation.found(n)
        remaining = [(m, m.tracked, 2) for m in msgs]
        return SuspectRun(0, trio.current_time() + lock_s, remaining, {KEY: n}), msgs  # type: ignore[misc]


async def test_isolation_sends_each_suspect_alone_then_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    iso = Isolated()
    run, msgs = iso.run(3)
    assert iso.isolation.waiting == 3
    step = await iso.isolation.next_suspect(run)
    assert [d.tracked.record.offset for d in iso.outlet.issued] == [0]  # one at the app
    assert iso.deaths.alone_ == [[msgs[0].coord]]  # the journal notes it alone first
    assert step.flush and step.decisions == [(msgs[0], Ack.ACCEPT)] and step.next is not None
    assert iso.isolation.isolated_deliveries == 1 and iso.in_flight.batches == 0
    assert iso.isolation.waiting == 3 and iso.in_flight.records(KEY) == 3  # until the last
    while step.next is not None:
        step = await step.next()
    assert iso.deciding.waited == [[0], [1], [2]]
    assert iso.outlet.retired == iso.outlet.issued
    assert iso.isolation.waiting == 0 and iso.deaths.checks == [0]
    assert iso.in_flight.records(KEY) == 0  # the batch's records released
    assert await iso.isolation.wait_over()


async def test_isolation_waits_for_other_batches_and_never_past_the_lock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    iso = Isolated()
    run, msgs = iso.run(2, lock_s=1.0)
    iso.in_flight.delivering_started()  # another batch still delivering: never quiet
    step = await iso.isolation.next_suspect(run)
    assert trio.current_time() >= run.deadline  # it waited until the lock's end
    assert iso.outlet.issued == []  # none went to the app
    assert step.decisions == [(m, Ack.RELEASE) for m in msgs] and step.next is None
    assert iso.deaths.unsent_ == [(m.coord, True) for m in msgs]  # they stay suspects
    assert iso.isolation.waiting == 0 and iso.in_flight.records(KEY) == 0


async def test_isolation_waits_for_another_consumers_acknowledgements_not_its_own(
    autojump_clock: trio.testing.MockClock,
) -> None:
    iso = Isolated()
    run, _msgs = iso.run(1, lock_s=1.0)
    iso.flags.dirty = {0}  # its own consumer's unsent acknowledgements go with this step
    step = await iso.isolation.next_suspect(run)
    assert len(iso.outlet.issued) == 1 and step.next is None
    run, _msgs = iso.run(1, lock_s=1.0)
    iso.flags.dirty = {1}
    step = await iso.isolation.next_suspect(run)
    assert len(iso.outlet.issued) == 1 and step.decisions[0][1] is Ack.RELEASE


async def test_isolation_with_a_journal_releases_what_has_no_turn_left_in_the_lock(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    iso = Isolated(journal=object())
    run, msgs = iso.run(4, lock_s=0.12)  # turns of 0.05 s: two fit
    with caplog.at_level(logging.INFO, "sidecar.share"):
        step = await iso.isolation.next_suspect(run)
    assert step.decisions == [(msgs[2], Ack.RELEASE), (msgs[3], Ack.RELEASE)]
    assert iso.deaths.unsent_ == [(msgs[2].coord, True), (msgs[3].coord, True)]
    assert "2 suspects released unsent" in caplog.text
    assert step.next is not None and [m for m, _t, _c in run.remaining] == msgs[:2]
    assert iso.isolation.waiting == 4  # the run goes on


async def test_isolation_stopping_releases_every_suspect_unsent(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    iso = Isolated()
    run, _msgs = iso.run(2)
    iso.flags.stop_requested = True
    with caplog.at_level(logging.INFO, "sidecar.share"):
        step = await iso.isolation.next_suspect(run)
    assert iso.outlet.issued == [] and [a for _m, a in step.decisions] == [Ack.RELEASE] * 2
    assert "released unsent" not in caplog.text  # stopping, not out of turns
    assert trio.current_time() < run.deadline  # at once


async def test_isolation_no_acquisition_while_suspects_wait(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    iso = Isolated()
    with caplog.at_level(logging.WARNING, "sidecar.share"):
        iso.isolation.found(2)
        iso.isolation.found(1)
    assert caplog.text.count("each goes to the app alone") == 1  # once per isolation
    start = trio.current_time()
    assert not await iso.isolation.wait_over()
    assert trio.current_time() - start == pytest.approx(0.5)  # the consumer re-checks for a stop
    iso.isolation.done(2)
    assert iso.isolation.waiting == 1 and iso.deaths.checks == []
    iso.isolation.done(5)  # cut short: never below none
    assert iso.isolation.waiting == 0 and iso.deaths.checks == [0]
    start = trio.current_time()
    assert await iso.isolation.wait_over() and trio.current_time() == start


# ----------------------------------------------------------------------------- DeathAccount

A, B, C = ("t", 0, 10), ("t", 0, 11), ("t", 1, 5)


def test_death_account_without_a_journal_counts_by_the_broker() -> None:
    archived: list[str] = []
    deaths = DeathAccount("g", 2, archived.append)
    assert deaths.count(A, 3) == (3, None) and deaths.count(A, 0) == (1, None)
    deaths.unsent(A)
    deaths.settle([(A, True)])  # nothing to write, and nothing left behind
    assert deaths.status() == {"journal": False, "recovering": 0}
    deaths.archived_by_broker(B, 8, "released")
    assert archived == ["t"]


async def test_death_account_notes_releases_unsent_and_deferred(tmp_path: Path) -> None:
    deaths = DeathAccount("g", 2, lambda _topic: None)
    await deaths.open(str(tmp_path / "j"))
    assert deaths.journal is not None and deaths.status()["journal"]
    deaths.acquired([(A, 1, 1), (B, 1, 1), (C, 1, 1)])
    deaths.unsent(B)
    deaths.unsent(C, suspect=True)
    deaths.settle([(A, True), (B, True), (C, True)])
    entries = deaths.journal.entries
    assert [entries[c].state for c in (A, B, C)] == [RELEASED, UNSENT, DEFERRED]
    deaths.closed_cleanly()
    deaths.journal.close()


async def dead_incarnation(path: Path, held: list[tuple[tuple[str, int, int], int]]) -> None:
    """An incarnation that acquired `held` (coordinates, broker count), sent the first alone, and
    died (its journal closed without a clean stop)."""
    first = DeathAccount("g", 2, lambda _topic: None)
    await first.open(str(path))
    first.acquired([(c, broker, broker) for c, broker in held])
    first.alone([held[0][0]])
    assert first.journal is not None
    first.journal.close()


async def test_death_account_recovers_one_consumer_until_the_held_records_are_back(
    tmp_path: Path,
) -> None:
    await dead_incarnation(tmp_path / "j", [(A, 1), (B, 1)])
    deaths = DeathAccount("g", 2, lambda _topic: None)
    await deaths.open(str(tmp_path / "j"))
    assert set(deaths.recovering) == {A, B} and not deaths.recovered.is_set()
    turns: list[int] = []

    async def turn(index: int) -> None:
        if await deaths.wait_turn(index, lambda: False):
            turns.append(index)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(turn, 0)
        nursery.start_soon(turn, 1)
        await trio.testing.wait_all_tasks_blocked()
        assert turns == [0]  # one consumer while the dead incarnation's records come back
        assert deaths.count(A, 5) == (2, True)  # alone at the death: charged once, a suspect
        assert deaths.count(B, 5) == (1, True)  # held: not charged
        deaths.check(1)
        assert not deaths.recovered.is_set()  # a suspect still waits
        deaths.check(0)
        assert deaths.recovered.is_set()
    assert turns == [0, 1]
    assert deaths.journal is not None
    deaths.journal.close()


async def test_death_account_what_does_not_come_back_near_the_limit_was_archived(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    await dead_incarnation(tmp_path / "j", [(A, 7), (B, 1)])
    archived: list[str] = []
    deaths = DeathAccount("g", 2, archived.append)
    await deaths.open(str(tmp_path / "j"))
    start = trio.current_time()
    await deaths.watch(8, 1000)  # the group's limit 8, a lock of 1 s
    assert trio.current_time() - start == pytest.approx(DEAD_SESSION_S + 2.0)
    assert archived == ["t"]  # A (7 + 2 consumers >= 8); B had deliveries left
    assert deaths.recovered.is_set() and deaths.recovering == {}
    assert deaths.journal is not None
    deaths.journal.close()


# ----------------------------------------------------------------------------- TierDelay


def test_tier_delay_only_a_long_release_below_the_limit_goes_to_a_tier() -> None:
    outlet = FakeOutlet()
    tiers = FakeTiers()

    def delay(cfg: Any, answer: Answer, settled: Settled) -> int | None:
        parts: EngineParts[Any] = EngineParts(cfg, Counters(), FakeSink(), outlet, tiers)  # type: ignore[arg-type]
        d = issued(outlet, FakeMessage(0), Batch(0, 1.0), answer=answer, settled=settled)
        return TierDelay(parts).of(d)

    long = Answer("release", retry_after_ms=120_000)
    assert delay(config(), long, Settled.REDELIVERED) is None  # no tiers configured
    assert delay(config(**TIERED), long, Settled.REDELIVERED) == 120_000
    assert (
        delay(config(**TIERED), Answer("release", retry_after_ms=100), Settled.REDELIVERED) is None
    )
    assert delay(config(**TIERED), long, Settled.DEAD_LETTERED) is None  # at the limit: the DLQ
    assert delay(config(**TIERED), Answer("accept"), Settled.ACCEPTED) is None


# ----------------------------------------------------------------------------- batch


def suspects(*offsets_counts: tuple[int, int]) -> list[tuple[Any, Any, int]]:
    return [(FakeMessage(o, c), FakeMessage(o, c).tracked, c) for o, c in offsets_counts]


def test_isolation_order_with_own_counts_sends_the_highest_count_last() -> None:
    order = isolation_order(suspects((5, 2), (3, 3), (4, 2)), own_counts=True)
    assert [t.record.offset for _m, t, _c in order] == [4, 5, 3]


def test_isolation_order_with_the_brokers_counts_turns_each_pass() -> None:
    even = isolation_order(suspects((5, 2), (3, 2), (4, 2)))
    odd = isolation_order(suspects((5, 3), (3, 3), (4, 3)))
    assert [t.record.offset for _m, t, _c in even] == [3, 4, 5]
    assert [t.record.offset for _m, t, _c in odd] == [5, 4, 3]


def test_batch_waits_for_its_last_answer_and_a_run_counts_its_suspects() -> None:
    a, b = Batch(0, 1.0), Batch(0, 1.0)
    assert a != b and len({a, b}) == 2  # by identity: the engine keeps them in a set
    a.expect(2)
    a.one_answered()
    assert a.pending == 1 and not a.answered.is_set()
    a.one_answered()
    assert a.answered.is_set()
    b.expect(0)
    b.one_answered()  # an answer for a batch that expected none still ends its wait
    assert b.answered.is_set()
    run = SuspectRun(0, 1.0, suspects((1, 2), (2, 2)), {KEY: 2})
    assert run.total == 2
    assert coordinates(FakeMessage(9, 1, "x", 3)) == ("x", 3, 9)  # type: ignore[arg-type]
