"""The share-group engine (`engine: share`, KIP-932): the broker keeps delivery counts and locks.

Owns `ShareGroupEngine`, the `StateAdapter` and `StateView` of a share group and the
`ShareListener` its share consumers call (`on_batch` in trio, one call per poll, its decisions
returned as a `Step`); it builds `ShareSource` and wires its parts, which take ports
(`sidecar.engines.share.ports`): `InFlight`, `KnownOutcomes`, `Decisions` (each answer to ACCEPT /
RELEASE / REJECT, the count limit, the DLQ) and `Isolation` (suspects, one at a time).

Must not import the ledger, the consumer engine, or confluent-kafka (import-linter contracts).
"""

from __future__ import annotations

import functools
import logging
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import trio

from sidecar.config import Ordering
from sidecar.core.outcome import Ack
from sidecar.core.record import Tracked, source_record
from sidecar.core.share_limits import lock_margin_ms, share_consumer_count
from sidecar.core.wire import AckItem, Answer
from sidecar.engines.interfaces import Answered, Delivery, EngineParts, Settled, StateView, Until
from sidecar.engines.share.batch import Acquired, Batch, SuspectRun, coordinates, isolation_order
from sidecar.engines.share.decisions import Decisions
from sidecar.engines.share.inflight import InFlight
from sidecar.engines.share.isolation import Isolation
from sidecar.engines.share.journal import Coord, journal_path
from sidecar.engines.share.known import KnownOutcomes
from sidecar.engines.share.recovery import DeathAccount
from sidecar.engines.share.tier_write import TierDelay
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
        self.tiers = parts.tiers  # retry tiers (share_tiers)
        self.consumer_count = share_consumer_count(config.app.max_in_flight)
        self.source = ShareSource(config, self, self.consumer_count)
        self.settings: ShareSettings | None = None
        self.lag_estimate = ShareLagEstimate(config.source.topics)
        self._renew_warned = False
        # The sidecar's own counts (share.journal.path) and the recovery after a death.
        self.deaths = DeathAccount(
            config.group_id,
            self.consumer_count,
            lambda topic: self.counters.bump(self.counters.broker_archived, topic),
        )
        # The parts: the batches in flight, what this process knows of the records it let go
        # (released: not suspects when they come back; held by the DLQ circuit breaker), the
        # decisions on answers, and the isolation of suspects.
        self._in_flight = InFlight()
        self._known = KnownOutcomes()
        self._decisions = Decisions(
            self._outlet,
            self.dlq,
            self.tiers,
            TierDelay(parts),
            self.source,
            self.deaths,
            self._known,
        )
        self._isolation = Isolation(
            self._outlet, self.source, self.deaths, self._in_flight, self._decisions
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
                "in_flight": self._in_flight.records((topic, partition)),
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
                "batches_in_flight": self._in_flight.batches,
                "records_received": bool(self.source.assigned),
                "delivery_count_limit": s.delivery_count_limit if s else None,
                "group_delivery_count_limit": s.group_delivery_count_limit if s else None,
                "group_delivery_count_limit_source": (
                    s.group_delivery_count_limit_source if s else None
                ),
                "lock_duration_ms": s.lock_duration_ms if s else None,
                "lock_duration_source": s.lock_duration_source if s else None,
                "isolation_active": self._isolation.waiting > 0,
                "suspects_waiting": self._isolation.waiting,
                "isolated_deliveries": self._isolation.isolated_deliveries,
                **self.deaths.status(),
            }
        }

    def abandon_batches(self, *, hard: bool = False) -> None:
        self._in_flight.abandon(hard=hard)

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
        self._decisions.use(settings)
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
        if self._isolation.waiting:
            # Isolation: no new acquisitions while suspects wait (they would be charged by a death).
            return await self._isolation.wait_over()
        return True

    # ----------------------------------------------------------------------------- one batch

    async def on_batch(self, consumer: int, messages: Sequence[Message]) -> Step:
        """Hand a poll's records to the app, wait for every answer (or the lock), decide each ack.

        A record acquired past the limit (its earlier deliveries ended without an outcome the broker
        received: a death, a lock expiry) is not sent: it is dead-lettered at once, within its lock.
        A suspect (acquired again, its last outcome unknown to this process: see
        `KnownOutcomes.is_suspect`) is not sent with the others: the step returned flushes the
        others' outcomes, then the suspects go out one at a time (`Isolation.next_suspect`).
        """
        assert self.settings is not None
        outlet = self._outlet
        decide = self._decisions
        isolation = self._isolation
        in_flight = self._in_flight
        limit = self.settings.delivery_count_limit
        lock_ms = self.settings.lock_duration_ms
        deadline = trio.current_time() + (lock_ms - lock_margin_ms(lock_ms)) / 1000
        released: list[tuple[Message, Ack]] = []
        # The DLQ circuit breaker lets no record out (open, or another consumer's probe is out):
        # wait for it within half the lock (a probe's verdict is usually quick), then release.
        if not await outlet.wait(
            Until.BREAKER_ROOM, trio.current_time() + (deadline - trio.current_time()) / 2
        ):
            released, messages = decide.hold_back(messages)
            self.source.received({coordinates(m)[:2] for m, _ack in released})
            if not messages:
                return decide.step(released)
        batch = Batch(consumer, deadline)
        deliveries: list[Delivery[Acquired]] = []
        exhausted: list[tuple[Message, Tracked, int]] = []
        suspects: list[tuple[Message, Tracked, int]] = []
        keys: list[PartitionKey] = []
        coords: list[Coord] = []
        acquired: list[tuple[Coord, int, int]] = []
        known = self._known
        deaths = self.deaths
        any_held = known.holds_any()  # none held (the usual case): no record needs looking up
        # No journal and no recovery (the usual case): the sidecar's count is the broker's.
        own_counts = deaths.counts_own()
        issue = outlet.issue
        for msg in messages:
            record = source_record(msg)  # read once: every attempt and the DLQ record use it
            broker_count = msg.delivery_count() or 1
            keys.append((record.topic, record.partition))
            coord = (record.topic, record.partition, record.offset)
            coords.append(coord)
            was_held = any_held and known.take_held(coord)
            if own_counts:
                # The sidecar's count: the broker's, less what deaths charged (the journal's account).
                count, suspect = deaths.count(coord, broker_count)
                acquired.append((coord, broker_count, count))
            else:
                count, suspect = broker_count, None
            if count > limit and not was_held:
                exhausted.append((msg, Tracked(record), count))
            elif (
                suspect
                if suspect is not None
                else broker_count > 1 and known.is_suspect(*coord, broker_count)
            ):
                suspects.append((msg, Tracked(record), count))
            else:
                deliveries.append(
                    issue(
                        Tracked(record),
                        count,
                        Acquired(msg, batch, coord),
                        lock_deadline=deadline,
                    )
                )
        held = Counter(keys)  # records per partition
        self.source.received(held)
        self.lag_estimate.handed_all(coords)
        in_flight.hold(held)
        if acquired:
            deaths.acquired(acquired)
        if suspects:
            isolation.found(len(suspects))
        batch.expect(len(deliveries))
        in_flight.add(batch)
        in_flight.delivering_started()
        decisions: list[tuple[Message, Ack]] = []
        run: SuspectRun | None = None
        try:
            # Cut short only at close: records left without a decision stay unacknowledged, and
            # closing the consumer releases them (never a REJECT without a confirmed DLQ record).
            with batch.hard:
                async with trio.open_nursery() as nursery:
                    for msg, tracked, count in exhausted:
                        nursery.start_soon(
                            decide.dead_letter_exhausted, msg, tracked, count, decisions
                        )
                    if deliveries:
                        await decide.wait_answers(batch, deliveries)
                    decide.decide_all(nursery, deliveries, decisions)
            if suspects:
                order = isolation_order(suspects, own_counts=self.deaths.journal is not None)
                run = SuspectRun(consumer, deadline, order, held)
                return decide.step(
                    released + decisions,
                    flush=True,
                    next=functools.partial(isolation.next_suspect, run),
                )
            # While suspects wait, these outcomes must reach the broker before one goes out.
            return decide.step(released + decisions, flush=isolation.waiting > 0)
        finally:
            in_flight.delivering_ended()
            in_flight.discard(batch)
            for d in deliveries:
                if d.settled is None:  # an answered one was retired when its answer came
                    outlet.retire(d)
            if run is None:
                if suspects:  # cut short before the suspects' turn: closing releases them
                    isolation.done(len(suspects))
                in_flight.release(held)
                self.deaths.check(isolation.waiting)

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
        return self._decisions.answered(delivery, ack, answer)

    async def not_reached(self, deliveries: Sequence[Delivery[Acquired]]) -> bool:
        """Not an attempt: wait for the app within the earliest batch's lifetime, then send again.

        The broker has counted the acquisition already; sending again once the app is back (rather
        than releasing now) is what keeps an app restart from using up deliveries.
        """
        deadline = min(d.ref.batch.deadline for d in deliveries)
        return await self._outlet.wait(Until.APP_REACHABLE, deadline)


__all__ = ["ShareGroupEngine"]
