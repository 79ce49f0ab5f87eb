"""The consumer-group engine's archiver: records the ledger archives go to the DLQ step, one task each.

Owns `Archiver` (a part of `ConsumerGroupEngine`): the nursery of its archive tasks (each: the
outlet's `dead_letter`, then the DLQ writer or the committer's transaction, then the ledger) and
what the DLQ circuit breaker held (`PartitionState.held`, released by `release_held`).

Must not import the pipeline, the share engine, or confluent-kafka.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import cast

import trio

from sidecar.core import ledger as L
from sidecar.core.deadletter import ArchiveOutcome
from sidecar.core.outcome import ArchiveReason
from sidecar.core.record import Tracked
from sidecar.engines.consumer.partitions import PartitionRef, Partitions, PartitionState, now_ms
from sidecar.engines.consumer.ports import Transactions
from sidecar.engines.interfaces import DlqSink, Outlet, TierWriter


class Archiver:
    """Archive tasks of :class:`~sidecar.engines.consumer.group.ConsumerGroupEngine` (see above)."""

    def __init__(
        self,
        outlet: Outlet[PartitionRef],
        dlq: DlqSink,
        tiers: TierWriter,
        partitions: Partitions,
        committer: Transactions,
        kick: Callable[[], None],
        *,
        transactional: bool,
    ) -> None:
        self._outlet = outlet
        self._dlq = dlq
        self._tiers = tiers
        self._partitions = partitions
        self._committer = committer
        self._kick = kick
        self._transactional = transactional
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The archive tasks' nursery, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def start(self, states: Sequence[PartitionState]) -> None:
        """A task for each record the states' ledgers have to archive."""
        nursery = self._nursery
        assert nursery is not None
        for state in states:
            for req in state.ledger.to_archive():
                state.dlq_writes += 1
                nursery.start_soon(self._archive_counted, state, req)

    def release_held(self) -> None:
        """The DLQ circuit breaker is half-open or closed: what it held is AVAILABLE again."""
        now = now_ms()
        for state in self._partitions.by_key.values():
            for offset in state.held:
                with contextlib.suppress(L.LedgerError):
                    state.ledger.dlq_withheld(offset, now)
            state.held.clear()
        self._kick()

    async def _archive_counted(self, state: PartitionState, req: L.ArchiveRequest) -> None:
        try:
            await self._archive(state, req)
        finally:
            state.dlq_writes -= 1
            self._partitions.progressed()

    async def _archive(self, state: PartitionState, req: L.ArchiveRequest) -> None:
        # Transactional: the committer marks the record done inside the transaction that commits
        # its offset; otherwise the DLQ writer writes it and the ledger is told here.
        # A long release (reason RETRY_TIER) takes the same path to its retry tier's topic.
        sink = self._committer.transaction(state, req.offset) if self._transactional else self._dlq
        if req.reason is ArchiveReason.RETRY_TIER:
            outcome = await self._tiers.write(
                cast(Tracked, req.item), req.delivery_count, req.delay_ms, req.error, sink=sink
            )
        else:
            outcome = await self._outlet.dead_letter(
                cast(Tracked, req.item),
                req.delivery_count,
                req.reason,
                req.error,
                consequence="stopping with its offset uncommitted",
                sink=sink,
            )
        owned = self._partitions.owned(state)
        marked_in_txn = self._transactional and outcome is ArchiveOutcome.WRITTEN
        if outcome.done and not marked_in_txn and owned:
            state.ledger.dlq_written(req.offset)
        elif outcome is ArchiveOutcome.HELD and owned:
            state.held.append(req.offset)  # not done: nothing is committed past it
        self._kick()


__all__ = ["Archiver"]
