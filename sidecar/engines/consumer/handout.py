"""The consumer-group engine's hand-out: an acquired record becomes a delivery sent to the app.

Owns two parts of `ConsumerGroupEngine`: `Sender` (issues and sends a delivery for each acquired
record whose partition is still owned, or gives unsent records back uncounted) and `WriteAhead`
(write-ahead mode: acquired records wait for their counts' group commit, then go to the sender).

Must not import the pipeline, the share engine, or confluent-kafka.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import cast

import trio

from sidecar.core import ledger as L
from sidecar.core.record import Tracked
from sidecar.engines.consumer.partitions import PartitionRef, Partitions, PartitionState, now_ms
from sidecar.engines.interfaces import Outlet


class Sender:
    """Issues and sends acquired records."""

    def __init__(self, outlet: Outlet[PartitionRef], partitions: Partitions) -> None:
        self._outlet = outlet
        self._partitions = partitions

    def hand_out(self, acquired: list[tuple[PartitionState, L.Attempt]]) -> None:
        outlet, owned = self._outlet, self._partitions.owned
        # A lock deadline in trio time: the ledger's (monotonic ms) moved onto trio's clock.
        offset_s = trio.current_time() - now_ms() / 1000
        for state, attempt in acquired:
            if not owned(state):
                continue  # revoked while the commit was in flight: fenced
            tracked = cast(Tracked, attempt.item)
            delivery = outlet.issue(
                tracked,
                attempt.delivery_count,
                (state, attempt),
                lock_deadline=offset_s + attempt.lock_deadline_ms / 1000,
            )
            state.track(attempt.attempt_id, delivery)
            outlet.send(delivery)

    def return_unsent(self, batch: list[tuple[PartitionState, L.Attempt]]) -> None:
        """Acquired records that will not be sent go back without counting the attempt."""
        now = now_ms()
        for state, attempt in batch:
            if self._partitions.owned(state):
                with contextlib.suppress(L.LedgerError):
                    state.ledger.not_attempted(attempt.attempt_id, now)


class WriteAhead:
    """Write-ahead mode: acquired records wait for the commit of their delivery counts.

    Group commit: everything acquired while one write-ahead commit is in flight goes out with the
    next one, so records leave only after their count is stored (a record that crashes the
    sidecar, or the pod, on delivery still has its attempt counted) while the commit's round trip
    overlaps the app's work instead of stalling the scheduler.
    """

    def __init__(
        self,
        sender: Sender,
        commit: Callable[[Sequence[PartitionState]], Awaitable[bool]],
        kick: Callable[[], None],
    ) -> None:
        """`commit` commits the states' state now, whether or not it changed (the committer's
        `commit_now`); `kick` rings the scheduler."""
        self._sender = sender
        self._commit = commit
        self._kick = kick
        self._awaiting: list[tuple[PartitionState, L.Attempt]] = []
        self._wake = trio.Event()

    def add(self, acquired: list[tuple[PartitionState, L.Attempt]]) -> None:
        self._awaiting.extend(acquired)
        self._wake.set()

    def waiting(self) -> int:
        return len(self._awaiting)

    def give_back(self, states: list[PartitionState]) -> None:
        """A revoke: the records of `states` not sent yet go back uncounted rather than into the
        commit for the next owner."""
        if not self._awaiting or not states:
            return
        gone = {id(s) for s in states}
        self._sender.return_unsent([(s, a) for s, a in self._awaiting if id(s) in gone])
        self._awaiting = [(s, a) for s, a in self._awaiting if id(s) not in gone]

    def give_back_all(self) -> None:
        """Stopping: records still waiting for their write-ahead commit were never sent."""
        batch, self._awaiting = self._awaiting, []
        self._sender.return_unsent(batch)

    async def run(self) -> None:
        """Commit the delivery counts of acquired records, then hand them to the sender."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            batch, self._awaiting = self._awaiting, []
            if not batch:
                continue
            touched = {id(s): s for s, _ in batch}
            ok = await self._commit(list(touched.values()))
            if not ok:
                self._sender.return_unsent(batch)
                self._kick()
                await trio.sleep(0.1)
                continue
            self._sender.hand_out(batch)
            self._kick()


__all__ = ["Sender", "WriteAhead"]
