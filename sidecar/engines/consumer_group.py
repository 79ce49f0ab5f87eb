"""The consumer-group engine (`engine: consumer`): delivery state in per-partition ledgers and commits.

The pipeline (:mod:`sidecar.pipeline`) sends records to the app and applies answers; this adapter owns
the part that is particular to a consumer group: the Kafka source, one ledger per assigned partition,
crash accounting (a horizon committed ahead of the hand-outs and the isolation pass after an unclean
stop; or, selectable with `write_ahead=True`, the older write-ahead commit of every hand-out), offset
commits with the delivery state in their metadata, and the optional transactional DLQ::

    source (poll thread) ──on_messages──▶ ledgers ──scheduler──▶ hand-out ──▶ pipeline workers ──▶ app
                                             ▲                                       │
                                             └──────── answered() ◀──────────────────┘  (and /v1/acks)
    ledgers ──to_archive──▶ archive tasks ──pipeline.dead_letter()──▶ DLQ ──▶ ledgers (dlq_written)
    committer / hand-out / txn_loop ──▶ Kafka offsets + metadata

Who may change a partition's ledger (`_Slot.ledger`). This adapter is its only owner: the pipeline
never sees a ledger, only `Delivery` values whose `ref` points into one. Every call is synchronous
and runs in the trio thread, so no two transitions interleave:

    task                              ledger calls
    source callbacks (via trio)       add (on_messages), revoke (on_revoked, on_lost), opening a slot
    scheduler                         expire, acquire, to_archive, should_pause / may_resume,
                                      isolate (horizon mode, nothing in flight in the process)
    hand-out (write-ahead mode)       not_attempted (write-ahead commit failed: not sent)
    workers, API request (answered)   answer
    workers (not_reached)             not_attempted
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
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import trio
from confluent_kafka import KafkaException, Message, TopicPartition

from sidecar.config import AppMode, Config
from sidecar.core import ledger as L
from sidecar.core.backoff import RetryPolicy
from sidecar.core.budget import record_bytes, split_budget
from sidecar.core.commitstate import DEFAULT_MAX_ENTRIES, CommitStateError
from sidecar.core.commitstate import parse as parse_state
from sidecar.core.deadletter import ArchiveOutcome, FailedRecord
from sidecar.core.errors import CommitFailed
from sidecar.core.outcome import Ack, error_info
from sidecar.core.record import Tracked, source_record
from sidecar.core.wire import AckItem, Answer
from sidecar.engines.pipeline import AckResult, Delivery, PartitionKey, Pipeline
from sidecar.kafka.dlq import DlqFatalError, DlqTxnAbortable
from sidecar.kafka.source import (
    AssignedPartition,
    CommitTimeout,
    KafkaSource,
    OffsetToCommit,
)

log = logging.getLogger("sidecar.engine")

# How long a revoke waits for the partition's DLQ writes under way (bounded: the rebalance waits too).
REVOKE_DLQ_WAIT_S = 10.0
# Readiness reports `commits_ok: false` once every commit has failed for this long.
COMMITS_FAILING_NOT_READY_S = 30.0
# A batch of DLQ records whose transaction is aborted for a retriable reason (a broker restart, a
# rebalance, a stuck producer replaced) is redone; one not committed within this time stops the sidecar
# (exit 1) instead of wedging it.
TXN_COMMIT_DEADLINE_S = 120.0
# How long the shutdown waits for the poll loop's last consume() before closing the consumer.
POLL_STOP_WAIT_S = 5.0
# What a commit may raise: librdkafka's error, our own time limit on it, or a closed consumer.
_COMMIT_ERRORS = (KafkaException, CommitTimeout, RuntimeError)


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


def horizon_window(config: Config) -> int:
    """How far (in offsets) the committed horizon runs ahead of a partition's hand-outs.

    A commit is wanted when half of it is used, so the commit has half a window of hand-outs to
    land: with the poll thread's 100 ms timeout and a round trip, 64 offsets last ~370 ms at 1,000
    records/s over 6 partitions. The window is also how many never-delivered records an unclean
    stop leaves as suspects, each isolated alone (an app round trip and a commit) after a
    restart; so it follows what the app can take at once (twice its in-flight capacity, at least
    64), within `share.partition.max.record.locks` and `max.in.flight.records`.
    """
    d = config.delivery
    app = config.app
    capacity = app.max_in_flight * (app.batch_max_records if app.mode == AppMode.BATCH else 1)
    return max(2, min(d.partition_max_record_locks, d.max_in_flight_records, max(64, 2 * capacity)))


# glibc's mallopt parameter for the size from which allocations are mmapped.
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 128 * 1024


def fix_mmap_threshold() -> bool:
    """Keep large records' memory returnable to the system (glibc only; True if set).

    glibc raises its mmap threshold after every large free (up to 32 MiB), so once a 1 MiB record
    has been freed the next ones come from heap arenas, which keep their peak size: measured with
    the bench's 1 MiB backlog, peak RSS 157-165 MB against 139-141 MB with the threshold fixed at
    its initial 128 KiB (records below it are unaffected). `MALLOC_MMAP_THRESHOLD_` in the
    environment takes precedence.
    """
    if not sys.platform.startswith("linux") or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES))


def now_ms() -> int:
    # The ledger wants a clock that never goes backwards.
    return time.monotonic_ns() // 1_000_000


@dataclass(slots=True, eq=False)
class _Slot:
    """One partition's ledger plus what the engine keeps beside it."""

    ledger: L.PartitionLedger
    last_commit: tuple[int, str] | None = None
    # The live deliveries of this partition, by ledger attempt id (expiry and revoke find them).
    live: dict[str, Delivery] = field(default_factory=dict)
    dlq_writes: int = 0  # DLQ writes in progress for this partition
    revoking: bool = False  # no new acquisitions: the partition is being handed over
    # Transactional mode: the ledger counts records of a DLQ transaction that has not committed
    # (yet) as done, so its state must not be committed outside that transaction.
    txn_uncommitted: bool = False
    # Horizon mode: an isolation pass is under way (logged at its start and end).
    in_pass: bool = False
    # Horizon mode: the restored state has suspects to come (up to this offset); None once every
    # fetched record is past it and the pass is over, so steady state checks nothing per turn.
    suspect_top: int | None = None
    # Offsets the DLQ circuit breaker held on their way to the DLQ (ARCHIVING, not written):
    # AVAILABLE again once it is half-open or closed (`release_held`).
    held: list[int] = field(default_factory=list)


# One partition's commit: what goes to the broker, and (horizon mode) the ledger's commit point.
_Pending = tuple[_Slot, OffsetToCommit, "L.CommitPoint | None"]


@dataclass(slots=True, eq=False)
class _TxnItem:
    slot: _Slot
    offset: int
    failed: FailedRecord
    dlq_topic: str
    done: trio.Event = field(default_factory=trio.Event)
    error: str | None = None
    skipped: bool = False  # the partition went to another owner before the transaction


class ConsumerGroupEngine:
    """The `DeliveryState` of a consumer group: ledgers, crash accounting, commits (see above)."""

    kind = "consumer"

    def __init__(self, pipe: Pipeline, *, write_ahead: bool = False) -> None:
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
        if self.transactional:
            self.dlq.transactional_id = default_transactional_id(config)
        self._txn_items: list[_TxnItem] = []
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
        self.slots: dict[PartitionKey, _Slot] = {}
        self._pending_assign: dict[PartitionKey, AssignedPartition] = {}
        self._epoch = 0
        self._kick = trio.Event()
        # Since when every commit has failed (None: the last one succeeded). No commit means no
        # hand-out: write-ahead delivery counts must be stored first.
        self.commit_failing_since: float | None = None
        # Acquired records whose new delivery counts are not yet committed (write-ahead): the
        # hand-out task commits them as one group while the scheduler goes on acquiring.
        self._awaiting: list[tuple[_Slot, L.Attempt]] = []
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

    def wake(self) -> None:
        self._kick.set()

    kick = wake

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

    # ----------------------------------------------------------------------------- wake-ups

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
        slot = _Slot(ledger)
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

    def _close_slot(self, slot: _Slot) -> None:
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
        self.kick()  # the scheduler's turn applies flow control (pause/resume) too

    # ----------------------------------------------------------------------------- flow control

    def _apply_flow_control(self) -> None:
        to_pause: list[PartitionKey] = []
        to_resume: list[PartitionKey] = []
        intake_closed = self.pipe.draining or not self.pipe.app_reachable or self.pipe.breaker_open
        # Each assigned partition's share of the byte budget. A partition over it is paused, and
        # resumed at half of it; what was fetched is always taken (see sidecar.core.budget), so
        # a record larger than a share is delivered and the partition resumes once it is done.
        share = self.budget.share_bytes(len(self.source.assigned) or len(self.slots))
        for key, slot in self.slots.items():
            paused = key in self.source.paused
            if intake_closed:
                if not paused:
                    to_pause.append(key)
            elif not paused and slot.ledger.should_pause(share):
                to_pause.append(key)
                st = slot.ledger.statistics()
                lc = self.ledger_config
                if (
                    st.buffered < lc.max_buffered_records
                    and st.buffered_bytes < share
                    and st.in_flight < lc.max_record_locks
                ):
                    # Neither record limit: the delivery state nears offset.metadata.max.bytes.
                    self.counters.metadata_pauses += 1
                    log.warning(
                        "pausing %s[%d]: its delivery state nears offset.metadata.max.bytes",
                        key[0],
                        key[1],
                    )
            elif paused and slot.ledger.may_resume(share):
                to_resume.append(key)
        if to_pause:
            self.source.pause(to_pause)
        if to_resume:
            self.source.resume(to_resume)

    # ----------------------------------------------------------------------------- scheduler

    async def _scheduler(self) -> None:
        """Expire locks, acquire records, start DLQ writes, pause/resume — whenever something
        changed; and the hand-out task that commits acquired records' counts and sends them."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._hand_out_loop)
            await self._schedule_loop()
            nursery.cancel_scope.cancel()

    async def _schedule_loop(self) -> None:
        pipe = self.pipe
        max_total = self.config.delivery.max_in_flight_records
        while not pipe.stopping:
            now = now_ms()
            for slot in list(self.slots.values()):
                for expired in slot.ledger.expire(now):
                    self.pipe.lock_expired(
                        slot.ledger.topic, slot.live.pop(expired.attempt_id, None), "lock_expired"
                    )
                    if slot.revoking:
                        self._revoke_progress.set()
            acquired: list[tuple[_Slot, L.Attempt]] = []
            may_acquire = False  # every partition was offered room: no retry time is pending
            exclusive = self.horizon and self._isolation_step(now)
            if exclusive:
                pass  # an isolated delivery goes alone in the whole process: no acquire anywhere
            elif pipe.app_reachable and not pipe.draining and pipe.dlq_ready:
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
                    max_total - pipe.in_flight_records() - waiting,
                    pipe.send_room() - waiting,
                )
                if (room := pipe.breaker_room()) is not None:
                    # The DLQ circuit breaker: none, or one probe (an acquired record waiting
                    # for its write-ahead commit is not issued yet, but it is the probe).
                    budget = min(budget, room - waiting)
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
            if not self.horizon and (acquired or pipe.in_flight_records()):
                # Write-ahead commits are on the records' path: keep the poll thread's
                # consume() timeouts short while records flow.
                self.source.mark_busy()
            if acquired:
                if self.write_ahead:
                    self._awaiting.extend(acquired)
                    self._awaiting_wake.set()
                else:
                    self._hand_out(acquired)
            self._start_archiving()
            self._apply_flow_control()
            if self.horizon:
                wanted = [s for s in self.slots.values() if s.ledger.horizon_wanted() is not None]
                if wanted:
                    self._commit_wake.set()
                    if any(s.ledger.horizon_status().held for s in wanted):
                        # The horizon commit fell behind the hand-outs (near saturation): records
                        # wait on it, so queued commits must not wait out a blocking poll.
                        self.source.mark_busy()
            wait_s = self._next_wait_s(now_ms(), may_acquire)
            await self._wait_kick(wait_s)

    def _isolation_step(self, now: int) -> bool:
        """Horizon mode: run the isolation passes; True while no partition may acquire.

        The exclusivity rule the ledger cannot see: while any partition's suspect is ready,
        charged, in flight or settling, nothing is acquired anywhere (a death must charge only
        the isolated record), and a suspect is isolated only with nothing in flight in the whole
        process and no other partition's isolated outcome waiting for its commit.
        """
        blocking = False
        candidates: list[_Slot] = []
        for slot in self.slots.values():
            if slot.suspect_top is None:
                continue
            ledger = slot.ledger
            if not ledger.statistics().isolation_active:
                if slot.in_pass:
                    self._pass_over(slot)
                if ledger.committable_offset() > slot.suspect_top:
                    slot.suspect_top = None  # every suspect is done: nothing more to isolate
                continue
            status = ledger.horizon_status()
            if not slot.in_pass and status.pass_active:
                slot.in_pass = True
                log.info(
                    "isolation pass on %s[%d]: %d suspects (records that may have been in flight "
                    "at an unclean stop) delivered one at a time",
                    ledger.topic,
                    ledger.partition,
                    status.suspects_left,
                )
            elif slot.in_pass and not status.pass_active:
                self._pass_over(slot)
            phase = status.isolation
            if phase is L.IsolationPhase.WAITING or phase is L.IsolationPhase.NONE:
                continue
            blocking = True
            if ledger.wants_isolation and not slot.revoking:
                candidates.append(slot)
        if not blocking:
            return False
        # Commits are on the isolated records' path: keep the poll thread's timeouts short.
        self.source.mark_busy()
        pipe = self.pipe
        idle = pipe.in_flight_records() == 0 and pipe.sending == 0
        if not candidates or not idle or not pipe.app_reachable or pipe.draining:
            return True
        if pipe.send_room() <= 0:
            return True  # pull mode with no poll waiting: charge a suspect only for a poll
        if pipe.breaker_room() == 0:
            return True  # the DLQ circuit breaker is open (or its probe is out)
        for slot in candidates:
            others_busy = any(
                o is not slot
                and o.ledger.horizon_status().isolation
                in (L.IsolationPhase.CHARGED, L.IsolationPhase.IN_FLIGHT, L.IsolationPhase.SETTLING)
                for o in self.slots.values()
            )
            if others_busy:
                continue
            if any(o.ledger.in_flight for o in self.slots.values()):
                break
            slot.ledger.isolate(now)
            self._commit_wake.set()
            break
        return True

    def _pass_over(self, slot: _Slot) -> None:
        slot.in_pass = False
        status = slot.ledger.horizon_status()
        log.info(
            "isolation pass over on %s[%d]: %d suspects, %d isolated deliveries; normal delivery",
            slot.ledger.topic,
            slot.ledger.partition,
            status.suspects_total,
            status.isolated_total,
        )

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
        # Every change that matters kicks the scheduler; the cap is only a safety net.
        cap_s = 0.5 if not self.horizon else 5.0
        if not deadlines:
            return cap_s
        return min(cap_s, max(0.0, (min(deadlines) - now) / 1000))

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

    def _return_unsent(self, batch: list[tuple[_Slot, L.Attempt]]) -> None:
        """Acquired records that will not be sent go back without counting the attempt."""
        now = now_ms()
        for slot, attempt in batch:
            if self._still_owned(slot):
                with contextlib.suppress(L.LedgerError):
                    slot.ledger.not_attempted(attempt.attempt_id, now)

    def _hand_out(self, acquired: list[tuple[_Slot, L.Attempt]]) -> None:
        for slot, attempt in acquired:
            if not self._still_owned(slot):
                continue  # revoked while the commit was in flight: fenced
            tracked = cast(Tracked, attempt.item)
            lock_s = (attempt.lock_deadline_ms - now_ms()) / 1000
            delivery = self.pipe.issue(
                tracked,
                attempt.delivery_count,
                (slot, attempt),
                lock_deadline=trio.current_time() + lock_s,
            )
            slot.live[attempt.attempt_id] = delivery
            self.pipe.send(delivery)

    # ----------------------------------------------------------------------------- answers

    def answered(self, delivery: Delivery, ack: Ack, answer: Answer | AckItem) -> AckResult:
        slot, attempt = cast(tuple[_Slot, L.Attempt], delivery.ref)
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

    async def not_reached(self, deliveries: Sequence[Delivery]) -> bool:
        """Not an attempt: back to the ledger uncounted (the pipeline pauses intake meanwhile)."""
        now = now_ms()
        for delivery in deliveries:
            slot, attempt = cast(tuple[_Slot, L.Attempt], delivery.ref)
            self.pipe.retire(delivery)
            slot.live.pop(attempt.attempt_id, None)
            if self._still_owned(slot):
                with contextlib.suppress(L.LedgerError):
                    slot.ledger.not_attempted(attempt.attempt_id, now)
        self.kick()
        return False

    # ----------------------------------------------------------------------------- DLQ

    def _start_archiving(self) -> None:
        assert self._nursery is not None
        for slot in list(self.slots.values()):
            for req in slot.ledger.to_archive():
                slot.dlq_writes += 1
                self._nursery.start_soon(self._archive_counted, slot, req)

    async def _archive_counted(self, slot: _Slot, req: L.ArchiveRequest) -> None:
        try:
            await self._archive(slot, req)
        finally:
            slot.dlq_writes -= 1
            self._revoke_progress.set()

    async def _archive(self, slot: _Slot, req: L.ArchiveRequest) -> None:
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

    # ----------------------------------------------------------------------------- transactions

    async def _txn_loop(self) -> None:
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
            TopicPartition(o.topic, o.partition, o.offset, metadata=o.metadata)
            for _, o, _ in pending
        ]
        await self.dlq.txn_commit(tps, self.source.group_metadata())
        for sl in slots.values():
            sl.txn_uncommitted = False
        self._confirmed(pending)
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
                self._close_slot(it.slot)
        with contextlib.suppress(DlqFatalError):
            await self.dlq.txn_abort()
        return f"fatal: {reason}"

    def _still_owned(self, slot: _Slot) -> bool:
        return self.slots.get((slot.ledger.topic, slot.ledger.partition)) is slot

    # ----------------------------------------------------------------------------- commits

    def _commit_offsets(self, slots: Sequence[_Slot], force: bool) -> list[_Pending]:
        """What to commit for `slots` (horizon mode: each one's commit point, see `_confirmed`).

        Points are made and committed one at a time, in order, under the commit guard: a horizon
        committed after a higher one would take hand-outs back.
        """
        out: list[_Pending] = []
        for slot in slots:
            if not self._still_owned(slot):
                continue
            ledger = slot.ledger
            point: L.CommitPoint | None = None
            must = force
            if self.horizon and not ledger.revoked:
                must = must or ledger.horizon_wanted() is not None
                point = ledger.commit_point()
                offset, metadata = point.offset, point.metadata
            else:
                offset = ledger.committable_offset()
                metadata = ledger.encode_metadata()
            if not must and slot.last_commit == (offset, metadata):
                continue
            out.append(
                (slot, OffsetToCommit(ledger.topic, ledger.partition, offset, metadata), point)
            )
        return out

    def _confirmed(self, pending: Sequence[_Pending]) -> None:
        """The broker has these commits: record them, and send the isolated records they allow."""
        now = now_ms()
        released: list[tuple[_Slot, L.Attempt]] = []
        for slot, o, point in pending:
            slot.last_commit = (o.offset, o.metadata)
            if point is not None and self._still_owned(slot) and not slot.ledger.revoked:
                attempt = slot.ledger.committed(point, now)
                if attempt is not None:
                    released.append((slot, attempt))
        if released:
            self._hand_out(released)
        self.kick()

    async def _commit_slots(self, slots: Sequence[_Slot], force: bool = False) -> bool:
        async with self._commit_guard:
            return await self._commit_slots_locked(slots, force)

    async def _commit_slots_locked(self, slots: Sequence[_Slot], force: bool) -> bool:
        pending = self._commit_offsets(slots, force)
        if not pending:
            return True
        try:
            await self._send_commit([o for _, o, _ in pending])
        except CommitFailed as exc:  # retried by the next commit: redelivery, never loss
            self.counters.commit_failures += 1
            if self.commit_failing_since is None:
                self.commit_failing_since = time.monotonic()
            log.warning("commit failed: %s", exc)
            return False
        self.counters.commits += 1
        self.commit_failing_since = None
        self._confirmed(pending)
        return True

    async def _send_commit(self, offsets: list[OffsetToCommit]) -> None:
        """The Kafka boundary for commits: librdkafka's error, or our time limit, becomes CommitFailed."""
        try:
            await self.source.commit(offsets)
        except _COMMIT_ERRORS as exc:
            raise CommitFailed(str(exc)) from exc

    async def _committer(self) -> None:
        """Periodic commits, and (horizon mode) a commit as soon as a partition wants one.

        A wanted commit (the horizon, an isolated record's count or outcome) goes out at once and
        asynchronously: hand-outs go on up to the horizon already committed meanwhile.
        """
        interval_s = self.config.commit_interval_ms / 1000
        next_periodic = trio.current_time() + interval_s
        while not self.pipe.stopping:
            with trio.move_on_at(next_periodic):
                await self._commit_wake.wait()
            self._commit_wake = trio.Event()
            slots = list(self.slots.values())
            if trio.current_time() >= next_periodic:
                next_periodic = trio.current_time() + interval_s
            else:
                slots = [s for s in slots if s.ledger.horizon_wanted() is not None]
            if slots and not await self._commit_slots(slots):
                await trio.sleep(0.1)  # failing: retried soon, not in a tight loop
                self._commit_wake.set()

    async def commit_all(self) -> None:
        if self.pipe.stopping and self._awaiting:
            # Stopping: records still waiting for their write-ahead commit were never sent.
            batch, self._awaiting = self._awaiting, []
            self._return_unsent(batch)
        if self.horizon and self.pipe.stopping:
            # A clean stop is a revoke of every partition (after the drain let the app answer):
            # the final state's horizon covers only what is unsettled, so the next owner has no
            # isolation pass unless answers were lost.
            for slot in self.slots.values():
                self._close_slot(slot)
        await self._commit_slots(list(self.slots.values()))


__all__ = ["ConsumerGroupEngine", "default_transactional_id", "horizon_window", "now_ms"]
