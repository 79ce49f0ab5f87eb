"""The consumer-group engine's scheduler: when it looks at its ledgers, and what a turn does.

Owns `Scheduler` (a part of `ConsumerGroupEngine`, given flow control, the isolation step, the
sender, the write-ahead queue, the archiver and the committer) and its doorbell `Wakeup`: a turn
expires locks, acquires and hands out records, starts DLQ writes, applies flow control and asks for
horizon commits, on the partitions that changed; when a turn runs is told in `Scheduler`'s docstring.

Must not import the pipeline, the share engine, or confluent-kafka.
"""

from __future__ import annotations

import logging

import trio

from sidecar.config import Config
from sidecar.core import ledger as L
from sidecar.engines.consumer.flow import FlowControl
from sidecar.engines.consumer.handout import Sender, WriteAhead
from sidecar.engines.consumer.isolation import IsolationStep
from sidecar.engines.consumer.partitions import PartitionRef, Partitions, PartitionState, now_ms
from sidecar.engines.consumer.ports import ArchiveStart, CommitWanted, SourcePort
from sidecar.engines.interfaces import Outlet

log = logging.getLogger("sidecar.engine")

# `PartitionState.quiet_at` during a turn: the partition gave less than it was offered (see _turn_body).
_QUIET_CANDIDATE = -2


class Wakeup:
    """The scheduler's doorbell: every part that changes what a turn would do rings it (`kick`)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def kick(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        """Until a ring; the next `wait` waits for a new one."""
        try:
            await self._event.wait()
        finally:
            self._event = trio.Event()


class Scheduler:
    """The scheduler of :class:`~sidecar.engines.consumer.group.ConsumerGroupEngine` (see above).

    A turn expires locks, acquires records for the room the pipeline has (and hands them out), starts
    DLQ writes, applies flow control (pause/resume of fetching) and asks for horizon commits, on the
    partitions that changed since a turn last found nothing to do in them. A turn runs in the task
    whose event caused it, at the end of that event (`turn_now`): a poll's batches once they are all
    in the ledgers (`messages_taken`), the app answers of one wake-up of the app client's reader once
    they are all applied (the pipeline's `wake(now=True)` at the end of the row), so a record costs no
    wake-up of a task of its own; anything else rings the scheduler's :class:`Wakeup`, and its task,
    which also waits for the next deadline (a lock, a retry time), runs the turn.
    """

    def __init__(
        self,
        outlet: Outlet[PartitionRef],
        config: Config,
        source: SourcePort,
        partitions: Partitions,
        wakeup: Wakeup,
        flow: FlowControl,
        *,
        sender: Sender,
        write_ahead: WriteAhead | None,
        isolation: IsolationStep | None,
        archiver: ArchiveStart,
        committer: CommitWanted,
    ) -> None:
        self._outlet = outlet
        self._max_in_flight = config.delivery.max_in_flight_records
        self._source = source
        self._states = partitions.by_key
        self._partitions = partitions
        self._wakeup = wakeup
        self._flow = flow
        self._sender = sender
        self._write_ahead = write_ahead  # None: horizon mode
        self._isolation = isolation  # None: write-ahead mode
        self._archiver = archiver
        self._committer = committer
        # The scheduler's wait (None while it is not waiting), and whether a turn is running.
        self._schedule_scope: trio.CancelScope | None = None
        self._in_turn = False
        self._rr = 0

    def turn_now(self) -> None:
        """A scheduler turn in the caller's task, now, instead of a wake-up of the scheduler's
        (which would cost a trio task step for the same turn); the scheduler then waits for what
        the turn says. A ring when the scheduler is not waiting, or a turn is running."""
        scope = self._schedule_scope
        if scope is None or self._in_turn or self._outlet.room().stopping:
            self._wakeup.kick()
            return
        deadline = trio.current_time() + self._turn()
        # Only ever sooner: setting a cancel scope's deadline is dear, and a wait that ends
        # early costs one turn that finds nothing and waits again.
        if deadline < scope.deadline:  # noqa: PLR1730 (setting it always is the dear part)
            scope.deadline = deadline

    # ----------------------------------------------------------------------------- scheduler

    async def run(self) -> None:
        """Expire locks, acquire records, start DLQ writes, pause/resume — whenever something
        changed; and (write-ahead mode) the hand-out task that commits acquired records' counts
        and sends them."""
        async with trio.open_nursery() as nursery:
            if self._write_ahead is not None:
                nursery.start_soon(self._write_ahead.run)
            await self._schedule_loop()
            nursery.cancel_scope.cancel()

    async def _schedule_loop(self) -> None:
        # One cancel scope serves many turns: a turn moves its deadline (cheap) instead of
        # entering a scope of its own; a scope whose deadline came is replaced.
        outlet = self._outlet
        while not outlet.room().stopping:
            with trio.CancelScope() as scope:
                while not outlet.room().stopping:
                    scope.deadline = trio.current_time() + self._turn()
                    self._schedule_scope = scope
                    try:
                        await self._wakeup.wait()
                    finally:
                        self._schedule_scope = None

    def _turn(self) -> float:
        """One scheduler turn; returns how long to wait for a kick before the next (seconds)."""
        self._in_turn = True
        try:
            return self._turn_body()
        finally:
            self._in_turn = False

    def _turn_body(self) -> float:
        outlet = self._outlet
        max_total = self._max_in_flight
        now = now_ms()
        # A partition whose ledger has not changed since a turn found nothing to do in it,
        # and whose next deadline has not come, has nothing to do now either: the turn skips
        # it (its expiry, acquisition, archiving and horizon; see `PartitionLedger.changes`).
        # It is looked at again once it changes, a deadline comes, or a turn does not offer
        # it room to acquire.
        busy = [
            state
            for state in self._states.values()
            if state.quiet_at != state.ledger.changes
            or (state.quiet_due is not None and now >= state.quiet_due)
        ]
        for state in busy:
            state.quiet_at = -1
            for expired in state.ledger.expire(now):
                self._outlet.lock_expired(
                    state.ledger.topic, state.untrack(expired.attempt_id), "lock_expired"
                )
                if state.revoking:
                    self._partitions.progressed()
        acquired: list[tuple[PartitionState, L.Attempt]] = []
        may_acquire = False  # every partition was offered room: no retry time is pending
        isolation = self._isolation
        exclusive = isolation is not None and isolation.step(now)
        if exclusive:
            pass  # an isolated delivery goes alone in the whole process: no acquire anywhere
        elif (room := outlet.room()).app_reachable and not room.draining and room.dlq_ready:
            # Acquire no more than the open requests can take right away: an acquired record's
            # attempt is counted (and persisted) before it is sent, so one that waited in a
            # queue while the process crashed would be charged an attempt it never had.
            # Records acquired while the write-ahead commit of the previous round is under
            # way wait for the next one (group commit), within the same capacity: a record
            # never waits in a queue after its count is stored, and with one in flight an
            # answer is committed before the next record leaves (a crash on that record
            # does not charge the one before it).
            waiting = 0 if self._write_ahead is None else self._write_ahead.waiting()
            budget = min(max_total - room.in_flight - waiting, room.send_room - waiting)
            if (breaker_room := room.breaker_room) is not None:
                # The DLQ circuit breaker: none, or one probe (an acquired record waiting
                # for its write-ahead commit is not issued yet, but it is the probe).
                budget = min(budget, breaker_room - waiting)
            states = busy
            if states:
                # Rotate the starting partition so a busy one cannot starve the others.
                self._rr = (self._rr + 1) % len(states)
                states = states[self._rr :] + states[: self._rr]
            for state in states:
                if budget <= 0:
                    break
                if state.revoking:
                    continue
                got = state.ledger.acquire(now, budget)
                budget -= len(got)
                acquired.extend((state, a) for a in got)
                if budget > 0:
                    # It gave less than it was offered: nothing more to acquire until it
                    # changes or its next deadline (a lock, a retry time) comes.
                    state.quiet_at = _QUIET_CANDIDATE
            may_acquire = budget > 0
        if self._write_ahead is not None and (acquired or outlet.room().in_flight):
            # Write-ahead commits are on the records' path: keep the poll thread's
            # consume() timeouts short while records flow.
            self._source.mark_busy()
        if acquired:
            if self._write_ahead is not None:
                self._write_ahead.add(acquired)
            else:
                self._sender.hand_out(acquired)
        self._archiver.start(busy)
        self._flow.apply(busy)
        if self._write_ahead is None:
            wanted = [s for s in busy if s.ledger.horizon_wanted() is not None]
            for state in wanted:
                state.quiet_at = -1  # a commit is wanted: asked again next turn
            if wanted:
                self._committer.want_commit()
                if any(s.ledger.horizon_status().held for s in wanted):
                    # The horizon commit fell behind the hand-outs (near saturation): records
                    # wait on it, so queued commits must not wait out a blocking poll.
                    self._source.mark_busy()
        if isolation is not None and not exclusive:
            for state in busy:
                if state.suspect_top is not None and state.ledger.wants_isolation:
                    # A suspect fell due in this turn's acquire (a tier record restored with its
                    # due time): the isolation step takes it at once, not at the next deadline.
                    return 0.0
        for state in busy:
            if state.quiet_at == _QUIET_CANDIDATE:
                ledger = state.ledger
                state.quiet_at = ledger.changes
                state.quiet_due = ledger.next_deadline_ms()
                state.quiet_lock_due = ledger.next_lock_deadline_ms()
        return self._next_wait_s(now_ms(), may_acquire)

    def _next_wait_s(self, now: int, may_acquire: bool) -> float:
        # A retry time that has come only matters when a record could be acquired now: with no
        # room (every send state taken or waiting for its commit), intake paused (app down,
        # draining) or the partition being revoked, waking for it would spin until that changes,
        # and every change of that kind kicks the scheduler anyway. Lock expiry always matters.
        deadlines = [
            d
            for s in self._states.values()
            if (
                d := (
                    (s.quiet_due if may_acquire else s.quiet_lock_due)
                    if s.quiet_at == s.ledger.changes
                    else s.ledger.next_deadline_ms()
                    if may_acquire and not s.revoking
                    else s.ledger.next_lock_deadline_ms()
                )
            )
            is not None
        ]
        # Every change that matters kicks the scheduler; the cap is only a safety net.
        cap_s = 0.5 if self._write_ahead is not None else 5.0
        if not deadlines:
            return cap_s
        return min(cap_s, max(0.0, (min(deadlines) - now) / 1000))


__all__ = ["Scheduler", "Wakeup"]
