"""The consumer engine's parts, each built alone from fakes (no broker, no app): what each owns.

Partitions, Sender, WriteAhead, Archiver, IsolationStep, Committer, FlowControl and Scheduler take
the outlet, the source and the DLQ sink as narrow interfaces (`sidecar.engines.consumer.ports`);
the fakes (`fakes.py`) record what they were asked. The ledgers are real: they are pure.
"""

from __future__ import annotations

import time

import trio
import trio.testing

from sidecar.core import ledger as L
from sidecar.core.budget import split_budget
from sidecar.core.deadletter import ArchiveOutcome
from sidecar.core.errors import CommitFailed
from sidecar.core.outcome import Ack
from sidecar.engines.consumer.archive import Archiver
from sidecar.engines.consumer.commits import Committer
from sidecar.engines.consumer.flow import FlowControl
from sidecar.engines.consumer.handout import Sender, WriteAhead
from sidecar.engines.consumer.isolation import IsolationStep
from sidecar.engines.consumer.partitions import Partitions, PartitionState, now_ms
from sidecar.engines.consumer.scheduler import Scheduler, Wakeup
from sidecar.engines.interfaces import Counters
from sidecar.kafka.source import AssignedPartition
from tests.unit.engines.fakes import (
    Calls,
    FakeOutlet,
    FakeSink,
    FakeSource,
    config,
    fill,
    tracked,
)

KEY = ("t", 0)
WRITE_AHEAD = L.LedgerConfig()
HORIZON = L.LedgerConfig(crash_accounting=L.CrashAccounting.HORIZON)


def partitions(
    outlet: FakeOutlet, ledger_config: L.LedgerConfig = WRITE_AHEAD, *, horizon: bool = False
) -> Partitions:
    return Partitions(outlet, ledger_config, horizon=horizon, max_buffered_records=100)


def acquired(state: PartitionState, n: int) -> list[tuple[PartitionState, L.Attempt]]:
    return [(state, a) for a in state.ledger.acquire(now_ms(), n)]


# ----------------------------------------------------------------------------- Partitions


async def test_partitions_open_fence_and_forget() -> None:
    outlet = FakeOutlet()
    parts = partitions(outlet)
    state = parts.open(KEY, 7, None)
    assert parts.owned(state) and state.ledger.committable_offset() == 7
    fill(state.ledger, range(7, 9))
    sender = Sender(outlet, parts)
    sender.hand_out(acquired(state, 2))
    assert len(state.live) == 2
    assert parts.pop(KEY) is state
    assert not parts.owned(state) and state.ledger.revoked
    assert outlet.retired == outlet.sent and not state.live  # its live deliveries fenced
    assert parts.pop(KEY) is None


def test_partitions_open_a_pending_one_at_its_first_record() -> None:
    parts = partitions(FakeOutlet())
    assert parts.open_pending(KEY, 3) is None  # not assigned: fetched before a revoke
    parts.assigned_without_offset(AssignedPartition("t", 0, None, None))
    state = parts.open_pending(KEY, 3)
    assert state is not None and state.ledger.committable_offset() == 3
    assert parts.open_pending(KEY, 4) is None  # opened once


async def test_partitions_a_revoke_waits_for_progress() -> None:
    parts = partitions(FakeOutlet())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(parts.wait_progress)
        await trio.testing.wait_all_tasks_blocked()
        parts.progressed()
    # The nursery closed: the wait ended on the progress.


# ----------------------------------------------------------------------------- Sender


async def test_sender_issues_and_sends_owned_records_and_gives_back_unsent() -> None:
    outlet = FakeOutlet()
    parts = partitions(outlet)
    state = parts.open(KEY, 0, None)
    fill(state.ledger, range(3))
    sender = Sender(outlet, parts)
    batch = acquired(state, 3)
    sender.hand_out(batch[:2])
    assert [d.tracked.record.offset for d in outlet.sent] == [0, 1]
    assert set(state.live) == {a.attempt_id for _, a in batch[:2]}
    assert all(d.lock_deadline is not None for d in outlet.sent)
    sender.return_unsent(batch[2:])
    assert state.ledger.in_flight == 2  # the unsent one is AVAILABLE again, uncounted
    again = state.ledger.acquire(now_ms(), 5)
    assert [a.offset for a in again] == [2] and again[0].delivery_count == 1


async def test_sender_skips_a_revoked_partition() -> None:
    outlet = FakeOutlet()
    parts = partitions(outlet)
    state = parts.open(KEY, 0, None)
    fill(state.ledger, range(1))
    batch = acquired(state, 1)
    parts.pop(KEY)
    Sender(outlet, parts).hand_out(batch)
    assert outlet.issued == [] and outlet.sent == []


# ----------------------------------------------------------------------------- WriteAhead


async def test_write_ahead_sends_after_the_commit_and_gives_back_on_failure() -> None:
    outlet = FakeOutlet()
    parts = partitions(outlet)
    state = parts.open(KEY, 0, None)
    fill(state.ledger, range(4))
    committed: list[list[PartitionState]] = []
    ok = [True]

    async def commit(states: list[PartitionState]) -> bool:
        committed.append(list(states))
        return ok[0]

    kick = Calls()
    wa = WriteAhead(Sender(outlet, parts), commit, kick)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(wa.run)
        wa.add(acquired(state, 2))
        assert wa.waiting() == 2 and outlet.sent == []  # nothing leaves before its commit
        await trio.testing.wait_all_tasks_blocked()
        assert committed == [[state]] and len(outlet.sent) == 2 and kick.count == 1
        ok[0] = False
        wa.add(acquired(state, 2))
        await trio.testing.wait_all_tasks_blocked()
        assert len(outlet.sent) == 2 and state.ledger.in_flight == 2  # given back, uncounted
        nursery.cancel_scope.cancel()


def test_write_ahead_gives_back_a_revoked_partitions_records() -> None:
    outlet = FakeOutlet()
    parts = partitions(outlet)
    state = parts.open(KEY, 0, None)
    fill(state.ledger, range(2))

    async def commit(_states: list[PartitionState]) -> bool:
        raise AssertionError("not reached")

    wa = WriteAhead(Sender(outlet, parts), commit, Calls())
    wa.add(acquired(state, 2))
    wa.give_back([state])
    assert wa.waiting() == 0 and state.ledger.in_flight == 0


# ----------------------------------------------------------------------------- Archiver


def rejected(state: PartitionState, offset: int = 0) -> None:
    fill(state.ledger, range(offset, offset + 1))
    (attempt,) = state.ledger.acquire(now_ms(), 1)
    state.ledger.answer(attempt.attempt_id, Ack.REJECT, now_ms())


async def test_archiver_writes_and_tells_the_ledger() -> None:
    outlet = FakeOutlet()
    parts = partitions(outlet)
    state = parts.open(KEY, 0, None)
    rejected(state)
    sink, kick = FakeSink(), Calls()
    archiver = Archiver(outlet, sink, None, parts, None, kick, transactional=False)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(archiver.run)
        archiver.start([state])
        assert state.dlq_writes == 1
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert [d.tracked.record.offset for d in outlet.dead] == [0] and outlet.dead[0].sink is sink
    assert state.dlq_writes == 0 and state.ledger.committable_offset() == 1  # done
    assert kick.count == 1


async def test_archiver_keeps_what_the_breaker_held_until_released() -> None:
    outlet = FakeOutlet(outcome=ArchiveOutcome.HELD)
    parts = partitions(outlet)
    state = parts.open(KEY, 0, None)
    rejected(state)
    archiver = Archiver(outlet, FakeSink(), None, parts, None, Calls(), transactional=False)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(archiver.run)
        archiver.start([state])
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert state.held == [0] and state.ledger.committable_offset() == 0  # not done
    archiver.release_held()
    assert state.held == [] and [a.offset for a in state.ledger.acquire(now_ms(), 1)] == [0]


# ----------------------------------------------------------------------------- IsolationStep


def restored_with_suspects(outlet: FakeOutlet) -> tuple[Partitions, PartitionState]:
    """A partition whose previous owner handed out three records and died (horizon mode)."""
    before = L.PartitionLedger("t", 0, 0, HORIZON)
    fill(before, range(10))
    before.acquire(now_ms(), 3)
    point = before.commit_point()
    parts = partitions(outlet, HORIZON, horizon=True)
    state = parts.open(KEY, point.offset, point.metadata)
    fill(state.ledger, range(10))
    return parts, state


def test_isolation_isolates_one_suspect_with_nothing_in_flight() -> None:
    outlet = FakeOutlet()
    parts, state = restored_with_suspects(outlet)
    assert state.suspect_top is not None
    source = FakeSource()
    want = Calls()
    committer = type("C", (), {"want_commit": want})()
    step = IsolationStep(outlet, source, parts, committer)  # type: ignore[arg-type]
    assert step.step(now_ms()) is True  # no acquisition anywhere meanwhile
    assert state.in_pass and want.count == 1 and source.busy_marks == 1
    assert state.ledger.horizon_status().isolation is L.IsolationPhase.CHARGED
    assert step.step(now_ms()) is True and want.count == 1  # one at a time


def test_isolation_waits_while_anything_is_in_flight() -> None:
    outlet = FakeOutlet(room_now=FakeOutlet().room_now._replace(in_flight=1))
    parts, state = restored_with_suspects(outlet)
    committer = type("C", (), {"want_commit": Calls()})()
    step = IsolationStep(outlet, FakeSource(), parts, committer)  # type: ignore[arg-type]
    assert step.step(now_ms()) is True
    assert state.ledger.horizon_status().isolation is not L.IsolationPhase.CHARGED


def test_isolation_without_suspects_does_nothing() -> None:
    outlet = FakeOutlet()
    parts = partitions(outlet, HORIZON, horizon=True)
    state = parts.open(KEY, 0, None)
    committer = type("C", (), {"want_commit": Calls()})()
    step = IsolationStep(outlet, FakeSource(), parts, committer)  # type: ignore[arg-type]
    assert step.step(now_ms()) is False and not state.in_pass


# ----------------------------------------------------------------------------- Committer


def committer(
    outlet: FakeOutlet, parts: Partitions, source: FakeSource, counters: Counters
) -> Committer:
    return Committer(
        outlet,
        config(),
        counters,
        None,  # type: ignore[arg-type]  # no DLQ transactions here
        source,  # type: ignore[arg-type]
        parts,
        Sender(outlet, parts),
        Calls(),
        horizon=False,
    )


async def test_committer_commits_the_ledgers_state_and_remembers_it() -> None:
    outlet, source, counters = FakeOutlet(), FakeSource(), Counters()
    parts = partitions(outlet)
    state = parts.open(KEY, 0, None)
    fill(state.ledger, range(3))
    acquired(state, 2)  # write-ahead: their counts go into the metadata
    c = committer(outlet, parts, source, counters)
    assert await c.commit_now([state]) is True
    (offsets,) = source.commits
    assert [(o.topic, o.partition, o.offset) for o in offsets] == [("t", 0, 0)]
    assert offsets[0].metadata == state.ledger.encode_metadata()
    assert state.last_commit == (0, offsets[0].metadata) and counters.commits == 1
    assert c.failing_since is None


async def test_committer_counts_a_failed_commit_and_retries_later() -> None:
    outlet, source, counters = FakeOutlet(), FakeSource(), Counters()
    parts = partitions(outlet)
    state = parts.open(KEY, 0, None)
    source.commit_error = CommitFailed("the coordinator moved")
    c = committer(outlet, parts, source, counters)
    assert await c.commit_now([state]) is False
    assert counters.commit_failures == 1 and c.failing_since is not None
    assert state.last_commit is None
    source.commit_error = None
    assert await c.commit_now([state]) is True and c.failing_since is None


# ----------------------------------------------------------------------------- Scheduler


def flow(outlet: FakeOutlet, parts: Partitions, source: FakeSource) -> FlowControl:
    cfg = config()
    budget = split_budget(cfg.delivery.max_buffered_bytes, cfg.kafka)
    return FlowControl(outlet, source, parts, budget, WRITE_AHEAD, Counters())


def scheduler(
    outlet: FakeOutlet, parts: Partitions, source: FakeSource, sender: Sender
) -> Scheduler:
    archiver = type("A", (), {"start": lambda self, states: None})()
    committer = type("C", (), {"want_commit": lambda self: None})()
    return Scheduler(
        outlet,
        config(),
        source,
        parts,
        Wakeup(),
        flow(outlet, parts, source),
        sender=sender,
        write_ahead=None,
        isolation=None,
        archiver=archiver,
        committer=committer,
    )


async def test_scheduler_hands_out_within_the_room_the_pipeline_leaves() -> None:
    outlet = FakeOutlet(room_now=FakeOutlet().room_now._replace(send_room=3))
    parts = partitions(outlet)
    state = parts.open(KEY, 0, None)
    fill(state.ledger, range(5))
    source = FakeSource(assigned={KEY})
    sched = scheduler(outlet, parts, source, Sender(outlet, parts))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sched.run)
        await trio.testing.wait_all_tasks_blocked()
        assert [d.tracked.record.offset for d in outlet.sent] == [0, 1, 2]
        assert state.quiet_at == -1  # it gave what it was offered: looked at again
        nursery.cancel_scope.cancel()


def test_a_suspect_falling_due_is_isolated_at_once_not_at_the_next_deadline() -> None:
    """A restored suspect held for its due time (a retry tier's record) is released from its
    backoff by a turn's acquire: that turn asks for the next one at once, where the isolation step
    charges it (it used to wait for the scheduler's 5 s safety net)."""
    outlet = FakeOutlet()
    before = L.PartitionLedger("t", 0, 0, HORIZON)
    fill(before, range(3))
    before.acquire(now_ms(), 3)
    point = before.commit_point()  # the previous owner handed out 0..2 and died
    parts = partitions(outlet, HORIZON, horizon=True)
    state = parts.open(KEY, point.offset, point.metadata)
    due = now_ms() + 1000  # room for a slow first turn on a loaded machine
    for offset in range(3):
        rec = tracked(offset, "t", 0)
        state.ledger.add(offset, None, rec, now_ms(), base_count=1, not_before_ms=due)
    source = FakeSource(assigned={KEY})
    committer = type("C", (), {"want_commit": Calls()})()
    sched = Scheduler(
        outlet,
        config(),
        source,
        parts,
        Wakeup(),
        flow(outlet, parts, source),
        sender=Sender(outlet, parts),
        write_ahead=None,
        isolation=IsolationStep(outlet, source, parts, committer),  # type: ignore[arg-type]
        archiver=type("A", (), {"start": lambda self, states: None})(),
        committer=committer,
    )
    assert sched._turn() > 0  # not due: the suspects wait (WAITING), nothing to isolate
    while now_ms() < due:
        time.sleep(0.005)
    assert sched._turn() == 0.0  # they fell due in this turn's acquire: turn again now
    sched._turn()
    assert state.ledger.horizon_status().isolation is L.IsolationPhase.CHARGED


def test_flow_control_pauses_every_partition_while_the_app_is_away() -> None:
    outlet = FakeOutlet(room_now=FakeOutlet().room_now._replace(app_reachable=False))
    parts = partitions(outlet)
    for p in range(3):
        parts.open(("t", p), 0, None)
    source = FakeSource(assigned={("t", p) for p in range(3)})
    fc = flow(outlet, parts, source)
    fc.apply()
    assert source.paused == {("t", 0), ("t", 1), ("t", 2)}
    outlet.room_now = outlet.room_now._replace(app_reachable=True)
    fc.apply()
    assert source.paused == set()


def test_flow_control_pauses_a_full_partition_and_resumes_it_at_half() -> None:
    outlet = FakeOutlet()
    small = L.LedgerConfig(max_buffered_records=4)
    parts = partitions(outlet, small)
    state = parts.open(KEY, 0, None)
    source = FakeSource(assigned={KEY})
    cfg = config()
    budget = split_budget(cfg.delivery.max_buffered_bytes, cfg.kafka)
    fc = FlowControl(outlet, source, parts, budget, small, Counters())
    fill(state.ledger, range(4))
    fc.apply([state])
    assert source.paused == {KEY} and state.flow_seen is None  # decided: looked at again
    for a in state.ledger.acquire(now_ms(), 4):
        state.ledger.answer(a.attempt_id, Ack.ACCEPT, now_ms())
    fc.apply([state])
    assert source.paused == set()
