"""The pipeline's parts, each built alone from fakes (no broker, no app): what each owns.

PipelineOutlet (the live deliveries, what is sending, the room), BreakerGate (the DLQ circuit
breaker's probe and timer, on trio's mock clock) and DlqStep (one record's DLQ write, its outcome
and counters).
"""

from __future__ import annotations

import secrets
from typing import Any

import trio
import trio.testing

from sidecar.core.breaker import BreakerPolicy, BreakerState, CircuitBreaker, Transition
from sidecar.core.deadletter import ArchiveOutcome
from sidecar.core.outcome import ArchiveReason, ErrorInfo
from sidecar.core.record import LiveIds
from sidecar.engines.batching import BatchAssembler
from sidecar.engines.breaker_gate import BreakerGate
from sidecar.engines.dlq_step import DlqStep
from sidecar.engines.interfaces import Counters, Delivery, Settled, Until
from sidecar.engines.outlet import PipelineFlags, PipelineOutlet, Reachability
from sidecar.engines.pull import PullQueue
from sidecar.kafka.dlq import DlqFatalError, DlqRecord
from sidecar.telemetry.tracing import Tracing
from tests.unit.engines.fakes import Calls, FakeSink, config, tracked

# ----------------------------------------------------------------------------- PipelineOutlet


def outlet(
    *, pull: PullQueue | None = None, gate: BreakerGate | None = None
) -> tuple[PipelineOutlet, list[list[Delivery[Any]]], PipelineFlags, Counters]:
    requests: list[list[Delivery[Any]]] = []
    flags, counters = PipelineFlags(dlq_ready=True), Counters()
    out = PipelineOutlet(
        LiveIds(secrets.token_bytes),
        counters,
        flags,
        Reachability(),
        batches=BatchAssembler(1, 0.0, 2, requests.append),
        pull=pull,
        send_capacity=2,
        gate=gate,
        dlq_step=None,  # type: ignore[arg-type]  # not used here
        fail=Calls(),
    )
    return out, requests, flags, counters


def test_outlet_issues_sends_and_retires() -> None:
    out, requests, _flags, counters = outlet()
    first = out.issue(tracked(0), 1, "ref")
    second = out.issue(tracked(1), 1, "ref")
    assert first.id != second.id and out.room().in_flight == 2
    out.send(first)
    out.send(second)
    assert requests == [[first], [second]]  # two request slots: each its own request
    assert out.sending == 2 and out.room().send_room == 0
    out.request_done(1)
    assert out.sending == 1 and out.room().send_room == 1
    out.retire(first)
    out.lock_expired("t", second, "lock_expired")
    assert out.room().in_flight == 0 and counters.delivered == {"lock_expired": 1}


def test_outlet_room_says_what_the_pipeline_leaves() -> None:
    out, _requests, flags, _counters = outlet()
    assert out.room().app_reachable and not out.room().draining
    flags.draining = True
    flags.failure = "x"
    room = out.room()
    assert room.draining and room.failed and room.breaker_room is None


async def test_outlet_pull_mode_queues_for_the_polls() -> None:
    pull = PullQueue()
    out, requests, _flags, _counters = outlet(pull=pull)
    out.send(out.issue(tracked(0), 1, "ref"))
    assert requests == [] and pull.queued() == 1 and out.sending == 0
    assert out.room().send_room == 0  # no poll waits: nothing more is wanted
    assert await out.wait(Until.INTAKE_OPEN, trio.current_time()) is False


# ----------------------------------------------------------------------------- BreakerGate


def gate(on_change: Calls) -> BreakerGate:
    policy = BreakerPolicy(ratio=0.5, window_ms=60_000, min_records=2, cooldown_ms=1000)
    return BreakerGate(CircuitBreaker(policy, 0), on_change)


def delivery(offset: int) -> Delivery[None]:
    return Delivery(f"d{offset}", tracked(offset), 1, None)


async def test_breaker_gate_trips_holds_and_probes(autojump_clock: trio.testing.MockClock) -> None:
    moved = Calls()
    g = gate(moved)
    assert g.admits() and g.room() is None  # closed: DLQ writes go, no limit
    assert not g.admits()  # two of two dead-lettered: it trips, this one is held
    assert g.open and g.room() == 0 and g.held == 1
    assert isinstance(moved.args[-1][0], Transition)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(g.run_timer)
        assert await g.wait_room(trio.current_time() + 60)  # the cool-down, on the mock clock
        assert g.breaker.state is BreakerState.HALF_OPEN and g.room() == 1
        probe = delivery(1)
        g.issued(probe)
        assert g.room() == 0  # the probe is out
        g.answered(probe, Settled.ACCEPTED)
        assert g.closed and moved.args[-1][0].after is BreakerState.CLOSED
        nursery.cancel_scope.cancel()


async def test_breaker_gate_a_probe_without_an_answer_is_void() -> None:
    g = gate(Calls())
    g.admits()
    g.admits()  # tripped
    half_open = g.breaker.tick(10**12)  # the cool-down is long over
    assert half_open is not None
    g.transition(half_open)
    probe = delivery(1)
    g.issued(probe)
    assert g.room() == 0  # the probe is out
    g.retired(probe)
    assert g.breaker.state is BreakerState.HALF_OPEN and g.room() == 1


async def test_breaker_gate_counts_acceptances_within_a_bucket(
    autojump_clock: trio.testing.MockClock,
) -> None:
    g = gate(Calls())  # a 60 s window: buckets of 600 ms

    def finished() -> int:
        return g.breaker.status(int(trio.current_time() * 1000)).finished

    for offset in range(3):
        g.answered(delivery(offset), Settled.ACCEPTED)
    assert finished() == 0  # counted on the record's path, not yet in the window
    async with trio.open_nursery() as nursery:
        nursery.start_soon(g.run_timer)
        await trio.sleep(0.7)
        assert finished() == 3  # in the window within a bucket
        g.answered(delivery(3), Settled.ACCEPTED)  # wakes the timer, asleep with none to count
        await trio.sleep(0.7)
        assert finished() == 4
        nursery.cancel_scope.cancel()


async def test_breaker_gate_verdict_sees_every_acceptance() -> None:
    g = gate(Calls())  # trips past half of at least 2 finished
    for offset in range(3):
        g.answered(delivery(offset), Settled.ACCEPTED)
    # No timer ran: the acceptances go into the window before the verdict, so 2 dead-letters of 5
    # finished do not trip it (2 of 2 would).
    assert g.admits() and g.admits() and g.closed
    assert g.status()["finished"] == 5 and g.status()["dead_lettered"] == 2


async def test_breaker_gate_close_from_the_api() -> None:
    g = gate(Calls())
    assert g.close("test") is False  # closed already
    g.admits()
    g.admits()
    assert g.open and g.close("test") is True and g.closed
    assert g.status()["state"] == "closed"


# ----------------------------------------------------------------------------- DlqStep

DLQ = {"errors.deadletterqueue.topic.name": "dlq.t"}


def step(fail: Calls, **keys: Any) -> tuple[DlqStep, Counters]:
    cfg = config(**(DLQ | keys))
    counters = Counters()
    return DlqStep(cfg, Tracing("s", "g"), counters, None, fail), counters


async def dead_letter(s: DlqStep, sink: FakeSink) -> ArchiveOutcome:
    return await s.dead_letter(
        tracked(4),
        3,
        ArchiveReason.REJECTED,
        ErrorInfo("Boom", "it broke", None),
        consequence="stopping",
        sink=sink,
    )


async def test_dlq_step_writes_and_counts() -> None:
    fail = Calls()
    s, counters = step(fail)
    sink = FakeSink()
    assert await dead_letter(s, sink) is ArchiveOutcome.WRITTEN
    ((failed, topic),) = sink.written
    assert topic == "dlq.t" and failed.offset == 4 and failed.delivery_count == 3
    assert counters.dlq_written == 1 and counters.archived == {"rejected": 1}
    assert counters.dead_lettered == {("t", "rejected", "Boom", "dlq.t"): 1}
    assert fail.count == 0


async def test_dlq_step_watches_the_source_offsets_of_headers_only_records() -> None:
    """A headers-only DLQ record (no copy) is a pointer the payload watch follows; a copy is not."""
    s, counters = step(Calls())
    pointer = DlqRecord("dlq.t", 0, None, None, (), copied=False)
    copy = DlqRecord("dlq.t", 0, b"k", b"v", (), copied=True)
    assert await dead_letter(s, FakeSink(answer=copy)) is ArchiveOutcome.WRITTEN
    assert counters.headers_only_watched == 0
    assert await dead_letter(s, FakeSink(answer=pointer)) is ArchiveOutcome.WRITTEN
    assert counters.headers_only_watched == 1
    assert s.payload_watch.pointers.partitions() == [("t", 0)]
    s.payload_watch.update({("t", 0): 5})  # tracked(4): offset 4, now below the log start
    assert counters.source_deleted == {"t": 1} and counters.headers_only_watched == 0
    assert s.payload_watch.interval_s == 60.0  # errors.deadletterqueue.source.check.interval.ms


async def test_dlq_step_a_record_gone_to_another_owner_is_handed_over() -> None:
    s, counters = step(Calls())
    assert await dead_letter(s, FakeSink(answer=False)) is ArchiveOutcome.HANDED_OVER
    assert counters.dlq_written == 0


async def test_dlq_step_a_write_that_fails_for_good_stops_the_sidecar() -> None:
    fail = Calls()
    s, counters = step(fail)
    outcome = await dead_letter(s, FakeSink(error=DlqFatalError("no such topic")))
    assert outcome is ArchiveOutcome.FAILED and counters.dlq_failed == 1
    assert fail.args == [("no such topic",)]


async def test_dlq_step_without_tolerance_stops_and_writes_nothing() -> None:
    fail = Calls()
    s, _counters = step(fail, **{"errors.tolerance": "none"})
    sink = FakeSink()
    assert await dead_letter(s, sink) is ArchiveOutcome.STOPPED
    assert sink.written == [] and fail.count == 1
