"""The share-group engine (`engine: share`, KIP-932): the broker keeps delivery counts and locks.

Owns what is particular to a share group: the batches its share consumers acquire (`ShareListener`:
`on_batch` in trio, one call per poll, its decisions returned as a `Step`), turning each answer into
ACCEPT / RELEASE / REJECT, the limit on the sidecar's count and the isolation of suspects. The
consumers and the start-up checks are the Kafka side's (`sidecar.kafka.share`); the record's path
and the invariants kept are told in docs/architecture.md.

Must not import the ledger, the consumer engine, or confluent-kafka (import-linter contracts).
"""

from __future__ import annotations

import functools
import logging
import math
import os
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio

from sidecar.config import Ordering
from sidecar.core.deadletter import ArchiveOutcome
from sidecar.core.outcome import (
    ACK_BY_WORD,
    COUNT_EXHAUSTED,
    LOCK_TIMEOUT,
    SHUTDOWN,
    Accept,
    Ack,
    ArchiveReason,
    DeadLetter,
    ErrorInfo,
    decide,
    error_info,
)
from sidecar.core.record import Tracked, source_record
from sidecar.core.share_limits import lock_margin_ms, share_consumer_count
from sidecar.core.wire import AckItem, Answer, AppError
from sidecar.engines.interfaces import Answered, Delivery, EngineParts, Settled, StateView, Until
from sidecar.engines.share.batch import Acquired, Batch, SuspectRun, coordinates, isolation_order
from sidecar.engines.share.journal import Coord, journal_path
from sidecar.engines.share.recovery import DeathAccount
from sidecar.engines.share.tier_write import TierDelay, to_tier_then_accept
from sidecar.kafka.message import Message
from sidecar.kafka.share import AckCommit, ShareSettings, ShareSource, Step
from sidecar.kafka.share.admin import GROUP_LOCK_DURATION_MS
from sidecar.kafka.share.lag import ShareLagEstimate

log = logging.getLogger("sidecar.share")

PartitionKey = tuple[str, int]


class ShareGroupEngine:
    """The `StateAdapter` of a share group, and its own `StateView`: the broker's share
    partitions."""

    def __init__(self, parts: EngineParts[Acquired]) -> None:
        config = parts.config
        self._outlet = parts.outlet
        self.config = config
        self.counters = parts.counters
        self.dlq = parts.dlq
        self.tiers, self._tier_delay = parts.tiers, TierDelay(parts)  # retry tiers (share_tiers)
        self.consumer_count = share_consumer_count(config.app.max_in_flight)
        self.source = ShareSource(config, self, self.consumer_count)
        self.settings: ShareSettings | None = None
        self._batches: set[Batch] = set()
        self._in_flight_by_partition: dict[PartitionKey, int] = {}
        self.lag_estimate = ShareLagEstimate(config.source.topics)
        self._renew_warned = False
        # Records the DLQ circuit breaker held (released to the broker instead of dead-lettered),
        # by (topic, partition, offset): acquired again past the limit, they go to the app once
        # more rather than to the DLQ at acquisition. Bounded: the oldest are forgotten first.
        self._held: dict[tuple[str, int, int], None] = {}
        # Isolation (see `_next_suspect`): records whose last release this process decided; the
        # suspects acquired and not yet settled; batches still delivering their ordinary records;
        # per consumer, whether it holds acknowledgements the broker has not received yet (the
        # source's `unflushed`).
        self._known_outcome: dict[tuple[str, int, int], None] = {}
        self._suspects_waiting = 0
        self._isolation_over = trio.Event()
        self._isolation_over.set()
        self._isolation_lock = trio.Lock()
        self._delivering = 0
        self.isolated_deliveries = 0
        self._suspect_runs = 0  # batches whose suspects wait for (or have) an isolation turn
        self._isolation_turn_s = 0.05  # how long one turn takes (the app's answer and the flush)
        # The sidecar's own counts (share.journal.path) and the recovery after a death.
        self.deaths = DeathAccount(
            config.group_id,
            self.consumer_count,
            lambda topic: self.counters.bump(self.counters.broker_archived, topic),
        )

    # ----------------------------------------------------------------------------- StateAdapter

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the consumers (after reading the group's settings) until polling stops."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.lag_estimate.run, self.source.admin)
            task_status.started()
            await self._outlet.run_source(functools.partial(self.source.run, self.run_consumers))
            nursery.cancel_scope.cancel()

    @property
    def view(self) -> StateView:
        return self

    def wake(self, *, now: bool = False) -> None:
        """Nothing to re-evaluate: the broker decides which records each consumer acquires."""

    def intake_changed(self, *, held_may_go: bool = False) -> None:
        """The consumer threads read reachability and draining before each poll; records the
        breaker held were released to the broker, which hands them out again once we poll."""
        if self._outlet.room().intake_stopped:
            self.source.stop_polling()

    async def wait_drained(self) -> None:
        """Let the batches in flight finish (answers and DLQ writes); unanswered ones are then released."""
        try:
            await self.source.wait_stopped()
        finally:
            self.abandon_batches()

    async def finish(self) -> None:
        """Acknowledgements travel with each consumer's next poll or its close: close them."""
        with trio.move_on_after(5):
            await self.source.wait_stopped()
        if await self.source.close():
            self.deaths.closed_cleanly()
        # else: not a clean stop (acknowledgements may not have reached the broker): the next
        # start treats it as a death, which charges nothing it should not.

    def stalled(self) -> str | None:
        """Never: a share group's acknowledgements carry no write-ahead state that blocks delivery."""
        return None

    def readiness(self) -> dict[str, bool]:
        # What the client knows (it sees no assignment; docs/engines.md: the first 5 s).
        return {
            "subscribed": self.source.subscribed and self.source.fatal_error is None,
            "broker_reachable": self.source.broker_ok,
        }

    def broker_error(self) -> str | None:
        return None  # the share consumers report no cause beyond broker_reachable

    def paused(self) -> set[PartitionKey]:
        """Every partition records came from while intake is stopped (app unreachable, draining)."""
        room = self._outlet.room()
        if room.draining or not room.app_reachable or self.source.stop_requested:
            return set(self.source.assigned)
        return set()

    def lag(self) -> dict[PartitionKey, int]:
        return self.lag_estimate.lag()  # the sidecar's own estimate: see sidecar/kafka/share/lag.py

    def commit_metadata_bytes(self) -> dict[PartitionKey, int]:
        return {}  # no delivery state in commit metadata

    def partitions(self) -> list[dict[str, Any]]:
        paused = self.paused()
        return [
            {
                "topic": topic,
                "partition": partition,
                "in_flight": self._in_flight_by_partition.get((topic, partition), 0),
                "paused": (topic, partition) in paused,
                "lag": None,
            }
            for topic, partition in sorted(self.source.assigned)
        ]

    def status_fields(self) -> dict[str, Any]:
        s = self.settings
        return {
            "share": {
                "consumers": self.consumer_count,
                "consumers_running": self.source.consumers_running,
                "batches_in_flight": len(self._batches),
                "records_received": bool(self.source.assigned),
                "delivery_count_limit": s.delivery_count_limit if s else None,
                "group_delivery_count_limit": s.group_delivery_count_limit if s else None,
                "group_delivery_count_limit_source": (
                    s.group_delivery_count_limit_source if s else None
                ),
                "lock_duration_ms": s.lock_duration_ms if s else None,
                "lock_duration_source": s.lock_duration_source if s else None,
                "isolation_active": self._suspects_waiting > 0,
                "suspects_waiting": self._suspects_waiting,
                "isolated_deliveries": self.isolated_deliveries,
                **self.deaths.status(),
            }
        }

    def abandon_batches(self, *, hard: bool = False) -> None:
        for batch in list(self._batches):
            batch.cancel.cancel()
            if hard:
                batch.hard.cancel()

    # ----------------------------------------------------------------------------- start-up

    async def prepare(self) -> ShareSettings:
        """Start-up checks against the cluster; ShareGroupsUnavailable when share groups cannot work."""
        path = journal_path(self.config.delivery.journal_path, self.config.group_id, os.environ)
        if path is not None and self.deaths.journal is None:
            await self.deaths.open(path)
        settings = await self.source.read_settings(journal=self.deaths.journal is not None)
        for warning in settings.warnings:
            log.warning("%s", warning)
        if self.config.ordering is not Ordering.NONE:
            log.warning(
                "ordering: %s does not apply to engine: share: share groups hand records of one "
                "partition to many consumers at once, so records are delivered with no ordering "
                "(ordering: none); use engine: consumer where order matters",
                self.config.ordering.value,
            )
        margin_ms = lock_margin_ms(settings.lock_duration_ms)
        if self.config.app.timeout_ms >= settings.lock_duration_ms - margin_ms:
            log.warning(
                "app.timeout.ms (%d) is not shorter than the share group's record lock (%d ms, %s) "
                "minus a %d ms safety margin: a slow answer arrives after the broker has given the "
                "record to another consumer; lower app.timeout.ms or raise the group's %s",
                self.config.app.timeout_ms,
                settings.lock_duration_ms,
                settings.lock_duration_source,
                margin_ms,
                GROUP_LOCK_DURATION_MS,
            )
        log.info(
            "share group %s: at most %d deliveries to the app (delivery.count.limit), the "
            "broker's own limit %d (%s), record lock %d ms (%s), %d consumers",
            self.config.group_id,
            settings.delivery_count_limit,
            settings.group_delivery_count_limit,
            settings.group_delivery_count_limit_source,
            settings.lock_duration_ms,
            settings.lock_duration_source,
            self.consumer_count,
        )
        self.settings = settings
        return settings

    # ----------------------------------------------------------------------------- consumer threads

    async def run_consumers(self) -> None:
        """Run the share consumers (`ShareSource.run_consumers`, after reading the group's settings)
        until polling stops; SourceError when one cannot continue."""
        if self.settings is None:
            await self.prepare()
        async with trio.open_nursery() as watch:
            if not self.deaths.recovered.is_set():
                s = self.settings
                assert s is not None
                watch.start_soon(
                    self.deaths.watch, s.group_delivery_count_limit, s.lock_duration_ms
                )
            await self.source.run_consumers()
            watch.cancel_scope.cancel()

    # ----------------------------------------------------------------------------- ShareListener

    async def wait_turn(self, consumer: int) -> bool:
        """After a death, one consumer runs until the dead incarnation's records are back."""
        return await self.deaths.wait_turn(consumer, lambda: self.source.stop_requested)

    def on_acknowledged(self, result: AckCommit) -> None:
        if result.error is None:
            self.counters.committed()
            self.deaths.confirmed(result.done)
            return
        self.counters.committed(ok=False)
        # Typically the lock expired first: the broker redelivers those records (at-least-once).
        log.warning(
            "acknowledgements for %s failed: %s",
            ", ".join(f"{t}[{p}] ({n} records)" for (t, p), n in sorted(result.offsets.items())),
            result.error,
        )

    def breaker_stops_polling(self) -> bool:
        return self._outlet.room().breaker_room == 0

    async def wait_intake_open(self) -> bool:
        """Wait while the app is unreachable (pull mode: while no poll waits), the DLQ circuit
        breaker lets no record out (open, or its probe is out) or suspects wait for isolation;
        False when the consumer should re-check for a stop."""
        if self._outlet.room().breaker_room == 0:
            await trio.sleep(0.1)
            return False
        if not await self._outlet.wait(Until.INTAKE_OPEN, trio.current_time() + 0.5):
            return False
        if self._suspects_waiting:
            # Isolation: no new acquisitions while suspects wait (they would be charged by a death).
            with trio.move_on_after(0.5):
                await self._isolation_over.wait()
            return not self._suspects_waiting
        return True

    # ----------------------------------------------------------------------------- one batch

    async def on_batch(self, consumer: int, messages: Sequence[Message]) -> Step:
        """Hand a poll's records to the app, wait for every answer (or the lock), decide each ack.

        A record acquired past the limit (its earlier deliveries ended without an outcome the broker
        received: a death, a lock expiry) is not sent: it is dead-lettered at once, within its lock.
        A suspect (acquired again, its last outcome unknown to this process: see `_is_suspect`) is
        not sent with the others: the step returned flushes the others' outcomes, then the suspects
        go out one at a time (`_next_suspect`).
        """
        assert self.settings is not None
        outlet = self._outlet
        limit = self.settings.delivery_count_limit
        lock_ms = self.settings.lock_duration_ms
        deadline = trio.current_time() + (lock_ms - lock_margin_ms(lock_ms)) / 1000
        released: list[tuple[Message, Ack]] = []
        # The DLQ circuit breaker lets no record out (open, or another consumer's probe is out):
        # wait for it within half the lock (a probe's verdict is usually quick), then release.
        if not await outlet.wait(
            Until.BREAKER_ROOM, trio.current_time() + (deadline - trio.current_time()) / 2
        ):
            released, messages = self._hold_back(messages)
            if not messages:
                return self._step(released)
        batch = Batch(consumer, deadline)
        deliveries: list[Delivery[Acquired]] = []
        exhausted: list[tuple[Message, Tracked, int]] = []
        suspects: list[tuple[Message, Tracked, int]] = []
        held: list[PartitionKey] = []
        acquired: list[tuple[Coord, int, int]] = []
        for msg in messages:
            record = source_record(msg)  # read once: every attempt and the DLQ record use it
            broker_count = msg.delivery_count() or 1
            key = (record.topic, record.partition)
            self.lag_estimate.handed(key, record.offset)
            self._in_flight_by_partition[key] = self._in_flight_by_partition.get(key, 0) + 1
            held.append(key)
            coordinates = (record.topic, record.partition, record.offset)
            was_held = coordinates in self._held
            self._held.pop(coordinates, None)
            # The sidecar's count: the broker's, less what deaths charged (the journal's account).
            count, suspect = self.deaths.count(coordinates, broker_count)
            acquired.append((coordinates, broker_count, count))
            if count > limit and not was_held:
                exhausted.append((msg, Tracked(record), count))
            elif suspect if suspect is not None else self._is_suspect(*coordinates, broker_count):
                suspects.append((msg, Tracked(record), count))
            else:
                deliveries.append(
                    outlet.issue(
                        Tracked(record),
                        count,
                        Acquired(msg, batch, coordinates),
                        lock_deadline=deadline,
                    )
                )
        self.deaths.acquired(acquired)
        if suspects:
            if not self._suspects_waiting:
                self._isolation_over = trio.Event()
                log.warning(
                    "isolation: %d records acquired again whose last delivery ended without an "
                    "outcome (the sidecar died, or its lock expired): each goes to the app alone",
                    len(suspects),
                )
            self._suspects_waiting += len(suspects)
        batch.pending = len(deliveries)
        self._batches.add(batch)
        self._delivering += 1
        decisions: list[tuple[Message, Ack]] = []
        run: SuspectRun | None = None
        try:
            # Cut short only at close: records left without a decision stay unacknowledged, and
            # closing the consumer releases them (never a REJECT without a confirmed DLQ record).
            with batch.hard:
                async with trio.open_nursery() as nursery:
                    for msg, tracked, count in exhausted:
                        nursery.start_soon(
                            self._dead_letter_exhausted, msg, tracked, count, decisions
                        )
                    if deliveries:
                        await self._wait_answers(batch, deliveries)
                    self._decide_all(nursery, deliveries, decisions)
            if suspects:
                order = isolation_order(suspects, own_counts=self.deaths.journal is not None)
                run = SuspectRun(consumer, deadline, order, held)
                return self._step(
                    released + decisions,
                    flush=True,
                    next=functools.partial(self._next_suspect, run),
                )
            # While suspects wait, these outcomes must reach the broker before one goes out.
            return self._step(released + decisions, flush=self._suspects_waiting > 0)
        finally:
            self._delivering -= 1
            self._batches.discard(batch)
            for d in deliveries:
                outlet.retire(d)
            if run is None:
                if suspects:  # cut short before the suspects' turn: closing releases them
                    self._suspects_done(len(suspects))
                self._release_held(held)
                self.deaths.check(self._suspects_waiting)

    def _step(
        self,
        decisions: list[tuple[Message, Ack]],
        flush: bool = False,
        next: Callable[[], Awaitable[Step]] | None = None,
    ) -> Step:
        """The step acknowledging `decisions`, told to the account of deaths first."""
        self.deaths.settle((coordinates(m), t is Ack.RELEASE) for m, t in decisions)
        return Step(decisions, flush, next)

    def _is_suspect(self, topic: str, partition: int, offset: int, count: int) -> bool:
        """Acquired again, and this process did not see its last delivery end (a release, a lock
        timeout): that delivery's outcome was lost — in a death, possibly caused by this record."""
        if count <= 1:
            return False
        known = self._known_outcome
        coordinates = (topic, partition, offset)
        if coordinates in known:  # released here: its outcome is known, and forgotten now
            del known[coordinates]
            return False
        return True

    def _outcome_known(self, msg: Message) -> None:
        """Released by this process: when it comes back, its count holds no unknown outcome."""
        known = self._known_outcome
        known[coordinates(msg)] = None
        if len(known) > _KNOWN_OUTCOMES_MAX:
            del known[next(iter(known))]

    def _suspects_done(self, n: int) -> None:
        self._suspects_waiting -= n
        if self._suspects_waiting <= 0:
            self._suspects_waiting = 0
            self._isolation_over.set()
            self.deaths.check(self._suspects_waiting)

    def _release_held(self, held: Sequence[PartitionKey]) -> None:
        for key in held:
            left = self._in_flight_by_partition.get(key, 1) - 1
            if left > 0:
                self._in_flight_by_partition[key] = left
            else:
                self._in_flight_by_partition.pop(key, None)

    async def _next_suspect(self, run: SuspectRun) -> Step:
        """Deliver the batch's next suspect, alone: nothing else the sidecar holds is unsettled.

        Every other record's outcome has reached the broker, and no consumer polls, so a death now
        charges this record and the suspects still waiting only; the journal (if any) notes it alone
        first, so that the next incarnation charges it and not them. One at a time, never past the
        lock: the suspects that cannot have their turn before it expires (a turn takes about
        `_isolation_turn_s`, and the batches with suspects take turns) are released unsent at once,
        not held meanwhile; they come back as suspects (the journal does not count that release).
        """
        outlet = self._outlet
        decisions: list[tuple[Message, Ack]] = []
        done = False
        self._suspect_runs += 1
        try:
            async with self._isolation_lock:
                quiet = False
                with trio.move_on_at(run.deadline):
                    while not self.source.stop_requested and not outlet.room().stopping:
                        if not self._delivering and not self.source.unflushed(besides=run.consumer):
                            quiet = True
                            break
                        await trio.sleep(_ISOLATION_POLL_S)
                fit, take = len(run.remaining), 1
                turns = (run.deadline - trio.current_time()) / (
                    self._isolation_turn_s * max(1, self._suspect_runs)
                )
                if not quiet:
                    fit = 0
                elif self.deaths.journal is None:
                    # No journal: a release unsent is charged as surely as a death, so the fewest
                    # at a time that still fit in the lock rather than releases.
                    take = max(1, math.ceil(len(run.remaining) / max(1.0, turns)))
                else:
                    fit = math.floor(turns)
                if fit < len(run.remaining):
                    # Stopping, or no turn left for these before the lock expires: release them
                    # undelivered now (they stay suspects for whoever acquires them next).
                    keep = max(0, fit)
                    decisions = [(m, Ack.RELEASE) for m, _t, _c in run.remaining[keep:]]
                    for m, _t, _c in run.remaining[keep:]:
                        self.deaths.unsent(coordinates(m), suspect=True)
                    if quiet:
                        log.info(
                            "isolation: %d suspects released unsent (no turn left within the "
                            "lock); they come back as suspects",
                            len(decisions),
                        )
                    del run.remaining[keep:]
                    done = not run.remaining
                    next_ = None if done else functools.partial(self._next_suspect, run)
                    return self._step(decisions, flush=True, next=next_)
                chunk, run.remaining[:take] = run.remaining[:take], []
                self.deaths.alone(coordinates(m) for m, _t, _c in chunk)
                batch = Batch(run.consumer, run.deadline)
                ds = [
                    outlet.issue(
                        t, c, Acquired(m, batch, coordinates(m)), lock_deadline=run.deadline
                    )
                    for m, t, c in chunk
                ]
                batch.pending = len(ds)
                self._batches.add(batch)
                self.isolated_deliveries += len(ds)
                started = trio.current_time()
                try:
                    with batch.hard:
                        await self._wait_answers(batch, ds)
                        async with trio.open_nursery() as nursery:
                            self._decide_all(nursery, ds, decisions)
                finally:
                    self._batches.discard(batch)
                    for d in ds:
                        outlet.retire(d)
                took = trio.current_time() - started + _ISOLATION_POLL_S
                # Up at once, down slowly: a slow answer must not leave the next ones past the lock.
                self._isolation_turn_s = max(took, 0.5 * self._isolation_turn_s + 0.5 * took)
            done = not run.remaining
            return self._step(
                decisions,
                flush=True,
                next=None if done else functools.partial(self._next_suspect, run),
            )
        except BaseException:
            done = True
            raise
        finally:
            self._suspect_runs -= 1
            if done:
                self._suspects_done(run.total)
                self._release_held(run.held)

    def _hold_back(
        self, messages: Sequence[Message]
    ) -> tuple[list[tuple[Message, Ack]], list[Message]]:
        """A poll under way when the DLQ circuit breaker opened (or its probe went out): its records
        do not go to the app; they are released (the broker counts the acquisition) as held, except
        those on the group's last delivery, which the broker would archive (processed as usual)."""
        assert self.settings is not None
        released: list[tuple[Message, Ack]] = []
        kept: list[Message] = []
        for msg in messages:
            if (msg.delivery_count() or 1) >= self.settings.group_delivery_count_limit:
                kept.append(msg)
                continue
            self._remember_held(*coordinates(msg))
            self.deaths.unsent(coordinates(msg))
            self._outcome_known(msg)  # released by us: not a suspect when it comes back
            released.append((msg, Ack.RELEASE))
        return released, kept

    def _remember_held(self, topic: str, partition: int, offset: int) -> None:
        self._held[(topic, partition, offset)] = None
        if len(self._held) > _HELD_REMEMBERED:
            del self._held[next(iter(self._held))]

    async def _wait_answers(self, batch: Batch, deliveries: Sequence[Delivery[Acquired]]) -> None:
        """Send the batch's deliveries; an answer still missing at the deadline is a release."""
        outlet = self._outlet
        for d in deliveries:
            outlet.send(d)
        with batch.cancel, trio.move_on_at(batch.deadline):
            await batch.answered.wait()
        for d in deliveries:
            if d.answer is None and not d.sent and d.handed_at is None:
                d.answer = _NOT_SENT  # no room for it at the app before the lock expired
                outlet.lock_expired(d.topic, d, "lock_expired")
            elif d.answer is None:
                # No answer within the lock (or the sidecar is stopping): a release, like a lock timeout.
                room = outlet.room()
                stopping = room.stopping or room.draining or self.source.stop_requested
                d.answer = Answer(
                    "release",
                    AppError(
                        SHUTDOWN if stopping else LOCK_TIMEOUT,
                        "the sidecar stopped before the app answered"
                        if stopping
                        else "no answer before the record lock expired",
                    ),
                )
                outlet.lock_expired(d.topic, d, "abandoned" if stopping else "lock_expired")

    def _decide_all(
        self,
        nursery: trio.Nursery,
        deliveries: Sequence[Delivery[Acquired]],
        out: list[tuple[Message, Ack]],
    ) -> None:
        """Each answered delivery's decision into `out`: at once where none needs a DLQ write (no
        task per record), in a task of its own where one does."""
        for d in deliveries:
            if (delay := self._tier_delay.of(d)) is not None:  # a long release: to its tier
                nursery.start_soon(to_tier_then_accept, self.tiers, self.dlq, d, delay, out)
                continue
            archive = self._decide(d, out)
            if archive is not None:
                reason, error = archive
                nursery.start_soon(
                    self._archive, d.ref.msg, d.tracked, d.delivery_count, reason, error, out
                )

    def _decide(
        self, d: Delivery[Acquired], out: list[tuple[Message, Ack]]
    ) -> tuple[ArchiveReason, ErrorInfo | None] | None:
        """Append the delivery's decision to `out`, or return why it goes to the DLQ (its REJECT
        follows the write: `_archive`)."""
        assert d.answer is not None
        msg = d.ref.msg
        answer = d.answer
        if answer is _NOT_SENT:  # released unsent: no attempt, not a suspect when it comes back
            self.deaths.unsent(coordinates(msg))
            self._outcome_known(msg)
            out.append((msg, Ack.RELEASE))
            return None
        ack = ACK_BY_WORD[answer.ack]
        # Made when the answer came (`answered`), or now for a release nobody answered.
        settled = d.settled if d.settled is not None else self._settle(msg, ack, d.delivery_count)
        if settled is Settled.ACCEPTED:
            out.append((msg, Ack.ACCEPT))
            return None
        if settled is not Settled.DEAD_LETTERED:
            out.append((msg, Ack.RELEASE))  # the broker redelivers it
            self._outcome_known(msg)
            return None
        reason = (
            ArchiveReason.REJECTED if ack is Ack.REJECT else ArchiveReason.DELIVERY_COUNT_EXCEEDED
        )
        return reason, error_info(answer.error)

    def _settle(self, msg: Message, ack: Ack, count: int) -> Settled:
        """The one decision on an answer (`decide`, on the sidecar's count and limit): a release
        on the broker's last delivery is dead-lettered too, since a release would let the broker
        archive the record without a DLQ record."""
        assert self.settings is not None
        verdict = decide(ack, count, self.settings.delivery_count_limit)
        if isinstance(verdict, Accept):
            return Settled.ACCEPTED
        if isinstance(verdict, DeadLetter):
            return Settled.DEAD_LETTERED
        if (msg.delivery_count() or 1) >= self.settings.group_delivery_count_limit:
            return Settled.DEAD_LETTERED
        return Settled.REDELIVERED

    async def _dead_letter_exhausted(
        self,
        msg: Message,
        tracked: Tracked,
        count: int,
        out: list[tuple[Message, Ack]],
    ) -> None:
        """Acquired for the `count`-th time, past the limit: dead-letter it without delivering it.

        Its `count - 1` earlier deliveries are what the DLQ record says: this acquisition was not one.
        """
        assert self.settings is not None
        limit = self.settings.delivery_count_limit
        error = ErrorInfo(
            COUNT_EXHAUSTED,
            f"acquired again after {count - 1} deliveries (the limit is {limit}) whose outcome the "
            "broker never received: the sidecar stopped or the record lock expired",
        )
        await self._archive(
            msg,
            tracked,
            count - 1,
            ArchiveReason.DELIVERY_COUNT_EXCEEDED,
            error,
            out,
            unsent=True,
        )

    async def _archive(
        self,
        msg: Message,
        tracked: Tracked,
        delivery_count: int,
        reason: ArchiveReason,
        error: ErrorInfo | None,
        out: list[tuple[Message, Ack]],
        *,
        unsent: bool = False,
    ) -> None:
        """DLQ write, then REJECT; a release when it was not written (the sidecar is stopping)."""
        assert self.settings is not None
        broker = msg.delivery_count() or 1  # the broker's count: its limit is on that
        outcome = await self._outlet.dead_letter(
            tracked,
            delivery_count,
            reason,
            error,
            consequence="stopping without acknowledging it",
            sink=self.dlq,
            # Held means released; on the group's last delivery the broker would archive it
            # without a DLQ record, so it is written even with the breaker open.
            may_hold=broker < self.settings.group_delivery_count_limit,
        )
        if outcome.done:
            out.append((msg, Ack.REJECT))
            return
        if unsent:  # dead-lettered at acquisition: no attempt to count
            self.deaths.unsent(coordinates(msg))
        if outcome is ArchiveOutcome.HELD:
            rec = tracked.record
            self._remember_held(rec.topic, rec.partition, rec.offset)
            out.append((msg, Ack.RELEASE))  # the broker hands it out again
            return
        # Not written: never REJECT (that would drop it). A release lets the broker redeliver it,
        # except at the group's limit, where the broker archives it itself.
        if broker >= self.settings.group_delivery_count_limit:  # the broker archives it
            rec = tracked.record
            self.deaths.archived_by_broker(
                (rec.topic, rec.partition, rec.offset), broker, "released"
            )
        out.append((msg, Ack.RELEASE))
        self._outcome_known(msg)

    # ----------------------------------------------------------------------------- answers

    def answered(
        self, delivery: Delivery[Acquired], ack: Ack, answer: Answer | AckItem
    ) -> Answered:
        if ack is Ack.RENEW:
            if not self._renew_warned:
                self._renew_warned = True
                log.warning(
                    "renew: confluent-kafka's share consumer cannot renew a record lock (no RENEW "
                    "acknowledgement type); the record keeps its original lock"
                )
            return Settled.KEPT
        delivery.answer = answer
        ref = delivery.ref
        settled = self._settle(ref.msg, ack, delivery.delivery_count)
        delivery.settled = settled
        self.deaths.answered(ref.coord, ack is Ack.RELEASE)
        batch = ref.batch
        batch.pending -= 1
        if batch.pending <= 0:
            batch.answered.set()
        return settled

    async def not_reached(self, deliveries: Sequence[Delivery[Acquired]]) -> bool:
        """Not an attempt: wait for the app within the earliest batch's lifetime, then send again.

        The broker has counted the acquisition already; sending again once the app is back (rather
        than releasing now) is what keeps an app restart from using up deliveries.
        """
        deadline = min(d.ref.batch.deadline for d in deliveries)
        return await self._outlet.wait(Until.APP_REACHABLE, deadline)


_KNOWN_OUTCOMES_MAX = 100_000  # records released by this process, remembered until acquired again
_ISOLATION_POLL_S = 0.02  # how often a waiting suspect checks that nothing else is unsettled
_NOT_SENT = Answer("release", AppError(LOCK_TIMEOUT, "never sent before the record lock expired"))
_HELD_REMEMBERED = 100_000  # how many held records the share engine remembers (see `_held`)


__all__ = ["ShareGroupEngine"]
