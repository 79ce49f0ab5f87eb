"""The consumer-group engine (`engine: consumer`): delivery state in per-partition ledgers and commits.

Owns what is particular to a consumer group: the Kafka source's callbacks (assignment, revoke, loss,
records), one ledger per assigned partition, the answers, and building its parts (`Partitions`,
`Wakeup`, `Sender`, `Committer`, `WriteAhead`, `FlowControl`, `IsolationStep`, `Archiver`,
`Scheduler`, each given narrow interfaces, `ports`); who may change a ledger is in the class's
docstring; the record's path and the invariants kept are told in docs/architecture.md.

Must not import the pipeline, the share engine, or confluent-kafka (import-linter contracts).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

import trio

from sidecar.config import SourceIntake
from sidecar.core import ledger as L
from sidecar.core.backoff import RetryPolicy
from sidecar.core.budget import record_bytes, split_budget
from sidecar.core.outcome import Ack, error_info
from sidecar.core.record import SourceRecord, Tracked, source_record
from sidecar.core.wire import AckItem, Answer
from sidecar.engines.consumer.archive import Archiver
from sidecar.engines.consumer.commits import Committer
from sidecar.engines.consumer.flow import FlowControl
from sidecar.engines.consumer.handout import Sender, WriteAhead
from sidecar.engines.consumer.isolation import IsolationStep
from sidecar.engines.consumer.partitions import (
    PartitionRef,
    Partitions,
    PartitionState,
    fix_mmap_threshold,
    horizon_window,
    now_ms,
)
from sidecar.engines.consumer.scheduler import Scheduler, Wakeup
from sidecar.engines.consumer.status import ConsumerView
from sidecar.engines.consumer.tiers import TierIntake
from sidecar.engines.dlq_step import transactional_dlq
from sidecar.engines.interfaces import Answered, Delivery, EngineParts, PartitionKey, Settled
from sidecar.kafka.consumer_config import fetch_wait_max_ms
from sidecar.kafka.message import Message
from sidecar.kafka.source import (
    AssignedPartition,
    KafkaSource,
    OffsetToCommit,
)

log = logging.getLogger("sidecar.engine")

# How long a revoke waits for the partition's DLQ writes under way (bounded: the rebalance waits too).
REVOKE_DLQ_WAIT_S = 10.0
# How long the shutdown waits for the poll loop's last consume() before closing the consumer.
POLL_STOP_WAIT_S = 5.0


class ConsumerGroupEngine:
    """The `StateAdapter` of a consumer group: ledgers, crash accounting, commits.

    Who may change a partition's ledger (`PartitionState.ledger`): this adapter and its parts alone;
    the pipeline never sees a ledger, only `Delivery` values whose `ref` points into one. Every call is
    synchronous and runs in the trio thread, so no two transitions interleave:

        task (part)                       ledger calls
        source callbacks (via trio)       add, skip (on_messages), revoke (on_revoked, on_lost; Partitions),
                                          opening a state (Partitions.open)
        scheduler (Scheduler)             expire, acquire, to_archive; FlowControl: should_pause / may_resume,
                                          isolate (IsolationStep: horizon mode, nothing in flight)
        hand-out (Sender, WriteAhead)     not_attempted (write-ahead commit failed: not sent)
        app answers, API request          answer (answered)
        pipeline (not_reached)            not_attempted
        archive tasks (Archiver)          dlq_written (plain DLQ or none), dlq_withheld (held released)
        DLQ transactions (Committer)      dlq_written (inside the transaction), revoke (fatal)
        commits (Committer, all above)    commit_point, committed (horizon mode: may release an
                                          isolated attempt), committable_offset, encode_metadata
    """

    def __init__(
        self,
        parts: EngineParts[PartitionRef],
        *,
        write_ahead: bool = False,
        tiers_of: str | None = None,
    ) -> None:
        """`tiers_of`: read only the retry tiers this group writes (a share group's tier reader,
        `sidecar.engines.tiered_share`), not the source topics."""
        config = parts.config
        outlet = parts.outlet
        self._outlet = outlet
        self._config = config
        self._counters = parts.counters
        self._horizon = not write_ahead
        d = config.delivery
        ledger_config = L.LedgerConfig(
            delivery_count_limit=d.delivery_count_limit,
            lock_duration_ms=d.lock_duration_ms,
            max_record_locks=d.partition_max_record_locks,
            max_buffered_records=d.max_buffered_records_per_partition,
            ordering=L.Ordering[config.ordering.name],
            retry=RetryPolicy(
                initial_ms=d.retry_delay_initial_ms,
                max_ms=d.retry_delay_max_ms,
                multiplier=d.retry_delay_multiplier,
                jitter=d.retry_delay_jitter,
            ),
            metadata_max_bytes=config.offset_metadata_max_bytes,
            crash_accounting=(
                L.CrashAccounting.WRITE_AHEAD if write_ahead else L.CrashAccounting.HORIZON
            ),
            horizon_window=horizon_window(config),
            tier_threshold_ms=config.errors.tiers.threshold_ms
            if config.errors.tiers.enabled
            else None,
            tier_fetch_ahead_ms=fetch_wait_max_ms(config.kafka),
        )
        # The one decision (`transactional_dlq`): the pipeline built the writer by it, with its
        # transactional id (`dlq_writer_for`).
        self._transactional = transactional_dlq(config)
        fix_mmap_threshold()
        # Its retry tiers' topics are read with the source topics (`TierIntake`).
        self._tiers = TierIntake(config, self._counters, group=tiers_of or config.group_id)
        self.source = KafkaSource(
            config.kafka,
            (*(config.source.topics if tiers_of is None else ()), *self._tiers.topics),
            self,
            max_buffered_bytes=d.max_buffered_bytes,
            queue_signal=config.source.intake is SourceIntake.SIGNAL,
        )
        # The parts, each given what it uses.
        partitions = Partitions(
            outlet,
            ledger_config,
            horizon=self._horizon,
            max_buffered_records=d.max_buffered_records_per_partition,
            tier_topics=self._tiers.topics,
        )
        self._partitions = partitions
        wakeup = Wakeup()
        self._wakeup = wakeup
        sender = Sender(outlet, partitions)
        committer = Committer(
            outlet,
            config,
            self._counters,
            parts.dlq,
            self.source,
            partitions,
            sender,
            wakeup.kick,
            horizon=self._horizon,
        )
        self._committer = committer
        self._write_ahead = (
            WriteAhead(sender, committer.commit_now, wakeup.kick) if write_ahead else None
        )
        self._flow = FlowControl(
            outlet,
            self.source,
            partitions,
            # What the ledgers may hold together, after librdkafka's prefetch (max.buffered.bytes).
            split_budget(d.max_buffered_bytes, config.kafka),
            ledger_config,
            self._counters,
            tier_topics=frozenset(self._tiers.topics),
        )
        self._archiver = Archiver(
            outlet,
            parts.dlq,
            parts.tiers,
            partitions,
            committer,
            wakeup.kick,
            transactional=self._transactional,
        )
        self._scheduler = Scheduler(
            outlet,
            config,
            self.source,
            partitions,
            wakeup,
            self._flow,
            sender=sender,
            write_ahead=self._write_ahead,
            isolation=(
                IsolationStep(outlet, self.source, partitions, committer) if self._horizon else None
            ),
            archiver=self._archiver,
            committer=committer,
        )
        self._view = ConsumerView(
            config,
            self.source,
            partitions,
            committer,
            outlet,
            horizon=self._horizon,
            tier_topics=self._tiers.topics,
        )

    @property
    def states(self) -> dict[PartitionKey, PartitionState]:
        """The states of the partitions this engine owns (the partitions' table; read only)."""
        return self._partitions.by_key

    @property
    def view(self) -> ConsumerView:
        return self._view

    # ----------------------------------------------------------------------------- StateAdapter

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Subscribe, then poll, schedule and commit (and batch DLQ transactions) until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._archiver.run)
            self.source.start()
            nursery.start_soon(self._outlet.run_source, self.source.run)
            nursery.start_soon(self._scheduler.run)
            nursery.start_soon(self._committer.run)
            if self._transactional:
                nursery.start_soon(self._committer.run_transactions)
            task_status.started()

    def wake(self, *, now: bool = False) -> None:
        if now:
            self._scheduler.turn_now()
        else:
            self._wakeup.kick()

    def intake_changed(self, *, held_may_go: bool = False) -> None:
        if self._outlet.room().intake_stopped:
            self.source.stop_polling()
        if held_may_go:
            self._archiver.release_held()
        self._flow.apply()
        self._wakeup.kick()

    async def wait_drained(self) -> None:
        while True:
            busy = any(
                (st := s.ledger.statistics()).in_flight > 0 or st.archiving > len(s.held)
                for s in self.states.values()
            )
            if not busy or self._outlet.room().failed:
                return
            await trio.sleep(0.05)

    async def finish(self) -> None:
        if self._write_ahead is not None and self._outlet.room().stopping:
            self._write_ahead.give_back_all()
        await self._committer.commit_all()
        # Wait for the poll loop's last consume() to return before closing the handle.
        with trio.move_on_after(POLL_STOP_WAIT_S):
            await self.source.wait_stopped()
        await self.source.close()

    # ----------------------------------------------------------------------------- source listener

    async def on_assigned(self, partitions: Sequence[AssignedPartition]) -> None:
        self._counters.rebalances += 1
        for ap in partitions:
            key = (ap.topic, ap.partition)
            if ap.committed_offset is not None:
                self._partitions.open(key, ap.committed_offset, ap.metadata)
            else:
                # No committed offset: the ledger starts at the first record fetched.
                self._partitions.assigned_without_offset(ap)
        self._view.check_memory()
        self._wakeup.kick()

    async def on_revoked(self, partitions: Sequence[PartitionKey]) -> Sequence[OffsetToCommit]:
        # Let DLQ writes already under way finish (briefly), so the commit handed to the next
        # owner includes them and it does not write the same DLQ records again.
        revoking = [s for k in partitions if (s := self.states.get(k)) is not None]
        for revoked in revoking:
            revoked.revoking = True
        if self._write_ahead is not None:
            self._write_ahead.give_back(revoking)
        # Horizon mode: let the app answer what is in flight too (within the same bound), so the
        # next owner has no isolation pass for them; an answer lost here costs a pass, no count.
        with trio.move_on_after(REVOKE_DLQ_WAIT_S):
            while (
                any(s.dlq_writes or (self._horizon and s.ledger.in_flight) for s in revoking)
                and not self._outlet.room().stopping
            ):
                await self._partitions.wait_progress()
        return self.revoked_now(partitions)

    def revoked_now(self, partitions: Sequence[PartitionKey]) -> Sequence[OffsetToCommit]:
        """The revoke's final state, at once: what is done is committed; what is in flight or
        being written to the DLQ goes to the next owner (`on_revoked` waits for it first, when the
        revoke comes from another thread; on trio's own thread nothing can be waited for)."""
        self._counters.rebalances += 1
        out: list[OffsetToCommit] = []
        revoking = [s for k in partitions if (s := self.states.get(k)) is not None]
        for revoked in revoking:
            revoked.revoking = True
        if self._write_ahead is not None:
            self._write_ahead.give_back(revoking)
        for key in partitions:
            state = self._partitions.pop(key)
            if state is None:
                continue
            if state.txn_uncommitted:
                # Its DLQ transaction is still open (a stuck call): committing this state could
                # pass records whose DLQ write then aborts. The transaction cannot commit them any
                # more either (it is redone without partitions this sidecar no longer owns), so
                # the next owner reads them again from the last commit.
                log.warning(
                    "revoking %s[%d] without a commit: its DLQ transaction has not committed",
                    key[0],
                    key[1],
                )
                continue
            offset = state.ledger.committable_offset()
            out.append(OffsetToCommit(key[0], key[1], offset, state.ledger.encode_metadata()))
        self._wakeup.kick()
        return out

    async def on_lost(self, partitions: Sequence[PartitionKey]) -> None:
        self._counters.rebalances += 1
        for key in partitions:
            self._partitions.pop(key)
        self._wakeup.kick()

    def on_messages(self, messages: Sequence[Message]) -> None:
        now = now_ms()
        tier_topics = self._tiers.topics
        states = self._partitions.by_key
        for msg in messages:
            record = source_record(msg)  # read once: every attempt and the DLQ record use it
            key = (record.topic, record.partition)
            if tier_topics and record.topic in tier_topics:
                self._take_tier_record(record, now)
                continue
            state = states.get(key)
            if state is None:
                state = self._partitions.open_pending(key, record.offset)
                if state is None:
                    continue  # fetched just before a revoke: the next owner reads it again
            elif state.ledger.revoked:
                # Closed for the final commit of a stop (`commit_all`) while the poll thread still
                # served its last polls: not delivered, not committed; the next owner reads it.
                continue
            state.ledger.add(record.offset, record.key, Tracked(record), now, record_bytes(record))

    def _take_tier_record(self, record: SourceRecord, now: int) -> None:
        """A retry tier's record: into its tier partition's ledger as the original, held there
        until it is due (`TierIntake.take`); a copy of one already taken is not delivered."""
        key = (record.topic, record.partition)
        state = self.states.get(key)
        if state is None:
            state = self._partitions.open_pending(key, record.offset)
            if state is None:
                return
        elif state.ledger.revoked:
            return
        taken = self._tiers.take(record)
        if taken is None:
            state.ledger.skip(record.offset, now)  # done, committed past
            return
        state.ledger.add(
            record.offset,
            taken.tracked.record.key,
            taken.tracked,
            now,
            record_bytes(record),
            base_count=taken.delivery_count,
            not_before_ms=taken.not_before_ms,
            error=taken.error,
        )

    def messages_taken(self) -> None:
        # The batches of one hand-over are in the ledgers: one turn sends what it can of them
        # (and applies flow control, pause/resume), in this task.
        self._scheduler.turn_now()

    # ----------------------------------------------------------------------------- answers

    def answered(
        self, delivery: Delivery[PartitionRef], ack: Ack, answer: Answer | AckItem
    ) -> Answered:
        """The ledger decides (`PartitionLedger.answer`: `decide` in its state machine); the
        record's new state says what the answer led to."""
        state, attempt = delivery.ref
        try:
            result = state.ledger.answer(
                attempt.attempt_id,
                ack,
                now_ms(),
                error=error_info(answer.error),
                retry_after_ms=answer.retry_after_ms,
            )
        except L.ExpiredAttempt:
            state.untrack(attempt.attempt_id)
            return "expired"
        except L.UnknownAttempt:
            state.untrack(attempt.attempt_id)
            return "unknown"
        if ack is not Ack.RENEW:
            state.untrack(attempt.attempt_id)
            if state.revoking:
                self._partitions.progressed()
        return _SETTLED[result.state]

    async def not_reached(self, deliveries: Sequence[Delivery[PartitionRef]]) -> bool:
        """Not an attempt: back to the ledger uncounted (the pipeline pauses intake meanwhile)."""
        now = now_ms()
        for delivery in deliveries:
            state, attempt = delivery.ref
            self._outlet.retire(delivery)
            state.untrack(attempt.attempt_id)
            if self._partitions.owned(state):
                with contextlib.suppress(L.LedgerError):
                    state.ledger.not_attempted(attempt.attempt_id, now)
        self._wakeup.kick()
        return False


# What the record's state after an answer says the answer led to.
_SETTLED = {
    L.RecordState.ACKNOWLEDGED: Settled.ACCEPTED,
    L.RecordState.AVAILABLE: Settled.REDELIVERED,
    L.RecordState.ARCHIVING: Settled.DEAD_LETTERED,
    L.RecordState.ACQUIRED: Settled.KEPT,
}


__all__ = ["ConsumerGroupEngine", "horizon_window", "now_ms"]
