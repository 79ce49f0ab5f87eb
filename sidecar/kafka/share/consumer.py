"""The share consumers (`engine: share`, KIP-932): confluent-kafka `ShareConsumer`s driven from trio.

Owns `ShareSource`: the consumers, each on a thread of its own with one batch in flight, their
acknowledgements (`Ack` words to `AcknowledgeType`s here) and the flags status and readiness read
(drawn and told in its docstring); the engine behind `ShareListener` owns the batches and decides
every acknowledgement. `KafkaException`s become `SourceError`s (`sidecar.kafka.share.errors`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio
from confluent_kafka import (
    AcknowledgeType,
    IllegalStateException,
    KafkaError,
    KafkaException,
    Message,
    ShareConsumer,
)
from confluent_kafka.admin import AdminClient

from sidecar.config import Config
from sidecar.core.outcome import Ack
from sidecar.kafka.logsummary import librdkafka_logger
from sidecar.kafka.message import records_of
from sidecar.kafka.share.admin import ShareSettings, read_share_settings, share_admin
from sidecar.kafka.share.errors import refusal_from_error, share_error
from sidecar.kafka.source import SourceError

log = logging.getLogger("sidecar.share")

PartitionKey = tuple[str, int]
Coord = tuple[str, int, int]  # (topic, partition, offset)

# Properties a ShareConsumer refuses (librdkafka: "not applicable for share consumer"): the group's own
# configuration holds their share-group equivalents (share.auto.offset.reset, share.isolation.level, ...).
SHARE_REFUSED_PROPERTIES = frozenset(
    {
        "auto.offset.reset",
        "enable.auto.commit",
        "group.protocol",
        "group.remote.assignor",
        "partition.assignment.strategy",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "isolation.level",
        "enable.partition.eof",
        "queued.max.messages.kbytes",
        "queued.min.messages",
        "group.instance.id",
        "auto.commit.interval.ms",
        "enable.auto.offset.store",
    }
)

_ACKNOWLEDGE_TYPES = {
    Ack.ACCEPT: AcknowledgeType.ACCEPT,
    Ack.RELEASE: AcknowledgeType.RELEASE,
    Ack.REJECT: AcknowledgeType.REJECT,
}

_COMMIT_TIMEOUT_S = 10.0
# A share consumer's close that takes this long is logged.
_SLOW_CLOSE_S = 2.0
# How long after the stop's grace a consumer's close may still take before it is left to its thread.
_CLOSE_ABANDON_S = 5.0


def share_consumer_properties(
    kafka: Mapping[str, Any], fetch_max_bytes: int | None = None
) -> dict[str, Any]:
    """The user's `kafka:` properties a ShareConsumer accepts, plus explicit acknowledgement.

    What a share consumer holds is its one poll's batch (`max.poll.records`), at most one fetch
    response: `fetch_max_bytes` (its part of `max.buffered.bytes`) bounds that in bytes unless
    the user set `fetch.max.bytes` (a share consumer has no prefetch queue to bound).
    """
    props = {k: v for k, v in kafka.items() if k not in SHARE_REFUSED_PROPERTIES}
    props.setdefault("max.poll.records", 500)
    if fetch_max_bytes is not None:
        props.setdefault("fetch.max.bytes", fetch_max_bytes)
    props["share.acknowledgement.mode"] = "explicit"
    return props


@dataclass(slots=True)
class Step:
    """What a consumer thread does with one part of a batch: acknowledge `decisions` (ACCEPT,
    RELEASE or REJECT), send them now when `flush`, then run `next` (in trio) for the next part, if
    any."""

    decisions: list[tuple[Message, Ack]]
    flush: bool = False
    next: Callable[[], Awaitable[Step]] | None = None


@dataclass(frozen=True, slots=True)
class AckCommit:
    """An acknowledgement commit's result, per partition the number of records it carried."""

    offsets: dict[PartitionKey, int]
    error: str | None
    done: tuple[Coord, ...] = ()  # on success: the records whose acknowledgement the broker has


def ack_commit(offsets: Mapping[Any, Any], exc: Exception | None) -> AckCommit:
    """librdkafka's acknowledgement-commit callback arguments as an `AckCommit`."""
    counts = {(str(tp.topic), int(tp.partition)): len(offs) for tp, offs in offsets.items()}
    if exc is not None:
        return AckCommit(counts, str(exc))
    done = tuple(
        (str(tp.topic), int(tp.partition), int(o)) for tp, offs in offsets.items() for o in offs
    )
    return AckCommit(counts, None, done)


class ShareListener(Protocol):
    """What the share consumers call (in trio) on the engine that decides."""

    async def wait_turn(self, consumer: int) -> bool:
        """Wait until consumer `consumer` may start; False: it does not (stopping)."""
        ...

    async def wait_intake_open(self) -> bool:
        """Wait until a consumer may poll; False when it should re-check for a stop first."""
        ...

    async def on_batch(self, consumer: int, messages: Sequence[Message]) -> Step:
        """A poll's records (errors taken out): the decisions for all of them, in steps. The
        listener reports the partitions they came from (`ShareSource.received`)."""
        ...

    def breaker_stops_polling(self) -> bool:
        """Acknowledgements made should reach the broker at once (no poll will carry them soon)."""
        ...

    def on_acknowledged(self, result: AckCommit) -> None: ...

    def abandon_batches(self, *, hard: bool = False) -> None:
        """Stop waiting for answers (`hard`: stop the DLQ writes too): the consumers are closing."""
        ...


class ShareSource:
    """`consumers` share consumers of the group, their acknowledgements, and what readiness reads.

    A share consumer has no assignment the client can see; `assigned` holds the partitions records
    came from (the listener reports them: `received`).

    Owns the consumers, each on a thread of its own, their acknowledgements and what status and readiness
    read of them; the engine behind `ShareListener` owns the batches and decides every acknowledgement::

        consumer thread i ──poll──▶ records ──on_batch (trio)──▶ listener ──▶ Step(decisions, flush, next)
              ▲                                                                   │
              └── acknowledge (+ commit_sync when flush) ◀──────────────────────┘   then next() if any

    Why threads: a `ShareConsumer` is not thread-safe and, in explicit mode, every record of a poll must
    be acknowledged before the next poll. Each consumer lives on a thread of its own (every call on it,
    close included, happens there) and has one batch in flight; `trio.from_thread` brings the listener's
    calls back to trio. librdkafka's acknowledgement-commit callback fires inside `poll` / `commit_sync`
    on that thread and reaches the listener the same way (`on_acknowledged`).

    Who may change what: `assigned`, `broker_ok` and `consumers_running` are this object's, set here (on
    trio's thread, except `broker_ok = False` from librdkafka's error callback, a flag); each consumer's
    `unflushed` flag (acknowledgements the broker has not received yet) is its thread's. The engine reads
    them and calls `stop_polling` / `close`. The answers' `Ack` words become `AcknowledgeType`s here, and
    `KafkaException`s become `SourceError`s (:mod:`sidecar.kafka.share.errors`). The group's settings are
    read with this object's one admin client (`admin`, shared with the share lag estimate).
    """

    def __init__(self, config: Config, listener: ShareListener, consumers: int) -> None:
        self._config = config
        self._listener = listener
        self.consumers = consumers
        self.assigned: set[PartitionKey] = set()
        self.broker_ok = True
        self.fatal_error: str | None = None
        self.consumers_running = 0
        self._unflushed = [False] * consumers
        self._stop_polling = False
        self._stopped = trio.Event()
        self._consumers_scope: trio.CancelScope | None = None
        self._admin: AdminClient | None = None
        self._admin_lock = threading.Lock()

    @property
    def subscribed(self) -> bool:
        """A consumer has subscribed and not closed yet."""
        return self.consumers_running > 0

    @property
    def stop_requested(self) -> bool:
        return self._stop_polling

    def unflushed(self, *, besides: int) -> bool:
        """A consumer other than `besides` holds acknowledgements the broker has not received."""
        return any(dirty for i, dirty in enumerate(self._unflushed) if i != besides)

    def admin(self) -> AdminClient:
        """The share engine's admin client (one, made on first use; any thread)."""
        with self._admin_lock:
            if self._admin is None:
                self._admin = share_admin(self._config.kafka)
            return self._admin

    async def read_settings(self, *, journal: bool) -> ShareSettings:
        """The group's settings, checked and where needed raised (`read_share_settings`)."""
        admin = self.admin()
        config = self._config
        return await trio.to_thread.run_sync(
            lambda: read_share_settings(admin, config.group_id, config, journal=journal)
        )

    # ----------------------------------------------------------------------------- running

    async def run(self, consume: Callable[[], Awaitable[None]]) -> None:
        """Run `consume` (the engine's start-up, then `run_consumers`): the source is stopped once
        it returns, however it ends."""
        try:
            await consume()
        finally:
            self._stopped.set()

    async def run_consumers(self) -> None:
        """Run the share consumers until polling stops; SourceError when one cannot continue (the
        others then stop polling too)."""
        token = trio.lowlevel.current_trio_token()
        errors: list[SourceError] = []
        listener = self._listener

        async def one(index: int) -> None:
            try:
                if not await listener.wait_turn(index):
                    return
                # Abandonable: a close that never returns must not keep the process from exiting
                # (`close`); nothing else cancels this scope.
                await trio.to_thread.run_sync(
                    self._consumer_thread, index, token, abandon_on_cancel=True
                )
            except SourceError as exc:
                errors.append(exc)
                self.stop_polling()
                listener.abandon_batches()

        async with trio.open_nursery() as nursery:
            self._consumers_scope = nursery.cancel_scope
            for index in range(self.consumers):
                nursery.start_soon(one, index)
        if errors:
            raise errors[0]

    def stop_polling(self) -> None:
        self._stop_polling = True

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def close(self, grace_s: float = 30.0) -> bool:
        """The consumers close on their own threads once polling stops; wait for that. False when
        one did not close and was left behind.

        DLQ writes still retrying after `grace_s` are cut short: their records are released. A
        consumer whose close has not returned `_CLOSE_ABANDON_S` after that is left to its thread
        (seen: a share consumer closed within a second of its subscribe never returned), so the
        process can exit; the broker hands its records out again when their locks run out.
        """
        self._stop_polling = True
        self._listener.abandon_batches()
        with trio.move_on_after(grace_s):
            await self._stopped.wait()
            return True
        self._listener.abandon_batches(hard=True)
        with trio.move_on_after(_CLOSE_ABANDON_S):
            await self._stopped.wait()
            return True
        log.error(
            "%d share consumer(s) did not close within %.0f s of the stop: left behind so that the "
            "sidecar can exit; the broker hands their records out again when their locks run out",
            self.consumers_running,
            grace_s + _CLOSE_ABANDON_S,
        )
        if self._consumers_scope is not None:
            self._consumers_scope.cancel()
        await self._stopped.wait()
        return False

    # ----------------------------------------------------------------------------- consumer threads

    def _consumer_thread(self, index: int, token: trio.lowlevel.TrioToken) -> None:
        """One share consumer, start to close, on this thread only (the client is not thread-safe)."""
        listener = self._listener
        config = self._config
        # Half of the byte budget split among the consumers' batches; the other half covers a
        # response librdkafka is reading while the batch is with the app.
        budget = config.delivery.max_buffered_bytes // 2 // self.consumers
        props = share_consumer_properties(config.kafka, budget)
        props["client.id"] = f"{props.get('client.id', 'dlq-sidecar')}-share-{index}"
        props["error_cb"] = self._on_client_error
        props["logger"] = librdkafka_logger()
        try:
            consumer = ShareConsumer(props)
        except KafkaException as exc:
            raise SourceError(f"cannot create the share consumer: {exc}") from exc
        try:
            consumer.set_acknowledgement_commit_callback(
                lambda offsets, exc: trio.from_thread.run_sync(
                    self._acknowledged, ack_commit(offsets, exc), trio_token=token
                )
            )
            consumer.subscribe(list(config.source.topics))
            trio.from_thread.run_sync(self._consumer_started, trio_token=token)
            while not self._stop_polling:
                if not trio.from_thread.run(listener.wait_intake_open, trio_token=token):
                    if self._unflushed[index]:  # isolation waits for these outcomes
                        _commit(consumer)
                        self._unflushed[index] = False
                    continue
                try:
                    messages = consumer.poll(0.5)
                except KafkaException as exc:
                    raise share_error(exc, config.group_id) from exc
                self._unflushed[index] = False  # the poll carried them
                good = records_of(messages, self._refuse, log, "share consumer")
                if not good:
                    continue
                step = trio.from_thread.run(self._on_batch, index, good, trio_token=token)
                while True:
                    _acknowledge(consumer, step.decisions)
                    if step.flush:
                        # Isolation: these outcomes reach the broker before anything else is
                        # delivered, so a death from here on charges none of these records.
                        _commit(consumer)
                    self._unflushed[index] = bool(step.decisions) and not step.flush
                    if step.next is None:
                        break
                    step = trio.from_thread.run(step.next, trio_token=token)
                # Otherwise the acknowledgements go to the broker with the next poll (or the close
                # below); at once when the DLQ circuit breaker stops polling, so that accepted
                # records are not redelivered once their locks expire.
                if self._unflushed[index] and trio.from_thread.run_sync(
                    listener.breaker_stops_polling, trio_token=token
                ):
                    _commit(consumer)
                    self._unflushed[index] = False
        finally:
            closing = time.monotonic()
            try:
                consumer.close()
            except KafkaException as exc:
                log.warning("closing share consumer %d: %s", index, exc)
            took_s = time.monotonic() - closing
            if took_s >= _SLOW_CLOSE_S:
                # The client's close sends the last acknowledgements and leaves the group: slow
                # when the broker is (a stop then takes as long).
                log.warning("closing share consumer %d took %.1f s", index, took_s)
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._consumer_stopped, trio_token=token)

    def _refuse(self, err: KafkaError) -> SourceError | None:
        """A poll's error event that ends the consumer: a refusal of the group, or a fatal one."""
        if refusal_from_error(err) is not None or err.fatal():
            return share_error(KafkaException(err), self._config.group_id)
        return None

    async def _on_batch(self, index: int, messages: Sequence[Message]) -> Step:
        self.broker_ok = True
        return await self._listener.on_batch(index, messages)

    def received(self, partitions: Iterable[tuple[str, int]]) -> None:
        """The listener read a batch's records from these partitions: what `assigned` reports (a
        share consumer is told no assignment)."""
        self.assigned.update(partitions)

    def _on_client_error(self, err: KafkaError) -> None:
        # librdkafka's global errors, on a consumer thread: only a flag the API reads.
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self.broker_ok = False
        log.warning("kafka client error: %s", err)

    def _consumer_started(self) -> None:
        self.consumers_running += 1

    def _consumer_stopped(self) -> None:
        self.consumers_running -= 1

    def _acknowledged(self, result: AckCommit) -> None:
        if result.error is None:
            self.broker_ok = True
        self._listener.on_acknowledged(result)


def _acknowledge(consumer: ShareConsumer, decisions: Sequence[tuple[Message, Ack]]) -> None:
    for msg, ack in decisions:
        ack_type = _ACKNOWLEDGE_TYPES[ack]
        try:
            consumer.acknowledge(msg, ack_type)
        except (IllegalStateException, KafkaException) as exc:
            # The client no longer holds the record (its lock ran out first): the broker
            # redelivers it, at least once as always.
            log.warning(
                "cannot acknowledge %s[%d]@%d (%s): %s",
                msg.topic(),
                msg.partition(),
                msg.offset(),
                ack_type.name,
                exc,
            )


def _commit(consumer: ShareConsumer) -> None:
    """Send the acknowledgements made so far now, not with the next poll (bounded: a stop waits)."""
    try:
        consumer.commit_sync(_COMMIT_TIMEOUT_S)
    except KafkaException as exc:
        log.warning("sending acknowledgements: %s", exc)


__all__ = [
    "SHARE_REFUSED_PROPERTIES",
    "AckCommit",
    "ShareListener",
    "ShareSource",
    "Step",
    "ack_commit",
    "share_consumer_properties",
]
