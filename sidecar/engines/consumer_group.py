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

The engine is built of parts, each an object with its own attributes, built here in this order and
given its collaborators when it is built (nothing is set on a part afterwards):

    Partitions     consumer_slots       the slots by partition: open, fence, forget; a revoke's wait
    Wakeup         consumer_scheduler   the scheduler's doorbell (and the wakes held during a row)
    Sender         consumer_handout     issue + send an acquired record; give one back unsent
    Committer      consumer_commits     offset commits, one at a time; the DLQ transactions
    WriteAhead     consumer_handout     write-ahead mode: acquired records wait for their commit
    IsolationStep  consumer_isolation   horizon mode: a suspect alone in the process
    Archiver       consumer_archive     archive tasks; what the DLQ circuit breaker held
    Scheduler      consumer_scheduler   turns (expiry, acquisition, archiving, flow control)

This class keeps the source's callbacks (assignment, revoke, loss, records) and the answers, and
builds the status from its parts. Where a record's release and decision flow: an answer reaches
`answered` → `PartitionLedger.answer`, where `decide` (sidecar.core.outcome) turns it into a
verdict → AVAILABLE after the backoff (the scheduler acquires it again, the sender sends it) or
ARCHIVING (the archiver takes it to the pipeline's DLQ step). The Kafka boundary is
`sidecar.kafka`: this module does not import confluent-kafka (an import-linter contract).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any

import trio

from sidecar.core import ledger as L
from sidecar.core.backoff import RetryPolicy
from sidecar.core.budget import record_bytes, split_budget
from sidecar.core.outcome import Ack, error_info
from sidecar.core.record import Tracked, source_record
from sidecar.core.wire import AckItem, Answer
from sidecar.engines.consumer_archive import Archiver
from sidecar.engines.consumer_commits import Committer
from sidecar.engines.consumer_handout import Sender, WriteAhead
from sidecar.engines.consumer_isolation import IsolationStep
from sidecar.engines.consumer_scheduler import Scheduler, Wakeup
from sidecar.engines.consumer_slots import (
    Partitions,
    Slot,
    SlotRef,
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


class ConsumerGroupEngine:
    """The `DeliveryState` of a consumer group: ledgers, crash accounting, commits (see above)."""

    kind = "consumer"

    def __init__(self, pipe: Pipe[SlotRef], *, write_ahead: bool = False) -> None:
        config = pipe.config
        self._pipe = pipe
        self._config = config
        self._counters = pipe.counters
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
        )
        dlq = config.errors.dlq
        # In that mode the pipeline built the writer with its transactional id (`dlq_writer_for`).
        self._transactional = dlq.transactional_enable and dlq.enabled
        fix_mmap_threshold()
        self.source = KafkaSource(
            config.kafka, config.source.topics, self, max_buffered_bytes=d.max_buffered_bytes
        )
        # The parts, each given what it uses (see the module docstring).
        partitions = Partitions(
            pipe,
            ledger_config,
            horizon=self._horizon,
            max_buffered_records=d.max_buffered_records_per_partition,
        )
        self._partitions = partitions
        wakeup = Wakeup()
        self._wakeup = wakeup
        sender = Sender(pipe, partitions)
        committer = Committer(
            pipe,
            config,
            self._counters,
            pipe.dlq,
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
        self._archiver = Archiver(
            pipe, pipe.dlq, partitions, committer, wakeup.kick, transactional=self._transactional
        )
        self._scheduler = Scheduler(
            pipe,
            config,
            self._counters,
            self.source,
            partitions,
            # What the ledgers may hold together, after librdkafka's prefetch (max.buffered.bytes).
            split_budget(d.max_buffered_bytes, config.kafka),
            ledger_config,
            wakeup,
            sender=sender,
            write_ahead=self._write_ahead,
            isolation=(
                IsolationStep(pipe, self.source, partitions, committer) if self._horizon else None
            ),
            archiver=self._archiver,
            committer=committer,
        )

    @property
    def slots(self) -> dict[PartitionKey, Slot]:
        """The slots of the partitions this engine owns (the partitions' table; read only)."""
        return self._partitions.by_key

    # ----------------------------------------------------------------------------- DeliveryState

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Subscribe, then poll, schedule and commit (and batch DLQ transactions) until cancelled."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._archiver.run)
            self.source.start()
            nursery.start_soon(self._pipe.run_source, self.source.run)
            nursery.start_soon(self._scheduler.run)
            nursery.start_soon(self._committer.run)
            if self._transactional:
                nursery.start_soon(self._committer.run_transactions)
            task_status.started()

    def wake(self) -> None:
        self._wakeup.kick()

    kick = wake

    def hold_wakes(self) -> None:
        self._wakeup.hold()

    def release_wakes(self) -> None:
        if self._wakeup.release():
            self._scheduler.turn_now()

    def intake_changed(self) -> None:
        self._scheduler.apply_flow_control()
        self.kick()

    def stop_intake(self) -> None:
        self.source.stop_polling()

    def release_held(self) -> None:
        self._archiver.release_held()

    async def wait_drained(self) -> None:
        while True:
            busy = any(
                (st := s.ledger.statistics()).in_flight > 0 or st.archiving > len(s.held)
                for s in self.slots.values()
            )
            if not busy or self._pipe.failure:
                return
            await trio.sleep(0.05)

    async def finish(self) -> None:
        if self._write_ahead is not None and self._pipe.stopping:
            self._write_ahead.give_back_all()
        await self._committer.commit_all()
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
        limit_ms = self._config.commit_stall_timeout_ms
        since = self._committer.failing_since
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
            "commits_ok": self._committer.failing_since is None
            or time.monotonic() - self._committer.failing_since < COMMITS_FAILING_NOT_READY_S,
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
        since = self._committer.failing_since
        out: dict[str, Any] = {
            # Seconds every commit has been failing (null: the last one succeeded).
            "commits_failing_s": None if since is None else round(time.monotonic() - since, 3),
            "crash_accounting": "horizon" if self._horizon else "write_ahead",
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
        lag = self.source.lag() if not self._pipe.stopping else {}
        paused = self.source.paused
        out = []
        for (topic, partition), slot in sorted(self.slots.items()):
            st = slot.ledger.statistics()
            hz = slot.ledger.horizon_status()
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
                    "horizon_committed": hz.horizon_committed,
                    "isolation": hz.isolation.value,
                    "suspects_left": hz.suspects_left,
                    "suspects_total": hz.suspects_total,
                    "isolated_total": hz.isolated_total,
                }
            )
        for topic, partition in sorted(self._partitions.pending):
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
        self._counters.rebalances += 1
        for ap in partitions:
            key = (ap.topic, ap.partition)
            if ap.committed_offset is not None:
                self._partitions.open(key, ap.committed_offset, ap.metadata)
            else:
                # No committed offset: the ledger starts at the first record fetched.
                self._partitions.pending[key] = ap
        self.kick()

    async def on_revoked(self, partitions: Sequence[PartitionKey]) -> Sequence[OffsetToCommit]:
        self._counters.rebalances += 1
        out: list[OffsetToCommit] = []
        # Let DLQ writes already under way finish (briefly), so the commit handed to the next
        # owner includes them and it does not write the same DLQ records again.
        revoking = [s for k in partitions if (s := self.slots.get(k)) is not None]
        for revoked in revoking:
            revoked.revoking = True
        if self._write_ahead is not None:
            self._write_ahead.give_back(revoking)
        # Horizon mode: let the app answer what is in flight too (within the same bound), so the
        # next owner has no isolation pass for them; an answer lost here costs a pass, no count.
        with trio.move_on_after(REVOKE_DLQ_WAIT_S):
            while (
                any(s.dlq_writes or (self._horizon and s.ledger.in_flight) for s in revoking)
                and not self._pipe.stopping
            ):
                await self._partitions.wait_progress()
        for key in partitions:
            slot = self._partitions.pop(key)
            if slot is None:
                continue
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
        self._counters.rebalances += 1
        for key in partitions:
            self._partitions.pop(key)
        self.kick()

    def on_messages(self, messages: Sequence[Message]) -> None:
        now = now_ms()
        for msg in messages:
            record = source_record(msg)  # read once: every attempt and the DLQ record use it
            key = (record.topic, record.partition)
            slot = self.slots.get(key)
            if slot is None:
                pending = self._partitions.pending.pop(key, None)
                if pending is None:
                    continue  # fetched just before a revoke: the next owner reads it again
                slot = self._partitions.open(key, record.offset, None)
            elif slot.ledger.revoked:
                # Closed for the final commit of a stop (`commit_all`) while the poll thread still
                # served its last polls: not delivered, not committed; the next owner reads it.
                continue
            slot.ledger.add(record.offset, record.key, Tracked(record), now, record_bytes(record))

    def messages_taken(self) -> None:
        # The batches of one hand-over are in the ledgers: one turn sends what it can of them
        # (and applies flow control, pause/resume), in this task.
        self._scheduler.turn_now()

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
                self._partitions.progressed()
        return "ok"

    async def not_reached(self, deliveries: Sequence[Delivery[SlotRef]]) -> bool:
        """Not an attempt: back to the ledger uncounted (the pipeline pauses intake meanwhile)."""
        now = now_ms()
        for delivery in deliveries:
            slot, attempt = delivery.ref
            self._pipe.retire(delivery)
            slot.live.pop(attempt.attempt_id, None)
            if self._partitions.owned(slot):
                with contextlib.suppress(L.LedgerError):
                    slot.ledger.not_attempted(attempt.attempt_id, now)
        self.kick()
        return False


__all__ = ["ConsumerGroupEngine", "horizon_window", "now_ms"]
