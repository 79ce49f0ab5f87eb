"""The consumer-group engine (`engine: consumer`): delivery state in per-partition ledgers and commits.

The pipeline (:mod:`sidecar.engines.pipeline`) sends records to the app and applies answers; this adapter owns
the part that is particular to a consumer group: the Kafka source, one ledger per assigned partition,
crash accounting (a horizon committed ahead of the hand-outs and the isolation pass after an unclean
stop; or, selectable with `write_ahead=True`, the older write-ahead commit of every hand-out), offset
commits with the delivery state in their metadata, and the optional transactional DLQ::

    source (poll thread) ──on_messages──▶ ledgers ──scheduler──▶ hand-out ──▶ pipeline requests ──▶ app
                                             ▲                                       │
                                             └──────── answered() ◀──────────────────┘  (and /v1/acks)
    ledgers ──to_archive──▶ archive tasks ──pipeline.dead_letter()──▶ DLQ ──▶ ledgers (dlq_written)
    committer / hand-out / txn_loop ──▶ Kafka offsets + metadata

Who may change a partition's ledger (`Slot.ledger`). This adapter is its only owner: the pipeline
never sees a ledger, only `Delivery` values whose `ref` points into one. Every call is synchronous
and runs in the trio thread, so no two transitions interleave:

    task                              ledger calls
    source callbacks (via trio)       add (on_messages), revoke (on_revoked, on_lost), opening a slot
    scheduler                         expire, acquire, to_archive, should_pause / may_resume,
                                      isolate (horizon mode, nothing in flight in the process)
    hand-out (write-ahead mode)       not_attempted (write-ahead commit failed: not sent)
    app answers, API request          answer (answered)
    pipeline (not_reached)            not_attempted
    archive tasks                     dlq_written (plain DLQ or none)
    txn_loop                          dlq_written (inside the transaction), revoke (fatal)
    commits (all of the above)        commit_point, committed (horizon mode: may release an
                                      isolated attempt), committable_offset, encode_metadata

Invariants kept here (the ledger keeps the rest):
- horizon mode (the default, SPEC §3): no record waits for a commit in steady state; while any
  partition's isolation pass has a suspect ready, charged, in flight or settling, nothing is acquired
  on any partition, and a suspect is isolated only with nothing in flight in the process, so a death
  charges exactly the isolated record (a killer reaches the DLQ after at most `limit + 1` deaths);
  commit points are made and committed one at a time, in order (`_commit_guard`); a revoke or a
  clean stop lets in-flight answers come first, then revokes, then commits the final state;
- write-ahead mode: delivery counts are persisted *before* a record is handed to the app (group
  commit of the acquired batch), so every record in flight at a death is charged that attempt;
- the committed offset is the ledger's committable offset: never past a record that is not done, and a DLQ
  record is confirmed by the broker before its record counts as done;
- a revoked partition's attempts are fenced: late answers are reported `expired`, never applied.

The transactional DLQ (`errors.deadletterqueue.transactional.enable`) writes DLQ records and the offset
commit in one transaction; tracing of DLQ writes happens in the pipeline's DLQ step either way.

The scheduler (its turns, flow control, and when a turn runs) is a part of this class that lives in
:mod:`sidecar.engines.consumer_scheduler` (its base class), the commits and the DLQ transactions
(committer, txn_loop, commit_all) in :mod:`sidecar.engines.consumer_commits` (another), the
scheduler's isolation step in :mod:`sidecar.engines.consumer_isolation` (another); a partition's slot, the horizon's
window and the engine's clock in :mod:`sidecar.engines.consumer_slots`. The Kafka boundary is
`sidecar.kafka`: this module does not import confluent-kafka (an import-linter contract).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any, cast

import trio

from sidecar.core import ledger as L
from sidecar.core.backoff import RetryPolicy
from sidecar.core.budget import record_bytes, split_budget
from sidecar.core.commitstate import DEFAULT_MAX_ENTRIES, CommitStateError
from sidecar.core.commitstate import parse as parse_state
from sidecar.core.deadletter import ArchiveOutcome, FailedRecord
from sidecar.core.outcome import Ack, error_info
from sidecar.core.record import Tracked, source_record
from sidecar.core.wire import AckItem, Answer
from sidecar.engines.consumer_commits import OffsetCommits
from sidecar.engines.consumer_isolation import IsolationPasses
from sidecar.engines.consumer_scheduler import Scheduling
from sidecar.engines.consumer_slots import (
    Slot,
    SlotRef,
    TxnItem,
    fix_mmap_threshold,
    horizon_window,
    now_ms,
)
from sidecar.engines.interfaces import AckResult, Delivery, PartitionKey, Pipe
from sidecar.kafka.message import Message
from sidecar.kafka.source import (
    AssignedPartition,
    KafkaSource,
    OffsetToCommit,
)

log = logging.getLogger("sidecar.engine")

# How long a revoke waits for the partition's DLQ writes under way (bounded: the rebalance waits too).
REVOKE_DLQ_WAIT_S = 10.0
# Readiness reports `commits_ok: false` once every commit has failed for this long.
COMMITS_FAILING_NOT_READY_S = 30.0
# How long the shutdown waits for the poll loop's last consume() before closing the consumer.
POLL_STOP_WAIT_S = 5.0


class ConsumerGroupEngine(Scheduling, OffsetCommits, IsolationPasses):
    """The `DeliveryState` of a consumer group: ledgers, crash accounting, commits (see above)."""

    kind = "consumer"

    def __init__(self, pipe: Pipe[SlotRef], *, write_ahead: bool = False) -> None:
        config = pipe.config
        self.pipe = pipe
        self.config = config
        self.counters = pipe.counters
        self.dlq = pipe.dlq
        self.write_ahead = write_ahead
        d = config.delivery
        self.ledger_config = L.LedgerConfig(
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
        )
        self.horizon = not write_ahead
        # Decoding bound: the default fits the default buffer; a larger buffer writes more.
        self._max_entries = max(DEFAULT_MAX_ENTRIES, 2 * d.max_buffered_records_per_partition + 2)
        dlq = config.errors.dlq
        self.transactional = dlq.transactional_enable and dlq.enabled
        # In that mode the pipeline built the writer with its transactional id (`dlq_writer_for`).
        self._txn_items: list[TxnItem] = []
        self._txn_wake = trio.Event()
        self._commit_guard = trio.Lock()
        # Something a revoke waits for finished (a DLQ write; horizon mode: an answer, an expiry).
        self._revoke_progress = trio.Event()
        # What the ledgers may hold together, after librdkafka's prefetch (max.buffered.bytes).
        self.budget = split_budget(d.max_buffered_bytes, config.kafka)
        fix_mmap_threshold()
        self.source = KafkaSource(
            config.kafka, config.source.topics, self, max_buffered_bytes=d.max_buffered_bytes
        )
        self.slots: dict[PartitionKey, Slot] = {}
        self._pending_assign: dict[PartitionKey, AssignedPartition] = {}
        self._epoch = 0
        self._kick = trio.Event()
        # The scheduler's wait (None while it is not waiting), whether a turn is running, and
        # the wakes held while a row of answers is applied (`hold_wakes`).
        self._schedule_scope: trio.CancelScope | None = None
        self._in_turn = False
        self._holding = False
        self._held = False
        self._flow_shared: tuple[int, bool, int] | None = None  # see _apply_flow_control
        # Since when every commit has failed (None: the last one succeeded). No commit means no
        # hand-out: write-ahead delivery counts must be stored first.
        self.commit_failing_since: float | None = None
        # Acquired records whose new delivery counts are not yet committed (write-ahead): the
        # hand-out task commits them as one group while the scheduler goes on acquiring.
        self._awaiting: list[tuple[Slot, L.Attempt]] = []
        self._awaiting_wake = trio.Event()
        self._rr = 0
        self._nursery: trio.Nursery | None = None
        # Horizon mode: a partition wants a commit (its horizon, or an isolated record's count).
        self._commit_wake = trio.Event()

    # ----------------------------------------------------------------------------- DeliveryState

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Subscribe, then poll, schedule and commit (and batch DLQ transactions) until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.source.start()
            nursery.start_soon(self.pipe.run_source, self.source.run)
            nursery.start_soon(self._scheduler)
            nursery.start_soon(self._committer)
            if self.transactional:
                nursery.start_soon(self._txn_loop)
            task_status.started()

    def intake_changed(self) -> None:
        self._apply_flow_control()
        self.kick()

    def stop_intake(self) -> None:
        self.source.stop_polling()

    def release_held(self) -> None:
        now = now_ms()
        for slot in self.slots.values():
            for offset in slot.held:
                with contextlib.suppress(L.LedgerError):
                    slot.ledger.dlq_withheld(offset, now)
            slot.held.clear()
        self.kick()

    async def wait_drained(self) -> None:
        while True:
            busy = any(
                (st := s.ledger.statistics()).in_flight > 0 or st.archiving > len(s.held)
                for s in self.slots.values()
            )
            if not busy or self.pipe.failure:
                return
            await trio.sleep(0.05)

    async def finish(self) -> None:
        await self.commit_all()
        # Wait for the poll loop's last consume() to return before closing the handle.
        with trio.move_on_after(POLL_STOP_WAIT_S):
            await self.source.wait_stopped()
        await self.source.close()

    def stalled(self) -> str | None:
        """Why the sidecar cannot make progress and should be restarted (None: it can).

        Every commit failing for `commit.stall.timeout.ms` means nothing is handed out (delivery
        counts are committed first) and nothing is marked done. A broker that is down recovers by
        itself; a consumer whose group coordinator lookup is wedged inside librdkafka does not,
        and a new process with a new consumer does. /healthz reports it so a liveness probe acts.
        """
        limit_ms = self.config.commit_stall_timeout_ms
        since = self.commit_failing_since
        if limit_ms <= 0 or since is None:
            return None
        failing_s = time.monotonic() - since
        if failing_s * 1000 < limit_ms:
            return None
        return f"every offset commit has failed for {failing_s:.0f}s (commit.stall.timeout.ms)"

    def readiness(self) -> dict[str, bool]:
        return {
            "assigned": bool(self.source.assigned),
            "broker_reachable": self.source.broker_ok,
            "commits_ok": self.commit_failing_since is None
            or time.monotonic() - self.commit_failing_since < COMMITS_FAILING_NOT_READY_S,
        }

    def broker_error(self) -> str | None:
        return self.source.broker_error

    def paused(self) -> set[PartitionKey]:
        return set(self.source.paused)

    def lag(self) -> dict[PartitionKey, int]:
        return self.source.lag()

    def commit_metadata_bytes(self) -> dict[PartitionKey, int]:
        return {k: len(s.last_commit[1]) for k, s in self.slots.items() if s.last_commit}

    def status_fields(self) -> dict[str, Any]:
        since = self.commit_failing_since
        out: dict[str, Any] = {
            # Seconds every commit has been failing (null: the last one succeeded).
            "commits_failing_s": None if since is None else round(time.monotonic() - since, 3),
            "crash_accounting": "horizon" if self.horizon else "write_ahead",
        }
        out.update(self.isolation_summary())
        return out

    def isolation_summary(self) -> dict[str, Any]:
        """Crash isolation across the assigned partitions (`/v1/status`, metrics)."""
        statuses = [s.ledger.horizon_status() for s in self.slots.values()]
        return {
            "isolation_active": any(h.pass_active for h in statuses),
            "suspects_left": sum(h.suspects_left for h in statuses),
            "suspects_total": sum(h.suspects_total for h in statuses),
            "isolated_total": sum(h.isolated_total for h in statuses),
        }

    def partitions(self) -> list[dict[str, Any]]:
        lag = self.source.lag() if not self.pipe.stopping else {}
        high = self.source.high_watermarks() if not self.pipe.stopping else {}
        paused = self.source.paused
        out = []
        for (topic, partition), slot in sorted(self.slots.items()):
            st = slot.ledger.statistics()
            hz = slot.ledger.horizon_status()
            # Records not finished: from the committed offset (the committable one before this
            # process's first commit) to the high watermark, held records included.
            hi = high.get((topic, partition))
            committed = slot.last_commit[0] if slot.last_commit else st.committable_offset
            out.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "committable_offset": st.committable_offset,
                    "last_committed_offset": slot.last_commit[0] if slot.last_commit else None,
                    "in_flight": st.in_flight,
                    "buffered": st.buffered,
                    "buffered_bytes": st.buffered_bytes,
                    "archiving": st.archiving,
                    "paused": (topic, partition) in paused,
                    "lag": lag.get((topic, partition)),
                    "committed_lag": None if hi is None else max(0, hi - committed),
                    "horizon_committed": hz.horizon_committed,
                    "isolation": hz.isolation.value,
                    "suspects_left": hz.suspects_left,
                    "suspects_total": hz.suspects_total,
                    "isolated_total": hz.isolated_total,
                }
            )
        for topic, partition in sorted(self._pending_assign):
            # Assigned with no committed offset and nothing fetched yet: no ledger so far.
            out.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "committable_offset": None,
                    "last_committed_offset": None,
                    "in_flight": 0,
                    "buffered": 0,
                    "buffered_bytes": 0,
                    "archiving": 0,
                    "paused": (topic, partition) in paused,
                    "lag": lag.get((topic, partition)),
                }
            )
        return out

    # ----------------------------------------------------------------------------- source listener

    async def on_assigned(self, partitions: Sequence[AssignedPartition]) -> None:
        self.counters.rebalances += 1
        for ap in partitions:
            key = (ap.topic, ap.partition)
            if ap.committed_offset is not None:
                self._open_slot(key, ap.committed_offset, ap.metadata)
            else:
                # No committed offset: the ledger starts at the first record fetched.
                self._pending_assign[key] = ap
        self.kick()

    def _open_slot(self, key: PartitionKey, start_offset: int, metadata: str | None) -> Slot:
        restored = None
        if metadata:
            try:
                restored = parse_state(metadata, max_entries=self._max_entries)
            except CommitStateError as exc:
                log.warning(
                    "commit metadata of %s[%d] is unusable (%s); delivering from the committed "
                    "offset %d without delivery state",
                    key[0],
                    key[1],
                    exc,
                    start_offset,
                )
            if restored is None:
                pass
            elif restored.base_offset != start_offset:
                log.warning(
                    "commit metadata of %s[%d] is for offset %d, not the committed %d; ignoring it",
                    key[0],
                    key[1],
                    restored.base_offset,
                    start_offset,
                )
                restored = None
        self._epoch += 1
        ledger = L.PartitionLedger(
            key[0], key[1], start_offset, self.ledger_config, restored=restored, epoch=self._epoch
        )
        slot = Slot(ledger)
        top = restored.horizon if self.horizon and restored is not None else None
        if top is not None and top >= start_offset:
            slot.suspect_top = top
        self.slots[key] = slot
        return slot

    async def on_revoked(self, partitions: Sequence[PartitionKey]) -> Sequence[OffsetToCommit]:
        self.counters.rebalances += 1
        out: list[OffsetToCommit] = []
        # Let DLQ writes already under way finish (briefly), so the commit handed to the next
        # owner includes them and it does not write the same DLQ records again.
        revoking = [s for k in partitions if (s := self.slots.get(k)) is not None]
        for revoked in revoking:
            revoked.revoking = True
        if self._awaiting and revoking:
            # Not sent yet: they go back uncounted rather than into the commit for the next owner.
            gone = {id(s) for s in revoking}
            self._return_unsent([(s, a) for s, a in self._awaiting if id(s) in gone])
            self._awaiting = [(s, a) for s, a in self._awaiting if id(s) not in gone]
        # Horizon mode: let the app answer what is in flight too (within the same bound), so the
        # next owner has no isolation pass for them; an answer lost here costs a pass, no count.
        with trio.move_on_after(REVOKE_DLQ_WAIT_S):
            while (
                any(s.dlq_writes or (self.horizon and s.ledger.in_flight) for s in revoking)
                and not self.pipe.stopping
            ):
                self._revoke_progress = trio.Event()
                await self._revoke_progress.wait()
        for key in partitions:
            self._pending_assign.pop(key, None)
            slot = self.slots.pop(key, None)
            if slot is None:
                continue
            self._close_slot(slot)
            if slot.txn_uncommitted:
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
            offset = slot.ledger.committable_offset()
            out.append(OffsetToCommit(key[0], key[1], offset, slot.ledger.encode_metadata()))
        self.kick()
        return out

    async def on_lost(self, partitions: Sequence[PartitionKey]) -> None:
        self.counters.rebalances += 1
        for key in partitions:
            self._pending_assign.pop(key, None)
            slot = self.slots.pop(key, None)
            if slot is not None:
                self._close_slot(slot)
        self.kick()

    def _close_slot(self, slot: Slot) -> None:
        """The partition is no longer ours: fence its ledger and its live deliveries."""
        slot.ledger.revoke()
        for delivery in slot.live.values():
            self.pipe.retire(delivery)
        slot.live.clear()

    def on_messages(self, messages: Sequence[Message]) -> None:
        now = now_ms()
        for msg in messages:
            record = source_record(msg)  # read once: every attempt and the DLQ record use it
            key = (record.topic, record.partition)
            slot = self.slots.get(key)
            if slot is None:
                pending = self._pending_assign.pop(key, None)
                if pending is None:
                    continue  # fetched just before a revoke: the next owner reads it again
                slot = self._open_slot(key, record.offset, None)
            elif slot.ledger.revoked:
                # Closed for the final commit of a stop (`commit_all`) while the poll thread still
                # served its last polls: not delivered, not committed; the next owner reads it.
                continue
            slot.ledger.add(record.offset, record.key, Tracked(record), now, record_bytes(record))

    def messages_taken(self) -> None:
        # The batches of one hand-over are in the ledgers: one turn sends what it can of them
        # (and applies flow control, pause/resume), in this task.
        self._turn_now()

    async def _hand_out_loop(self) -> None:
        """Commit the delivery counts of acquired records, then hand them to the workers.

        Group commit: everything acquired while one write-ahead commit is in flight goes out with
        the next one, so records leave only after their count is stored (a record that crashes
        the sidecar, or the pod, on delivery still has its attempt counted) while the commit's
        round trip overlaps the app's work instead of stalling the scheduler.
        """
        while True:
            await self._awaiting_wake.wait()
            self._awaiting_wake = trio.Event()
            batch, self._awaiting = self._awaiting, []
            if not batch:
                continue
            touched = {id(s): s for s, _ in batch}
            ok = await self._commit_slots(list(touched.values()), force=True)
            if not ok:
                self._return_unsent(batch)
                self.kick()
                await trio.sleep(0.1)
                continue
            self._hand_out(batch)
            self.kick()

    def _return_unsent(self, batch: list[tuple[Slot, L.Attempt]]) -> None:
        """Acquired records that will not be sent go back without counting the attempt."""
        now = now_ms()
        for slot, attempt in batch:
            if self._still_owned(slot):
                with contextlib.suppress(L.LedgerError):
                    slot.ledger.not_attempted(attempt.attempt_id, now)

    def _hand_out(self, acquired: list[tuple[Slot, L.Attempt]]) -> None:
        # A lock deadline in trio time: the ledger's (monotonic ms) moved onto trio's clock.
        offset_s = trio.current_time() - now_ms() / 1000
        for slot, attempt in acquired:
            if not self._still_owned(slot):
                continue  # revoked while the commit was in flight: fenced
            tracked = cast(Tracked, attempt.item)
            delivery = self.pipe.issue(
                tracked,
                attempt.delivery_count,
                (slot, attempt),
                lock_deadline=offset_s + attempt.lock_deadline_ms / 1000,
            )
            slot.live[attempt.attempt_id] = delivery
            self.pipe.send(delivery)

    # ----------------------------------------------------------------------------- answers

    def answered(
        self, delivery: Delivery[SlotRef], ack: Ack, answer: Answer | AckItem
    ) -> AckResult:
        slot, attempt = delivery.ref
        try:
            slot.ledger.answer(
                attempt.attempt_id,
                ack,
                now_ms(),
                error=error_info(answer.error),
                retry_after_ms=answer.retry_after_ms,
            )
        except L.ExpiredAttempt:
            slot.live.pop(attempt.attempt_id, None)
            return "expired"
        except L.UnknownAttempt:
            slot.live.pop(attempt.attempt_id, None)
            return "unknown"
        if ack is not Ack.RENEW:
            slot.live.pop(attempt.attempt_id, None)
            if slot.revoking:
                self._revoke_progress.set()
        return "ok"

    async def not_reached(self, deliveries: Sequence[Delivery[SlotRef]]) -> bool:
        """Not an attempt: back to the ledger uncounted (the pipeline pauses intake meanwhile)."""
        now = now_ms()
        for delivery in deliveries:
            slot, attempt = delivery.ref
            self.pipe.retire(delivery)
            slot.live.pop(attempt.attempt_id, None)
            if self._still_owned(slot):
                with contextlib.suppress(L.LedgerError):
                    slot.ledger.not_attempted(attempt.attempt_id, now)
        self.kick()
        return False

    # ----------------------------------------------------------------------------- DLQ

    def _start_archiving(self, slots: Sequence[Slot]) -> None:
        assert self._nursery is not None
        for slot in slots:
            for req in slot.ledger.to_archive():
                slot.dlq_writes += 1
                self._nursery.start_soon(self._archive_counted, slot, req)

    async def _archive_counted(self, slot: Slot, req: L.ArchiveRequest) -> None:
        try:
            await self._archive(slot, req)
        finally:
            slot.dlq_writes -= 1
            self._revoke_progress.set()

    async def _archive(self, slot: Slot, req: L.ArchiveRequest) -> None:
        async def write(failed: FailedRecord, dlq_topic: str) -> bool:
            if self.transactional:
                # The batcher marks the record done inside the transaction that commits its offset.
                return await self._txn_write(slot, req.offset, failed, dlq_topic)
            await self.dlq.write(failed, dlq_topic)
            return True

        outcome = await self.pipe.dead_letter(
            cast(Tracked, req.item),
            req.delivery_count,
            req.reason,
            req.error,
            consequence="stopping with its offset uncommitted",
            write=write,
        )
        marked_in_txn = self.transactional and outcome is ArchiveOutcome.WRITTEN
        if outcome.done and not marked_in_txn and self._still_owned(slot):
            slot.ledger.dlq_written(req.offset)
        elif outcome is ArchiveOutcome.HELD and self._still_owned(slot):
            slot.held.append(req.offset)  # not done: nothing is committed past it
        self.kick()


__all__ = ["ConsumerGroupEngine", "horizon_window", "now_ms"]
