"""The consumer-group engine: the ledger wired to Kafka, the app and the DLQ.

Owns the per-partition ledgers and every task that moves records through them:

    source (poll thread) ──on_messages──▶ ledgers ──scheduler──▶ workers ──HTTP──▶ app
                                             ▲                      │
                                             └──── answers ◀────────┘   (and /v1/acks for deferred answers)
    ledgers ──to_archive──▶ DLQ writers ──confirmed──▶ ledgers;  committer ──▶ Kafka offsets + metadata

Invariants kept here (the ledger keeps the rest):
- delivery counts are persisted *before* a record is handed to the app (write-ahead commit of the acquired
  batch), so a record that kills the sidecar on every attempt still reaches the DLQ after `limit` attempts;
- the committed offset is the ledger's committable offset: never past a record that is not done, and a DLQ
  record is confirmed by the broker before its record counts as done;
- a revoked partition's attempts are fenced: late answers are reported `expired`, never applied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import random
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import trio
from confluent_kafka import Message, TopicPartition
from opentelemetry import trace

from sidecar import ledger as L
from sidecar.appclient import AppNotReachable, AppTarget
from sidecar.backoff import RetryPolicy
from sidecar.commitstate import decode as decode_state
from sidecar.config import AppMode, Config, ErrorsTolerance
from sidecar.delivery import (
    app_client_for,
    dlq_writer_for,
    end_attempt_span,
    key_bytes,
    message_headers,
    record_view,
    start_attempt_span,
    value_bytes,
)
from sidecar.dlq import (
    CAUSE_DELIVERY_COUNT,
    CAUSE_REJECTED,
    DlqFatalError,
    DlqTxnAbortable,
    FailedRecord,
)
from sidecar.source import AssignedPartition, KafkaSource, OffsetToCommit
from sidecar.tracing import AttemptContext, Tracing
from sidecar.wire import AckItem, Answer, RecordView

log = logging.getLogger("sidecar.engine")

PartitionKey = tuple[str, int]

# How long a revoke waits for the partition's DLQ writes under way (bounded: the rebalance waits too).
REVOKE_DLQ_WAIT_S = 10.0
# Readiness reports `commits_ok: false` once every commit has failed for this long.
COMMITS_FAILING_NOT_READY_S = 30.0
# A batch of DLQ records whose transaction is aborted for a retriable reason (a broker restart, a
# rebalance, a stuck producer replaced) is redone; one not committed within this time stops the sidecar
# (exit 1) instead of wedging it.
TXN_COMMIT_DEADLINE_S = 120.0

_ACKS = {
    "accept": L.Ack.ACCEPT,
    "release": L.Ack.RELEASE,
    "reject": L.Ack.REJECT,
    "renew": L.Ack.RENEW,
}


def default_transactional_id(config: Config) -> str:
    """`kafka.transactional.id`, else one that is stable across restarts and unique per instance.

    Stable, so a restarted sidecar fences its dead incarnation and aborts its open transaction;
    unique, because two producers with one id fence each other. `group.instance.id` (static
    membership) names the instance when set; otherwise the host name plus the local API's address,
    which no two sidecars on one host can share.
    """
    explicit = config.kafka.get("transactional.id")
    if explicit:
        return str(explicit)
    instance = config.kafka.get("group.instance.id")
    if instance:
        return f"dlq-sidecar.{config.group_id}.{instance}"
    api = hashlib.sha256(config.api.listen.encode()).hexdigest()[:8]
    return f"dlq-sidecar.{config.group_id}.{socket.gethostname()}.{api}"


def now_ms() -> int:
    # The ledger wants a clock that never goes backwards.
    return time.monotonic_ns() // 1_000_000


@dataclass(slots=True)
class Counters:
    delivered: dict[str, int] = field(default_factory=dict)  # outcome -> count
    attempts: int = 0
    not_attempted: int = 0
    archived: dict[str, int] = field(default_factory=dict)  # reason -> count
    dlq_written: int = 0
    dlq_failed: int = 0
    expired_answers: int = 0
    commits: int = 0
    commit_failures: int = 0
    rebalances: int = 0
    metadata_pauses: int = 0

    by_topic: dict[tuple[str, str], int] = field(default_factory=dict)  # (topic, outcome) -> count

    def bump(self, table: dict[Any, int], key: Any, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n


@dataclass(slots=True)
class _Slot:
    """One partition's ledger plus what the engine keeps beside it."""

    ledger: L.PartitionLedger
    epoch: int
    last_commit: tuple[int, str] | None = None
    # KIP-1034 custom DLQ record parts from a reject, by offset, until the DLQ write.
    dlq_extras: dict[int, Answer | AckItem] = field(default_factory=dict)
    dlq_writes: int = 0  # DLQ writes in progress for this partition
    revoking: bool = False  # no new acquisitions: the partition is being handed over
    # Transactional mode: the ledger counts records of a DLQ transaction that has not committed
    # (yet) as done, so its state must not be committed outside that transaction.
    txn_uncommitted: bool = False


@dataclass(slots=True, eq=False)
class _TxnItem:
    slot: _Slot
    offset: int
    failed: FailedRecord
    dlq_topic: str
    done: trio.Event = field(default_factory=trio.Event)
    error: str | None = None
    skipped: bool = False  # the partition went to another owner before the transaction


class Engine:
    """Everything between the Kafka source and the app. One per sidecar process."""

    def __init__(
        self, config: Config, *, write_ahead: bool = True, tracing: Tracing | None = None
    ) -> None:
        self.config = config
        self.tracing = tracing or Tracing(
            config.tracing.service_name, config.group_id, config.tracing.exporter.value
        )
        # Last attempt span of records that may still be archived: the DLQ span links to it.
        self._attempt_spans: dict[tuple[str, int, int], trace.SpanContext] = {}
        # App request latencies (seconds) since the last scrape; the metrics module drains it.
        # Latency observers (seconds); the metrics module plugs Prometheus histograms in.
        self.observe_app_latency: Callable[[float], None] = _ignore
        self.observe_dlq_latency: Callable[[float], None] = _ignore
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
        )
        app = config.app
        self.app = app_client_for(config)
        self.dlq = dlq_writer_for(config)
        dlq = config.errors.dlq
        self.transactional = dlq.transactional_enable and dlq.enabled
        if self.transactional:
            self.dlq.transactional_id = default_transactional_id(config)
        self._txn_items: list[_TxnItem] = []
        self._txn_wake = trio.Event()
        self._commit_guard = trio.Lock()
        self._dlq_write_done = trio.Event()
        self.source = KafkaSource(config.kafka, config.source.topics, self)
        self.slots: dict[PartitionKey, _Slot] = {}
        self._pending_assign: dict[PartitionKey, AssignedPartition] = {}
        self._deliveries: dict[
            str, tuple[_Slot, str]
        ] = {}  # delivery id -> (slot, ledger attempt id)
        self._epoch = 0
        self._kick = trio.Event()
        self._work_send, self._work_recv = trio.open_memory_channel[tuple[_Slot, Any, str]](
            math.inf
        )
        self._rand = random.Random()
        self.counters = Counters()
        self.app_reachable = True
        self.app_down_since: float | None = None
        self.draining = False
        self.stopping = False
        self.failure: str | None = None
        self.started_at = time.time()
        self._nursery: trio.Nursery | None = None
        self._archiving_offsets: set[tuple[str, int, int]] = set()
        self.dlq_ready = not config.errors.dlq.enabled
        # Since when every commit has failed (None: the last one succeeded). No commit means no
        # hand-out: write-ahead delivery counts must be stored first.
        self.commit_failing_since: float | None = None
        self._sending = 0  # attempts handed to workers and not yet answered over HTTP
        # Acquired records whose new delivery counts are not yet committed (write-ahead): the
        # hand-out task commits them as one group while the scheduler goes on acquiring.
        self._awaiting: list[tuple[_Slot, Any]] = []
        self._awaiting_wake = trio.Event()
        self._send_capacity = app.max_in_flight * (
            app.batch_max_records if app.mode == AppMode.BATCH else 1
        )
        self._rr = 0
        self._batch_fill_lock = trio.Lock()
        self.stop_event = trio.Event()
        self.drain_cancel = trio.CancelScope()

    def attach(self, nursery: trio.Nursery) -> None:
        """The nursery that runs the engine's short-lived tasks (DLQ writes, app probes)."""
        self._nursery = nursery

    def request_stop(self) -> None:
        self.stop_event.set()
        self.kick()

    def stalled(self) -> str | None:
        """Why the sidecar cannot make progress and should be restarted (None: it can).

        Every commit failing for `commit.stall.timeout.ms` means nothing is handed out (delivery
        counts are committed first) and nothing is marked done. A broker that is down recovers by
        itself; a consumer whose group coordinator lookup is wedged inside librdkafka does not,
        and a new process with a new consumer does. /healthz reports it so a liveness probe acts.
        """
        limit_ms = self.config.commit_stall_timeout_ms
        since = self.commit_failing_since
        if limit_ms <= 0 or since is None or self.stopping:
            return None
        failing_s = time.monotonic() - since
        if failing_s * 1000 < limit_ms:
            return None
        return f"every offset commit has failed for {failing_s:.0f}s (commit.stall.timeout.ms)"

    def readiness(self) -> dict[str, bool]:
        return {
            "assigned": bool(self.source.assigned),
            "broker_reachable": self.source.broker_ok,
            "app_reachable": self.app_reachable,
            "dlq_writable": self.dlq_ready and self.failure is None,
            "commits_ok": self.commit_failing_since is None
            or time.monotonic() - self.commit_failing_since < COMMITS_FAILING_NOT_READY_S,
        }

    # ----------------------------------------------------------------------------- wake-ups

    def kick(self) -> None:
        self._kick.set()

    async def _wait_kick(self, timeout_s: float) -> None:
        with trio.move_on_after(max(0.0, timeout_s)):
            await self._kick.wait()
        self._kick = trio.Event()

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

    def _open_slot(self, key: PartitionKey, start_offset: int, metadata: str | None) -> _Slot:
        restored = None
        if metadata:
            restored = decode_state(metadata)
            if restored is None:
                log.warning(
                    "commit metadata of %s[%d] is not ours or is corrupt; starting without delivery state",
                    key[0],
                    key[1],
                )
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
        slot = _Slot(ledger, self._epoch)
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
        with trio.move_on_after(REVOKE_DLQ_WAIT_S):
            while any(s.dlq_writes for s in revoking) and not self.stopping:
                self._dlq_write_done = trio.Event()
                await self._dlq_write_done.wait()
        for key in partitions:
            self._pending_assign.pop(key, None)
            slot = self.slots.pop(key, None)
            if slot is None:
                continue
            slot.ledger.revoke()
            self._forget_deliveries(slot)
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
                slot.ledger.revoke()
                self._forget_deliveries(slot)
        self.kick()

    def _forget_deliveries(self, slot: _Slot) -> None:
        for did in [d for d, (s, _) in self._deliveries.items() if s is slot]:
            del self._deliveries[did]

    async def on_messages(self, messages: Sequence[Message]) -> None:
        now = now_ms()
        for msg in messages:
            key = (cast(str, msg.topic()), cast(int, msg.partition()))
            offset = cast(int, msg.offset())
            slot = self.slots.get(key)
            if slot is None:
                pending = self._pending_assign.pop(key, None)
                if pending is None:
                    continue  # fetched just before a revoke: the next owner reads it again
                slot = self._open_slot(key, offset, None)
            slot.ledger.add(offset, key_bytes(msg), msg, now)
        self._apply_flow_control()
        self.kick()

    # ----------------------------------------------------------------------------- flow control

    def _apply_flow_control(self) -> None:
        to_pause: list[PartitionKey] = []
        to_resume: list[PartitionKey] = []
        for key, slot in self.slots.items():
            paused = key in self.source.paused
            if self.draining or not self.app_reachable:
                if not paused:
                    to_pause.append(key)
            elif not paused and slot.ledger.should_pause():
                to_pause.append(key)
                st = slot.ledger.statistics()
                lc = self.ledger_config
                if st.buffered < lc.max_buffered_records and st.in_flight < lc.max_record_locks:
                    # Neither record limit: the delivery state nears offset.metadata.max.bytes.
                    self.counters.metadata_pauses += 1
                    log.warning(
                        "pausing %s[%d]: its delivery state nears offset.metadata.max.bytes",
                        key[0],
                        key[1],
                    )
            elif paused and slot.ledger.may_resume():
                to_resume.append(key)
        if to_pause:
            self.source.pause(to_pause)
        if to_resume:
            self.source.resume(to_resume)

    # ----------------------------------------------------------------------------- scheduler

    async def scheduler(self) -> None:
        """Expire locks, acquire records, start DLQ writes, pause/resume — whenever something
        changed; and the hand-out task that commits acquired records' counts and sends them."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.hand_out_loop)
            await self._schedule_loop()
            nursery.cancel_scope.cancel()

    async def _schedule_loop(self) -> None:
        max_total = self.config.delivery.max_in_flight_records
        while not self.stopping:
            now = now_ms()
            for slot in list(self.slots.values()):
                for expired in slot.ledger.expire(now):
                    self._on_expired(slot, expired)
            acquired: list[tuple[_Slot, Any]] = []
            may_acquire = False  # every partition was offered room: no retry time is pending
            if self.app_reachable and not self.draining and self.dlq_ready:
                # Acquire no more than the workers can send right away: an acquired record's
                # attempt is counted (and persisted) before it is sent, so one that waited in a
                # queue while the process crashed would be charged an attempt it never had.
                # Records acquired while the write-ahead commit of the previous round is under
                # way wait for the next one (group commit), within the same capacity: a record
                # never waits in a queue after its count is stored, and with one in flight an
                # answer is committed before the next record leaves (a crash on that record
                # does not charge the one before it).
                waiting = len(self._awaiting)
                budget = min(
                    max_total - len(self._deliveries) - waiting,
                    self._send_capacity - self._sending - waiting,
                )
                slots = list(self.slots.values())
                if slots:
                    # Rotate the starting partition so a busy one cannot starve the others.
                    self._rr = (self._rr + 1) % len(slots)
                    slots = slots[self._rr :] + slots[: self._rr]
                for slot in slots:
                    if budget <= 0:
                        break
                    if slot.revoking:
                        continue
                    got = slot.ledger.acquire(now, budget)
                    budget -= len(got)
                    acquired.extend((slot, a) for a in got)
                may_acquire = budget > 0
            if acquired or self._deliveries:
                self.source.mark_busy()
            if acquired:
                if self.write_ahead:
                    self._awaiting.extend(acquired)
                    self._awaiting_wake.set()
                else:
                    self._hand_out(acquired)
            self._start_archiving()
            self._apply_flow_control()
            wait_s = self._next_wait_s(now_ms(), may_acquire)
            await self._wait_kick(wait_s)

    def _next_wait_s(self, now: int, may_acquire: bool) -> float:
        # A retry time that has come only matters when a record could be acquired now: with no
        # room (every send slot taken or waiting for its commit), intake paused (app down,
        # draining) or the partition being revoked, waking for it would spin until that changes,
        # and every change of that kind kicks the scheduler anyway. Lock expiry always matters.
        deadlines = [
            d
            for s in self.slots.values()
            if (
                d := (
                    s.ledger.next_deadline_ms()
                    if may_acquire and not s.revoking
                    else s.ledger.next_lock_deadline_ms()
                )
            )
            is not None
        ]
        if not deadlines:
            return 0.5
        return min(0.5, max(0.0, (min(deadlines) - now) / 1000))

    async def hand_out_loop(self) -> None:
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

    def _return_unsent(self, batch: list[tuple[_Slot, Any]]) -> None:
        """Acquired records that will not be sent go back without counting the attempt."""
        now = now_ms()
        for slot, attempt in batch:
            if self.slots.get((slot.ledger.topic, slot.ledger.partition)) is slot:
                with contextlib.suppress(L.LedgerError):
                    slot.ledger.not_attempted(attempt.attempt_id, now)

    def _hand_out(self, acquired: list[tuple[_Slot, Any]]) -> None:
        for slot, attempt in acquired:
            if self.slots.get((slot.ledger.topic, slot.ledger.partition)) is not slot:
                continue  # revoked while the commit was in flight: fenced
            delivery_id = attempt.attempt_id  # unique per assignment epoch (the ledger adds it)
            self._deliveries[delivery_id] = (slot, attempt.attempt_id)
            self.counters.attempts += 1
            self._sending += 1
            self._work_send.send_nowait((slot, attempt, delivery_id))

    def _on_expired(self, slot: _Slot, expired: L.AnswerResult) -> None:
        self._deliveries.pop(expired.attempt_id, None)
        self.counters.bump(self.counters.delivered, "lock_expired")
        self.counters.bump(self.counters.by_topic, (slot.ledger.topic, "lock_expired"))

    # ----------------------------------------------------------------------------- workers

    async def worker(self) -> None:
        timeout_s = self.config.app.timeout_ms / 1000
        batch = self.config.app.mode == AppMode.BATCH
        max_batch = self.config.app.batch_max_records
        while True:
            item = await self._work_recv.receive()
            if not batch:
                try:
                    await self._deliver_one(item, timeout_s)
                finally:
                    self._sending -= 1
                    self.kick()
                continue
            items = [item]
            # One worker fills a batch at a time; idle workers each lingering with one record
            # would otherwise send many nearly empty batches.
            async with self._batch_fill_lock:
                while len(items) < max_batch:
                    try:
                        items.append(self._work_recv.receive_nowait())
                    except trio.WouldBlock:
                        break
                if len(items) < max_batch and self.config.app.batch_linger_ms > 0:
                    with trio.move_on_after(self.config.app.batch_linger_ms / 1000):
                        while len(items) < max_batch:
                            items.append(await self._work_recv.receive())
            try:
                await self._deliver_batch(items, timeout_s)
            finally:
                self._sending -= len(items)
                self.kick()

    def _record_view(self, attempt: Any, delivery_id: str) -> RecordView:
        return record_view(cast(Message, attempt.item), attempt.delivery_count, delivery_id)

    def _start_span(self, record: RecordView) -> tuple[RecordView, AttemptContext | None]:
        return start_attempt_span(self.tracing, record)

    def _end_span(
        self, actx: AttemptContext | None, record: RecordView, answer: Answer | None
    ) -> None:
        end_attempt_span(actx, record, answer, self._attempt_spans)

    async def _deliver_one(self, item: tuple[_Slot, Any, str], timeout_s: float) -> None:
        slot, attempt, delivery_id = item
        if delivery_id not in self._deliveries:
            return  # fenced before it left
        record, actx = self._start_span(self._record_view(attempt, delivery_id))
        started = time.perf_counter()
        try:
            answer = await self.app.deliver(record, timeout_s)
        except AppNotReachable as exc:
            self._end_span(actx, record, None)
            self._not_attempted(slot, attempt, delivery_id, str(exc))
            return
        except BaseException:
            # Cancelled (shutdown) or a bug: the span still ends, the lock expiry handles the record.
            if actx is not None:
                Tracing.end_attempt(
                    actx, "abandoned", "sidecar.Shutdown", "the sidecar stopped mid-attempt"
                )
            raise
        self.observe_app_latency(time.perf_counter() - started)
        self._end_span(actx, record, answer)
        self._apply_answer(delivery_id, answer)

    async def _deliver_batch(self, items: list[tuple[_Slot, Any, str]], timeout_s: float) -> None:
        live = [it for it in items if it[2] in self._deliveries]
        if not live:
            return
        traced = [self._start_span(self._record_view(a, d)) for _s, a, d in live]
        records = [r for r, _ in traced]
        started = time.perf_counter()
        try:
            answers = await self.app.deliver_batch(records, timeout_s)
        except AppNotReachable as exc:
            for (record, actx), (slot, attempt, delivery_id) in zip(traced, live, strict=True):
                self._end_span(actx, record, None)
                self._not_attempted(slot, attempt, delivery_id, str(exc))
            return
        except BaseException:
            for _record, actx in traced:
                if actx is not None:
                    Tracing.end_attempt(
                        actx, "abandoned", "sidecar.Shutdown", "the sidecar stopped mid-attempt"
                    )
            raise
        self.observe_app_latency(time.perf_counter() - started)
        for (record, actx), (_slot, _attempt, delivery_id) in zip(traced, live, strict=True):
            answer = answers.get(delivery_id) or Answer(
                "release", reason="missing from the batch answer"
            )
            self._end_span(actx, record, answer)
            self._apply_answer(delivery_id, answer)

    def _not_attempted(self, slot: _Slot, attempt: Any, delivery_id: str, reason: str) -> None:
        self._deliveries.pop(delivery_id, None)
        self.counters.not_attempted += 1
        self.counters.attempts -= 1
        if self.slots.get((slot.ledger.topic, slot.ledger.partition)) is slot:
            with contextlib.suppress(L.LedgerError):
                slot.ledger.not_attempted(attempt.attempt_id, now_ms())
        if self.app_reachable:
            log.warning("the app is not reachable (%s): pausing intake until it is back", reason)
            self.app_reachable = False
            self.app_down_since = time.monotonic()
            self._apply_flow_control()
            if self._nursery is not None:
                self._nursery.start_soon(self._probe_app)
        self.kick()

    async def _probe_app(self) -> None:
        app = self.config.app
        delay_s = app.connect_backoff_initial_ms / 1000
        while not self.stopping:
            await trio.sleep(delay_s)
            try:
                await _probe(self.app.target)
            except OSError:
                delay_s = min(delay_s * 2, app.connect_backoff_max_ms / 1000)
                continue
            log.info("the app is reachable again: resuming intake")
            self.app_reachable = True
            self.app_down_since = None
            self._apply_flow_control()
            self.kick()
            return

    def _apply_answer(self, delivery_id: str, answer: Answer | AckItem) -> str:
        """Apply an app answer; returns 'ok', 'unknown' or 'expired' (the /v1/acks result words)."""
        entry = self._deliveries.get(delivery_id)
        if entry is None:
            # Answered already, expired, or fenced by a rebalance: let the ledger that issued it say
            # which, if that partition is still ours; otherwise an id of our shape is expired.
            slot_or_none = self._slot_for_id(delivery_id)
            if slot_or_none is None:
                self.counters.expired_answers += 1
                return "expired" if _looks_like_attempt_id(delivery_id) else "unknown"
            entry = (slot_or_none, delivery_id)
        slot, attempt_id = entry
        if isinstance(answer, Answer) and answer.ack == "deferred":
            return "ok"  # the app answers later through /v1/acks, before the lock expires
        ack = _ACKS[answer.ack]
        error = None
        if answer.error is not None:
            error = L.ErrorInfo(
                answer.error.class_name or None,
                answer.error.message or None,
                answer.error.stacktrace,
            )
        try:
            result = slot.ledger.answer(
                attempt_id, ack, now_ms(), error=error, retry_after_ms=answer.retry_after_ms
            )
        except L.ExpiredAttempt:
            self._deliveries.pop(delivery_id, None)
            self.counters.expired_answers += 1
            return "expired"
        except L.UnknownAttempt:
            self._deliveries.pop(delivery_id, None)
            self.counters.expired_answers += 1
            return "unknown"
        if ack is not L.Ack.RENEW:
            self._deliveries.pop(delivery_id, None)
            self.counters.bump(self.counters.delivered, answer.ack)
            self.counters.bump(self.counters.by_topic, (slot.ledger.topic, answer.ack))
            if ack is L.Ack.REJECT and (answer.dlq_headers or answer.dlq_value_set):
                slot.dlq_extras[result.offset] = answer
        self.kick()
        return "ok"

    def _slot_for_id(self, delivery_id: str) -> _Slot | None:
        topic, sep, rest = delivery_id.partition("/")
        partition, sep2, _ = rest.partition("/")
        if not sep or not sep2 or not partition.isdigit():
            return None
        return self.slots.get((topic, int(partition)))

    def ack(self, items: Sequence[AckItem]) -> list[tuple[str, str]]:
        """`POST /v1/acks`: apply each answer; per id ok / unknown / expired."""
        return [(item.delivery_id, self._apply_answer(item.delivery_id, item)) for item in items]

    # ----------------------------------------------------------------------------- DLQ

    def _start_archiving(self) -> None:
        assert self._nursery is not None
        for slot in list(self.slots.values()):
            for req in slot.ledger.to_archive():
                slot.dlq_writes += 1
                self._nursery.start_soon(self._archive_counted, slot, req)

    async def _archive_counted(self, slot: _Slot, req: Any) -> None:
        try:
            await self._archive(slot, req)
        finally:
            slot.dlq_writes -= 1
            self._dlq_write_done.set()

    async def _archive(self, slot: _Slot, req: Any) -> None:
        msg = cast(Message, req.item)
        topic, partition = slot.ledger.topic, slot.ledger.partition
        reason = "rejected" if req.reason is L.ArchiveReason.REJECTED else "delivery_count_exceeded"
        extras = slot.dlq_extras.pop(req.offset, None)
        err = req.error
        if err is None and req.reason is L.ArchiveReason.DELIVERY_COUNT_EXCEEDED:
            err = L.ErrorInfo(
                "sidecar.DeliveryCountExceeded", "released or timed out at the delivery limit", None
            )
        if self.config.errors.tolerance == ErrorsTolerance.NONE:
            self.fail(
                f"errors.tolerance is none and {topic}[{partition}]@{req.offset} was archived ({reason}"
                f"{': ' + err.class_name if err and err.class_name else ''}); stopping with its offset uncommitted"
            )
            return
        self._log_archived(msg, req, reason, err)
        dlq_topic = self.config.dlq_topic_for(topic)
        if dlq_topic is None:
            # No DLQ configured: archived records are logged and skipped (KIP-1191).
            if self._still_owned(slot):
                slot.ledger.dlq_written(req.offset)
            self.counters.bump(self.counters.archived, reason)
            self.kick()
            return
        failed = FailedRecord(
            topic=topic,
            partition=partition,
            offset=req.offset,
            key=key_bytes(msg),
            value=value_bytes(msg),
            headers=message_headers(msg),
            group=self.config.group_id,
            delivery_count=req.delivery_count,
            cause=CAUSE_REJECTED
            if req.reason is L.ArchiveReason.REJECTED
            else CAUSE_DELIVERY_COUNT,
            exception_class=err.class_name if err else None,
            exception_message=err.message if err else None,
            stacktrace=err.stacktrace if err else None,
            extra_headers=extras.dlq_headers if extras else (),
            replacement_value=extras.dlq_value if extras else None,
            replacement_value_set=extras.dlq_value_set if extras else False,
        )
        span = None
        last_attempt = self._attempt_spans.pop((topic, partition, req.offset), None)
        if self.tracing.enabled:
            headers = dict(failed.headers)
            tp, ts = headers.get("traceparent"), headers.get("tracestate")
            span, trace_headers = self.tracing.start_dlq_write(
                source_topic=topic,
                partition=partition,
                offset=req.offset,
                dlq_topic=dlq_topic,
                reason=reason,
                traceparent=tp.decode("latin-1") if tp else None,
                tracestate=ts.decode("latin-1") if ts else None,
                links=[trace.Link(last_attempt)] if last_attempt is not None else [],
            )
            # The DLQ record carries the write's context (overriding a copied traceparent).
            failed = dataclasses.replace(
                failed, extra_headers=(*failed.extra_headers, *trace_headers)
            )
        started = time.perf_counter()
        try:
            if self.transactional:
                # The batcher marks the record done inside the transaction that commits its offset.
                if not await self._txn_write(slot, req.offset, failed, dlq_topic):
                    if span is not None:
                        span.end()
                    return  # the new owner of the partition archives it
            else:
                await self.dlq.write(failed, dlq_topic)
        except DlqFatalError as exc:
            self.counters.dlq_failed += 1
            if span is not None:
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
                span.add_event(
                    "exception",
                    {"exception.type": "sidecar.DlqWriteFailed", "exception.message": str(exc)},
                )
                span.end()
            self.fail(str(exc))
            return
        except BaseException:
            if span is not None:
                span.end()
            raise
        self.observe_dlq_latency(time.perf_counter() - started)
        if span is not None:
            span.end()
        self.counters.dlq_written += 1
        self.counters.bump(self.counters.archived, reason)
        if not self.transactional and self._still_owned(slot):
            slot.ledger.dlq_written(req.offset)
        self.kick()

    async def _txn_write(
        self, slot: _Slot, offset: int, failed: FailedRecord, dlq_topic: str
    ) -> bool:
        """True once written and committed; False when the partition went to another owner first."""
        item = _TxnItem(slot, offset, failed, dlq_topic)
        self._txn_items.append(item)
        self._txn_wake.set()
        await item.done.wait()
        if item.error is not None:
            raise DlqFatalError(item.error)
        return not item.skipped

    async def txn_loop(self) -> None:
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
            self.kick()

    async def _txn_once(self, items: list[_TxnItem]) -> str | None:
        """Commit `items` in one transaction, redoing it until it commits; None, or why it cannot.

        Sets `skipped` on the items left out because their partition went to another owner: the
        next owner archives those (writing their DLQ record here too would duplicate it there).
        """
        async with self._commit_guard:
            give_up_at = trio.current_time() + TXN_COMMIT_DEADLINE_S
            marked: set[int] = set()  # ids of the items the ledger already counts as done
            delay_s = 0.5
            while True:
                batch = [it for it in items if self._still_owned(it.slot)]
                try:
                    if batch:
                        await self._txn_attempt(batch, marked)
                    for it in items:
                        it.skipped = it not in batch
                    return None
                except DlqTxnAbortable as exc:
                    reason = str(exc)
                    try:
                        await self.dlq.txn_abort()
                    except DlqFatalError as abort_exc:
                        return await self._txn_fatal(items, marked, str(abort_exc))
                except DlqFatalError as exc:
                    return await self._txn_fatal(items, marked, str(exc))
                except (
                    Exception
                ) as exc:  # the batch's dispatch boundary: stop, never crash the loop
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

    async def _txn_attempt(self, batch: list[_TxnItem], marked: set[int]) -> None:
        """One transaction: the DLQ records of `batch`, then the offsets of their partitions.

        The ledger must count a record done before its offset can be committed, and cannot take that
        back: an aborted attempt is redone (under the commit guard, so no plain commit passes the
        records meanwhile) with the same records, so the redone transaction commits what the ledger
        already says.
        """
        await self.dlq.txn_begin()
        await self._txn_produce_all(batch)
        if not all(self._still_owned(it.slot) for it in batch):
            # Revoked or lost while the records were written: without the partition's offset in the
            # transaction, its DLQ record would be committed and written again by the next owner.
            raise DlqTxnAbortable("a partition went to another owner during the transaction")
        slots: dict[int, _Slot] = {}
        for it in batch:
            if id(it) not in marked:
                it.slot.ledger.dlq_written(it.offset)
                it.slot.txn_uncommitted = True
                marked.add(id(it))
            slots[id(it.slot)] = it.slot
        pending = self._commit_offsets(list(slots.values()), force=True)
        tps = [
            TopicPartition(o.topic, o.partition, o.offset, metadata=o.metadata) for _, o in pending
        ]
        await self.dlq.txn_commit(tps, self.source.group_metadata())
        for sl in slots.values():
            sl.txn_uncommitted = False
        for sl, o in pending:
            sl.last_commit = (o.offset, o.metadata)
        self.counters.commits += 1

    async def _txn_produce_all(self, batch: list[_TxnItem]) -> None:
        """Produce the batch's DLQ records at once and wait for every acknowledgement.

        One at a time, each record waited out the producer's linger and a round trip, and the
        transaction (which holds the commit guard, so every write-ahead commit waits) with it.
        The first fatal error wins over an abortable one.
        """
        errors: list[DlqFatalError | DlqTxnAbortable] = []

        async def one(it: _TxnItem) -> None:
            try:
                await self.dlq.txn_produce(it.failed, it.dlq_topic)
            except (DlqFatalError, DlqTxnAbortable) as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            for it in batch:
                nursery.start_soon(one, it)
        fatal = [e for e in errors if isinstance(e, DlqFatalError)]
        if fatal or errors:
            raise (fatal or errors)[0]

    async def _txn_fatal(self, items: list[_TxnItem], marked: set[int], reason: str) -> str:
        """Stop: drop the partitions whose ledger counts records of an uncommitted transaction done,
        so no commit (the final one, the revoke's) passes them; the next owner reads them again.

        The open transaction is ended first if it can be (an abort, or fencing by a new producer),
        so its offsets do not stay pending (unreadable to read_committed offset fetches) until the
        transaction times out or the next incarnation starts.
        """
        for it in items:
            if id(it) in marked and self._still_owned(it.slot):
                key = (it.slot.ledger.topic, it.slot.ledger.partition)
                self.slots.pop(key, None)
                it.slot.ledger.revoke()
                self._forget_deliveries(it.slot)
        with contextlib.suppress(DlqFatalError):
            await self.dlq.txn_abort()
        return f"fatal: {reason}"

    def _still_owned(self, slot: _Slot) -> bool:
        return self.slots.get((slot.ledger.topic, slot.ledger.partition)) is slot

    def _log_archived(self, msg: Message, req: Any, reason: str, err: L.ErrorInfo | None) -> None:
        errors = self.config.errors
        if not errors.log_enable:
            return
        extra: dict[str, Any] = {
            "topic": msg.topic(),
            "partition": msg.partition(),
            "offset": msg.offset(),
            "delivery_count": req.delivery_count,
            "reason": reason,
            "exception_class": err.class_name if err else None,
            "exception_message": err.message if err else None,
        }
        if errors.log_include_messages:
            extra["key"] = _printable(msg.key())
            extra["value"] = _printable(msg.value())
        last = self._attempt_spans.get(
            (cast(str, msg.topic()), cast(int, msg.partition()), cast(int, msg.offset()))
        )
        if last is not None and last.is_valid:
            extra["trace_id"] = f"{last.trace_id:032x}"
            extra["span_id"] = f"{last.span_id:016x}"
        log.error("record archived", extra={"fields": extra})

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            log.error("stopping: %s", reason)
        self.stopping = True
        self.stop_event.set()
        self.kick()

    # ----------------------------------------------------------------------------- commits

    def _commit_offsets(
        self, slots: Sequence[_Slot], force: bool
    ) -> list[tuple[_Slot, OffsetToCommit]]:
        out: list[tuple[_Slot, OffsetToCommit]] = []
        for slot in slots:
            if not self._still_owned(slot):
                continue
            offset = slot.ledger.committable_offset()
            metadata = slot.ledger.encode_metadata()
            if not force and slot.last_commit == (offset, metadata):
                continue
            out.append(
                (slot, OffsetToCommit(slot.ledger.topic, slot.ledger.partition, offset, metadata))
            )
        return out

    async def _commit_slots(self, slots: Sequence[_Slot], force: bool = False) -> bool:
        async with self._commit_guard:
            return await self._commit_slots_locked(slots, force)

    async def _commit_slots_locked(self, slots: Sequence[_Slot], force: bool) -> bool:
        pending = self._commit_offsets(slots, force)
        if not pending:
            return True
        try:
            await self.source.commit([o for _, o in pending])
        except (
            Exception
        ) as exc:  # a failed commit is retried by the next one: redelivery, never loss
            self.counters.commit_failures += 1
            if self.commit_failing_since is None:
                self.commit_failing_since = time.monotonic()
            log.warning("commit failed: %s", exc)
            return False
        self.counters.commits += 1
        self.commit_failing_since = None
        for slot, o in pending:
            slot.last_commit = (o.offset, o.metadata)
        return True

    async def committer(self) -> None:
        interval_s = self.config.commit_interval_ms / 1000
        while not self.stopping:
            await trio.sleep(interval_s)
            await self._commit_slots(list(self.slots.values()))

    async def commit_all(self) -> None:
        if self.stopping and self._awaiting:
            # Stopping: records still waiting for their write-ahead commit were never sent.
            batch, self._awaiting = self._awaiting, []
            self._return_unsent(batch)
        await self._commit_slots(list(self.slots.values()))

    # ----------------------------------------------------------------------------- lifecycle

    def in_flight_records(self) -> int:
        return len(self._deliveries)

    async def drain(self, deadline_s: float) -> None:
        """Stop handing out records and wait (up to the deadline) for in-flight attempts and DLQ writes."""
        self.draining = True
        self._apply_flow_control()
        self.kick()
        with self.drain_cancel, trio.move_on_after(deadline_s):
            while True:
                busy = any(
                    (st := s.ledger.statistics()).in_flight > 0 or st.archiving > 0
                    for s in self.slots.values()
                )
                if not busy or self.failure:
                    return
                await trio.sleep(0.05)

    def status(self) -> dict[str, Any]:
        lag = self.source.lag() if not self.stopping else {}
        partitions = []
        for (topic, partition), slot in sorted(self.slots.items()):
            st = slot.ledger.statistics()
            partitions.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "committable_offset": st.committable_offset,
                    "last_committed_offset": slot.last_commit[0] if slot.last_commit else None,
                    "in_flight": st.in_flight,
                    "buffered": st.buffered,
                    "archiving": st.archiving,
                    "paused": (topic, partition) in self.source.paused,
                    "lag": lag.get((topic, partition)),
                }
            )
        for topic, partition in sorted(self._pending_assign):
            # Assigned with no committed offset and nothing fetched yet: no ledger so far.
            partitions.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "committable_offset": None,
                    "last_committed_offset": None,
                    "in_flight": 0,
                    "buffered": 0,
                    "archiving": 0,
                    "paused": (topic, partition) in self.source.paused,
                    "lag": lag.get((topic, partition)),
                }
            )
        c = self.counters
        return {
            "group": self.config.group_id,
            "engine": "consumer",
            "app_reachable": self.app_reachable,
            "draining": self.draining,
            "failure": self.failure,
            "uptime_s": round(time.time() - self.started_at, 3),
            # Seconds every commit has been failing (null: the last one succeeded).
            "commits_failing_s": None
            if self.commit_failing_since is None
            else round(time.monotonic() - self.commit_failing_since, 3),
            "in_flight": self.in_flight_records(),
            "paused_partitions": [f"{t}[{p}]" for t, p in sorted(self.source.paused)],
            "partitions": partitions,
            "counters": {
                "delivered": dict(c.delivered),
                "attempts": c.attempts,
                "not_attempted": c.not_attempted,
                "archived": dict(c.archived),
                "dlq_written": c.dlq_written,
                "dlq_failed": c.dlq_failed,
                "expired_answers": c.expired_answers,
                "commits": c.commits,
                "commit_failures": c.commit_failures,
                "rebalances": c.rebalances,
            },
        }


def _printable(data: bytes | None) -> str | None:
    if data is None:
        return None
    return data[:1024].decode("utf-8", errors="backslashreplace")


async def _probe(target: AppTarget) -> None:
    """Open and close one connection to the app: OSError when nothing is listening."""
    stream: trio.abc.Stream
    with trio.fail_after(2):
        if target.unix_path is not None:
            stream = await trio.open_unix_socket(target.unix_path)
        else:
            stream = await trio.open_tcp_stream(target.host, target.port)
    await stream.aclose()


def _ignore(_seconds: float) -> None:
    return None


def _looks_like_attempt_id(delivery_id: str) -> bool:
    # The ledger's ids are "topic/partition/offset/epoch.seq" (a topic name cannot hold "/").
    parts = delivery_id.split("/")
    if len(parts) != 4 or not (parts[1].isdigit() and parts[2].isdigit()):
        return False
    epoch, dot, seq = parts[3].partition(".")
    return bool(dot) and epoch.isdigit() and seq.isdigit()


__all__ = ["Engine", "now_ms"]
