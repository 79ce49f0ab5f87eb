"""The pipeline's side of the DLQ circuit breaker, with a fake delivery state (no broker, no app)."""

from __future__ import annotations

from collections.abc import Sequence

import trio

from sidecar.config import Config, parse_config
from sidecar.core.deadletter import ArchiveOutcome, FailedRecord
from sidecar.core.outcome import Ack, ArchiveReason
from sidecar.core.record import SourceRecord, Tracked
from sidecar.core.wire import AckItem, Answer
from sidecar.engines.interfaces import Answered, Settled, Until
from sidecar.engines.pipeline import Delivery, Pipeline

B = "errors.deadletterqueue.circuit.breaker."


class FakeState:
    """A StateAdapter (and its own StateView) that notes what the breaker's moves told it."""

    def __init__(self) -> None:
        self.released = 0
        self.intake_changes = 0

    @property
    def view(self) -> FakeState:
        return self

    def answered(self, delivery: Delivery, ack: Ack, answer: Answer | AckItem) -> Answered:
        # What a ledger would decide below the limit.
        return _SETTLED[ack]

    def wake(self, *, now: bool = False) -> None:
        pass

    def intake_changed(self, *, held_may_go: bool = False) -> None:
        self.intake_changes += 1
        if held_may_go:
            self.released += 1

    def readiness(self) -> dict[str, bool]:
        return {}

    def stalled(self) -> str | None:
        return None

    def broker_error(self) -> str | None:
        return None

    async def not_reached(self, deliveries: Sequence[Delivery]) -> bool:
        raise AssertionError("not used")


def config() -> Config:
    return parse_config(
        {
            "kafka": {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"},
            "source": {"topics": ["t"]},
            "app": {"url": "http://127.0.0.1:8080/records"},
            "errors.deadletterqueue.topic.name": "",  # no DLQ: archived records are skipped
            B + "enable": True,
            B + "min.records": 2,
            B + "ratio": 0.5,
            B + "cooldown.ms": 1000,
        },
        env={},
    )


def tracked(offset: int) -> Tracked:
    return Tracked(SourceRecord("t", 0, offset, None, b"v", (), 0, "create"))


class NeverCalled:
    async def write(self, _failed: FailedRecord, _topic: str) -> bool:
        raise AssertionError("no DLQ is configured")


async def dead_letter(pipe: Pipeline, offset: int) -> ArchiveOutcome:
    return await pipe.outlet.dead_letter(
        tracked(offset), 1, ArchiveReason.REJECTED, None, consequence="-", sink=NeverCalled()
    )


def half_open(pipe: Pipeline) -> None:
    assert pipe.breaker is not None
    pipe.breaker.breaker._since -= 1000  # the cool-down is over
    transition = pipe.breaker.breaker.tick(pipe.breaker.breaker._now + 1000)
    assert transition is not None
    assert pipe.breaker is not None
    pipe.breaker.transition(transition)


async def test_trip_hold_probe_close() -> None:
    state = FakeState()
    pipe = Pipeline(config(), lambda _p: state)  # type: ignore[arg-type,return-value]
    assert pipe.outlet.room().breaker_room is None
    assert await dead_letter(pipe, 0) is ArchiveOutcome.NO_DLQ  # 1 finished: below min.records
    assert await dead_letter(pipe, 1) is ArchiveOutcome.HELD  # 2 of 2: trips, held
    assert pipe.outlet.room().breaker_open and pipe.outlet.room().breaker_room == 0
    assert pipe.health().checks["circuit_breaker_closed"] is False
    assert await dead_letter(pipe, 2) is ArchiveOutcome.HELD
    half_open(pipe)
    assert state.released == 1  # half-open: the held records may go (one at a time)
    probe = pipe.outlet.issue(tracked(1), 2, None)
    assert pipe.outlet.room().breaker_room == 0  # the probe is out
    other = pipe.outlet.issue(tracked(2), 2, None)
    assert pipe.answer([AckItem(other.id, "accept")]) == [
        (other.id, "ok")
    ]  # not the probe: still half-open
    assert pipe.breaker.status()["state"] == "half_open"  # type: ignore[index]
    assert pipe.answer([AckItem(probe.id, "accept")]) == [(probe.id, "ok")]
    status = pipe.breaker.status()
    assert status is not None and status["state"] == "closed"
    assert (status["finished"], status["trips"], status["held"]) == (0, 1, 2)
    assert state.released == 2
    assert pipe.health().checks["circuit_breaker_closed"] is True


async def test_a_probe_answered_after_the_breaker_reopened_is_ignored() -> None:
    # Before the fix: the probe's accept after a dead-letter re-opened the breaker raised
    # IllegalBreakerCall out of the answer (the breaker no longer had a probe out).
    pipe = Pipeline(config(), lambda _p: FakeState())  # type: ignore[arg-type,return-value]
    await dead_letter(pipe, 0)
    await dead_letter(pipe, 1)
    half_open(pipe)
    probe = pipe.outlet.issue(tracked(1), 2, None)
    assert await dead_letter(pipe, 3) is ArchiveOutcome.HELD  # re-opens
    assert pipe.outlet.room().breaker_open
    assert pipe.answer([AckItem(probe.id, "accept")]) == [(probe.id, "ok")]
    assert pipe.outlet.room().breaker_open  # a stale probe's answer does not close it


async def test_an_explicit_close_releases_the_held_records() -> None:
    state = FakeState()
    pipe = Pipeline(config(), lambda _p: state)  # type: ignore[arg-type,return-value]
    assert pipe.breaker.close("test") is False  # closed already
    await dead_letter(pipe, 0)
    await dead_letter(pipe, 1)
    assert pipe.breaker.close("test") is True
    assert state.released == 1 and not pipe.outlet.room().breaker_open
    assert await dead_letter(pipe, 5) is ArchiveOutcome.NO_DLQ  # a fresh window


async def test_the_timer_moves_to_half_open_after_the_cool_down(autojump_clock: object) -> None:
    pipe = Pipeline(config(), lambda _p: FakeState())  # type: ignore[arg-type,return-value]
    await dead_letter(pipe, 0)
    await dead_letter(pipe, 1)
    assert pipe.breaker is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pipe.breaker.run_timer)
        with trio.fail_after(5):
            while pipe.outlet.room().breaker_room != 1:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()


async def test_waiting_for_room_ends_when_the_breaker_lets_records_out(
    autojump_clock: object,
) -> None:
    pipe = Pipeline(config(), lambda _p: FakeState())  # type: ignore[arg-type,return-value]
    assert await pipe.outlet.wait(Until.BREAKER_ROOM, trio.current_time())  # closed: at once
    await dead_letter(pipe, 0)
    await dead_letter(pipe, 1)
    assert not await pipe.outlet.wait(
        Until.BREAKER_ROOM, trio.current_time() + 0.5
    )  # open: the deadline
    woke: list[float] = []

    async def waiter() -> None:
        assert await pipe.outlet.wait(Until.BREAKER_ROOM, trio.current_time() + 60)
        woke.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.sleep(2)
        closed_at = trio.current_time()
        pipe.breaker.close("test")
    assert woke == [closed_at]


_SETTLED = {
    Ack.ACCEPT: Settled.ACCEPTED,
    Ack.RELEASE: Settled.REDELIVERED,
    Ack.REJECT: Settled.DEAD_LETTERED,
    Ack.RENEW: Settled.KEPT,
}
