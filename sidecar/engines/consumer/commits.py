"""The consumer-group engine's offset commits and transactional DLQ batches.

Owns `Committer` (a part of `ConsumerGroupEngine`): the commit points of a set of partitions, one
commit at a time under its guard, the periodic and wanted commits (`run`), a stop's final commit
(`commit_all`), `failing_since`, and with `errors.deadletterqueue.transactional.enable` the DLQ
records committed with their offsets in one Kafka transaction (`run_transactions`).

Must not import the pipeline, the share engine, or confluent-kafka.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence

import trio

from sidecar.config import Config
from sidecar.core import ledger as L
from sidecar.core.deadletter import FailedRecord
from sidecar.core.errors import CommitFailed
from sidecar.engines.consumer.handout import Sender
from sidecar.engines.consumer.partitions import (
    PartitionRef,
    Partitions,
    PartitionState,
    PendingCommit,
    TxnItem,
    now_ms,
)
from sidecar.engines.consumer.ports import CommitPort, TxnPort
from sidecar.engines.interfaces import Counters, DlqSink, Outlet
from sidecar.kafka.dlq import DlqFatalError, DlqTxnAbortable
from sidecar.kafka.source import OffsetToCommit

log = logging.getLogger("sidecar.engine")

# A batch of DLQ records whose transaction is aborted for a retriable reason (a broker restart, a
# rebalance, a stuck producer replaced) is redone; one not committed within this time stops the sidecar
# (exit 1) instead of wedging it.
TXN_COMMIT_DEADLINE_S = 120.0


class Committer:
    """Commits and DLQ transactions of :class:`~sidecar.engines.consumer.group.ConsumerGroupEngine`."""

    def __init__(
        self,
        outlet: Outlet[PartitionRef],
        config: Config,
        counters: Counters,
        dlq: TxnPort,
        source: CommitPort,
        partitions: Partitions,
        sender: Sender,
        kick: Callable[[], None],
        *,
        horizon: bool,
    ) -> None:
        self._outlet = outlet
        self._config = config
        self._counters = counters
        self._dlq = dlq
        self._source = source
        self._partitions = partitions
        self._states = partitions.by_key
        self._sender = sender
        self._kick = kick
        self._horizon = horizon
        self._commit_guard = trio.Lock()
        # Horizon mode: a partition wants a commit (its horizon, or an isolated record's count).
        self._wake = trio.Event()
        # Since when every commit has failed (None: the last one succeeded). No commit means no
        # hand-out: write-ahead delivery counts must be stored first.
        self.failing_since: float | None = None
        self._txn_items: list[TxnItem] = []
        self._txn_wake = trio.Event()

    def want_commit(self) -> None:
        """A partition wants a commit (its horizon, an isolated record's count or outcome)."""
        self._wake.set()

    # ----------------------------------------------------------------------------- transactions

    def transaction(self, state: PartitionState, offset: int) -> DlqSink:
        """Where the DLQ step writes the record at `offset` of `state` (transactional mode): into
        the next transaction, which commits its offset too (`txn_write`)."""
        return _TxnSink(self, state, offset)

    async def txn_write(
        self, state: PartitionState, offset: int, failed: FailedRecord, dlq_topic: str
    ) -> object:
        """The DLQ record once written and committed; False when the partition went to another owner
        first."""
        item = TxnItem(state, offset, failed, dlq_topic)
        self._txn_items.append(item)
        self._txn_wake.set()
        await item.done.wait()
        if item.error is not None:
            raise DlqFatalError(item.error)
        if item.skipped:
            return False
        return item.record if item.record is not None else True

    async def run_transactions(self) -> None:
        """Transactional mode: batches of DLQ records and the offset commit, atomically.

        Commits are serialised with the regular ones (`_commit_guard`): a plain commit may never
        move an offset past a record whose DLQ write is in a transaction not yet committed.
        """
        while True:
            await self._txn_wake.wait()
            self._txn_wake = trio.Event()
            items, self._txn_items = self._txn_items, []
            if not items:
                continue
            error = await self._txn_once(items)
            for it in items:
                it.error = None if it.skipped else error
                it.done.set()
            self._kick()

    async def _txn_once(self, items: list[TxnItem]) -> str | None:
        """Commit `items` in one transaction, redoing it until it commits; None, or why it cannot.

        Sets `skipped` on the items left out because their partition went to another owner: the
        next owner archives those (writing their DLQ record here too would duplicate it there).
        """
        async with self._commit_guard:
            give_up_at = trio.current_time() + TXN_COMMIT_DEADLINE_S
            marked: set[int] = set()  # ids of the items the ledger already counts as done
            delay_s = 0.5
            while True:
                batch = [it for it in items if self._partitions.owned(it.state)]
                try:
                    if batch:
                        await self._txn_attempt(batch, marked)
                    for it in items:
                        it.skipped = it not in batch
                    return None
                except DlqTxnAbortable as exc:
                    reason = str(exc)
                    try:
                        await self._dlq.txn_abort()
                    except DlqFatalError as abort_exc:
                        return await self._txn_fatal(items, marked, str(abort_exc))
                except DlqFatalError as exc:
                    return await self._txn_fatal(items, marked, str(exc))
                # One batch's dispatch boundary (allowed here, see sidecar.core.errors): stop the
                # sidecar with the reason, never crash the transaction loop.
                except Exception as exc:
                    return await self._txn_fatal(items, marked, f"DLQ transaction failed: {exc!r}")
                if trio.current_time() + delay_s > give_up_at:
                    return await self._txn_fatal(
                        items,
                        marked,
                        f"the DLQ transaction did not commit within {TXN_COMMIT_DEADLINE_S:.0f} s "
                        f"(last: {reason})",
                    )
                log.warning("DLQ transaction aborted (%s); redoing it in %.1f s", reason, delay_s)
                await trio.sleep(delay_s)
                delay_s = min(delay_s * 2, 5.0)

    async def _txn_attempt(self, batch: list[TxnItem], marked: set[int]) -> None:
        """One transaction: the DLQ records of `batch`, then the offsets of their partitions.

        The ledger must count a record done before its offset can be committed, and cannot take that
        back: an aborted attempt is redone (under the commit guard, so no plain commit passes the
        records meanwhile) with the same records, so the redone transaction commits what the ledger
        already says.
        """
        await self._dlq.txn_begin()
        await self._txn_produce_all(batch)
        if not all(self._partitions.owned(it.state) for it in batch):
            # Revoked or lost while the records were written: without the partition's offset in the
            # transaction, its DLQ record would be committed and written again by the next owner.
            raise DlqTxnAbortable("a partition went to another owner during the transaction")
        states: dict[int, PartitionState] = {}
        for it in batch:
            if id(it) not in marked:
                it.state.ledger.dlq_written(it.offset)
                it.state.txn_uncommitted = True
                marked.add(id(it))
            states[id(it.state)] = it.state
        pending = self._commit_offsets(list(states.values()), force=True)
        offsets = [o for _, o, _ in pending]
        await self._dlq.txn_commit(offsets, self._source.group_metadata())
        for sl in states.values():
            sl.txn_uncommitted = False
        self._confirmed(pending)
        self._counters.committed(
            partitions=len(offsets), metadata_bytes=sum(len(o.metadata) for o in offsets)
        )

    async def _txn_produce_all(self, batch: list[TxnItem]) -> None:
        """Produce the batch's DLQ records at once and wait for every acknowledgement.

        Not one at a time: each record would wait out the producer's linger and a round trip, and
        the transaction (which holds the commit guard, so every write-ahead commit waits) with it.
        The first fatal error wins over an abortable one.
        """
        errors: list[DlqFatalError | DlqTxnAbortable] = []

        async def one(it: TxnItem) -> None:
            try:
                it.record = await self._dlq.txn_produce(it.failed, it.dlq_topic)
            except (DlqFatalError, DlqTxnAbortable) as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            for it in batch:
                nursery.start_soon(one, it)
        fatal = [e for e in errors if isinstance(e, DlqFatalError)]
        if fatal or errors:
            raise (fatal or errors)[0]

    async def _txn_fatal(self, items: list[TxnItem], marked: set[int], reason: str) -> str:
        """Stop: drop the partitions whose ledger counts records of an uncommitted transaction done,
        so no commit (the final one, the revoke's) passes them; the next owner reads them again.

        The open transaction is ended first if it can be (an abort, or fencing by a new producer),
        so its offsets do not stay pending (unreadable to read_committed offset fetches) until the
        transaction times out or the next incarnation starts.
        """
        for it in items:
            if id(it) in marked:
                self._partitions.drop(it.state)
        with contextlib.suppress(DlqFatalError):
            await self._dlq.txn_abort()
        return f"fatal: {reason}"

    # ----------------------------------------------------------------------------- commits

    def _commit_offsets(self, states: Sequence[PartitionState], force: bool) -> list[PendingCommit]:
        """What to commit for `states` (horizon mode: each one's commit point, see `_confirmed`).

        Points are made and committed one at a time, in order, under the commit guard: a horizon
        committed after a higher one would take hand-outs back.
        """
        out: list[PendingCommit] = []
        for state in states:
            if not self._partitions.owned(state):
                continue
            ledger = state.ledger
            point: L.CommitPoint | None = None
            must = force
            horizon = self._horizon and not ledger.revoked
            if horizon:
                must = must or ledger.horizon_wanted() is not None
            if not must and state.commit_quiet_at == ledger.changes:
                # Unchanged since a point equal to the last commit: the same point again (an
                # idle partition costs no encoding, and no scheduler turn for a new `changes`).
                continue
            if horizon:
                point = ledger.commit_point()
                offset, metadata = point.offset, point.metadata
            else:
                offset = ledger.committable_offset()
                metadata = ledger.encode_metadata()
            if not must and state.last_commit == (offset, metadata):
                state.commit_quiet_at = ledger.changes
                continue
            out.append(
                (state, OffsetToCommit(ledger.topic, ledger.partition, offset, metadata), point)
            )
        return out

    def _confirmed(self, pending: Sequence[PendingCommit]) -> None:
        """The broker has these commits: record them, and send the isolated records they allow."""
        now = now_ms()
        released: list[tuple[PartitionState, L.Attempt]] = []
        for state, o, point in pending:
            state.last_commit = (o.offset, o.metadata)
            if point is not None and self._partitions.owned(state) and not state.ledger.revoked:
                attempt = state.ledger.committed(point, now)
                if attempt is not None:
                    released.append((state, attempt))
        if released:
            self._sender.hand_out(released)
        self._kick()

    async def commit_now(self, states: Sequence[PartitionState]) -> bool:
        """Commit the partitions' state whether or not it changed (write-ahead: the delivery counts of
        records about to be handed out); whether the commit succeeded."""
        return await self._commit_states(states, force=True)

    async def _commit_states(self, states: Sequence[PartitionState], force: bool = False) -> bool:
        async with self._commit_guard:
            return await self._commit_states_locked(states, force)

    async def _commit_states_locked(self, states: Sequence[PartitionState], force: bool) -> bool:
        pending = self._commit_offsets(states, force)
        if not pending:
            return True
        offsets = [o for _, o, _ in pending]
        try:
            # The source translates librdkafka's error, and its own time limit, into CommitFailed.
            await self._source.commit(offsets)
        except CommitFailed as exc:  # retried by the next commit: redelivery, never loss
            self._counters.committed(ok=False)
            if self.failing_since is None:
                self.failing_since = time.monotonic()
            log.warning("commit failed: %s", exc)
            return False
        self._counters.committed(
            partitions=len(offsets), metadata_bytes=sum(len(o.metadata) for o in offsets)
        )
        self.failing_since = None
        self._confirmed(pending)
        return True

    async def run(self) -> None:
        """Periodic commits, and (horizon mode) a commit as soon as a partition wants one.

        A wanted commit (the horizon, an isolated record's count or outcome) goes out at once and
        asynchronously: hand-outs go on up to the horizon already committed meanwhile.
        """
        interval_s = self._config.commit_interval_ms / 1000
        next_periodic = trio.current_time() + interval_s
        while not self._outlet.room().stopping:
            with trio.move_on_at(next_periodic):
                await self._wake.wait()
            self._wake = trio.Event()
            states = list(self._states.values())
            if trio.current_time() >= next_periodic:
                next_periodic = trio.current_time() + interval_s
            else:
                states = [s for s in states if s.ledger.horizon_wanted() is not None]
            if states and not await self._commit_states(states):
                await trio.sleep(0.1)  # failing: retried soon, not in a tight loop
                self._wake.set()

    async def commit_all(self) -> None:
        """The final commit of a stop (the engine gave back what waited for a write-ahead commit)."""
        if self._horizon and self._outlet.room().stopping:
            # A clean stop is a revoke of every partition (after the drain let the app answer):
            # the final state's horizon covers only what is unsettled, so the next owner has no
            # isolation pass unless answers were lost.
            for state in self._states.values():
                self._partitions.fence(state)
        await self._commit_states(list(self._states.values()))


class _TxnSink:
    """One record's way into a DLQ transaction (`Committer.transaction`)."""

    __slots__ = ("_committer", "_offset", "_state")

    def __init__(self, committer: Committer, state: PartitionState, offset: int) -> None:
        self._committer = committer
        self._state = state
        self._offset = offset

    async def write(self, failed: FailedRecord, dlq_topic: str) -> object:
        return await self._committer.txn_write(self._state, self._offset, failed, dlq_topic)


__all__ = ["TXN_COMMIT_DEADLINE_S", "Committer"]
