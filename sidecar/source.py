"""The Kafka source: a confluent-kafka consumer driven from trio.

Owns the consumer handle: subscribe, the poll loop, commits with metadata, pause/resume and close.
librdkafka calls block, so they run in worker threads; the rebalance callbacks fire inside `consume()` on the
poll thread and are brought back into trio with `trio.from_thread.run`, so the engine sees assignment changes
in order with everything else. Must not import the ledger or the HTTP modules: it hands raw messages and
partition events to a `SourceListener`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import trio
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

log = logging.getLogger("sidecar.source")

# Offsets librdkafka uses for "no committed offset".
OFFSET_INVALID = -1001

# Properties the sidecar must own: it stores offsets and commits them itself, with metadata.
OWNED_PROPERTIES = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
}


@dataclass(frozen=True, slots=True)
class AssignedPartition:
    topic: str
    partition: int
    committed_offset: int | None  # None when the group has no committed offset for it
    metadata: str | None


@dataclass(frozen=True, slots=True)
class OffsetToCommit:
    topic: str
    partition: int
    offset: int
    metadata: str


class SourceListener(Protocol):
    async def on_assigned(self, partitions: Sequence[AssignedPartition]) -> None: ...

    async def on_revoked(self, partitions: Sequence[tuple[str, int]]) -> Sequence[OffsetToCommit]:
        """Fence the partitions and return their final state to commit (before they leave)."""
        ...

    async def on_lost(self, partitions: Sequence[tuple[str, int]]) -> None: ...

    async def on_messages(self, messages: Sequence[Message]) -> None: ...


class SourceError(Exception):
    """A consumer error the sidecar cannot continue after."""


def consumer_properties(kafka: Mapping[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = {"auto.offset.reset": "earliest"}
    props.update(kafka)
    props.update(OWNED_PROPERTIES)
    if str(props.get("group.protocol", "classic")) == "classic":
        # Incremental rebalances keep the partitions that stay put flowing during a rebalance.
        props.setdefault("partition.assignment.strategy", "cooperative-sticky")
    return props


class KafkaSource:
    def __init__(
        self,
        kafka: Mapping[str, Any],
        topics: Sequence[str],
        listener: SourceListener,
        batch_size: int = 500,
        poll_timeout_s: float = 0.1,
    ) -> None:
        self._props = consumer_properties(kafka)
        self._topics = list(topics)
        self._listener = listener
        self._batch_size = batch_size
        self._poll_timeout_s = poll_timeout_s
        self._consumer: Consumer | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._closed = False
        self._stop_polling = False
        self._commit_lock = trio.Lock()
        self.assigned: set[tuple[str, int]] = set()
        self.paused: set[tuple[str, int]] = set()
        self.fatal_error: str | None = None
        self.broker_ok = True
        self._stopped = trio.Event()

    @property
    def consumer(self) -> Consumer:
        assert self._consumer is not None, "start() first"
        return self._consumer

    def start(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        props = dict(self._props)
        props["error_cb"] = self._on_error
        self._consumer = Consumer(props, logger=logging.getLogger("sidecar.librdkafka"))
        self._consumer.subscribe(
            self._topics,
            on_assign=self._cb_assign,
            on_revoke=self._cb_revoke,
            on_lost=self._cb_lost,
        )

    def _on_error(self, err: KafkaError) -> None:
        # librdkafka's global errors (on the poll thread); all brokers down is what readiness reports.
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self.broker_ok = False
        log.warning("kafka client error: %s", err)

    # -- rebalance callbacks: run on the poll thread, inside consume() -------------------------

    def _cb_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            committed = consumer.committed(partitions, timeout=30) if partitions else []
        except KafkaException as exc:
            # Without the committed state we cannot know what is done; librdkafka will retry
            # the assignment's fetch from the committed offset anyway, so start with no metadata.
            log.warning(
                "reading committed offsets failed: %s; starting without delivery state", exc
            )
            committed = [TopicPartition(p.topic, p.partition, OFFSET_INVALID) for p in partitions]
        assigned = [
            AssignedPartition(
                tp.topic,
                tp.partition,
                tp.offset if tp.offset >= 0 else None,
                tp.metadata if tp.offset >= 0 else None,
            )
            for tp in committed
        ]
        for tp in partitions:
            self.assigned.add((tp.topic, tp.partition))
        self._to_trio(self._listener.on_assigned, assigned)
        log.info("assigned %s", _names(partitions))

    def _cb_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        offsets = self._to_trio(self._listener.on_revoked, keys)
        if offsets:
            try:
                consumer.commit(offsets=_to_tps(offsets), asynchronous=False)
            except KafkaException as exc:
                # The next owner re-reads from the last successful commit: redelivery, never loss.
                log.warning("commit on revoke failed: %s", exc)
        for key in keys:
            self.assigned.discard(key)
            self.paused.discard(key)
        log.info("revoked %s", _names(partitions))

    def _cb_lost(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self._to_trio(self._listener.on_lost, keys)
        for key in keys:
            self.assigned.discard(key)
            self.paused.discard(key)
        log.warning("lost %s (no commit possible)", _names(partitions))

    def _to_trio(self, fn: Any, arg: Any) -> Any:
        if self._closed and self._token is None:
            return None
        return trio.from_thread.run(fn, arg, trio_token=self._token)

    # -- the poll loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Poll until `stop_polling()`; hands every message batch to the listener, in order."""
        consumer = self.consumer
        try:
            await self._poll_loop(consumer)
        finally:
            self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _poll_loop(self, consumer: Consumer) -> None:
        while not self._stop_polling:
            messages: list[Message] = await trio.to_thread.run_sync(
                consumer.consume, self._batch_size, self._poll_timeout_s
            )
            if messages:
                self.broker_ok = True
            good: list[Message] = []
            for msg in messages:
                err = msg.error()
                if err is None:
                    good.append(msg)
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.fatal():
                    self.fatal_error = str(err)
                    raise SourceError(f"fatal consumer error: {err}")
                log.warning("consumer error: %s", err)
            if good:
                await self._listener.on_messages(good)

    def stop_polling(self) -> None:
        self._stop_polling = True

    async def commit(self, offsets: Sequence[OffsetToCommit]) -> None:
        """Commit offsets with their metadata, synchronously (the broker has them when this returns)."""
        if not offsets:
            return
        tps = _to_tps(offsets)
        async with self._commit_lock:
            await trio.to_thread.run_sync(self._commit_sync, tps)

    def _commit_sync(self, tps: list[TopicPartition]) -> None:
        try:
            result = self.consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError._NO_OFFSET:
                return
            raise
        for tp in result or []:
            if tp.error is not None:
                raise KafkaException(tp.error)
        self.broker_ok = True

    def pause(self, keys: Sequence[tuple[str, int]]) -> None:
        keys = [k for k in keys if k in self.assigned and k not in self.paused]
        if keys:
            self.consumer.pause([TopicPartition(t, p) for t, p in keys])
            self.paused.update(keys)

    def resume(self, keys: Sequence[tuple[str, int]]) -> None:
        keys = [k for k in keys if k in self.paused]
        if keys:
            self.consumer.resume([TopicPartition(t, p) for t, p in keys])
            self.paused.difference_update(keys)

    async def close(self) -> None:
        """Leave the group: runs the revoke callbacks (final commits) then closes the handle."""
        if self._consumer is None or self._closed:
            return
        consumer = self._consumer
        await trio.to_thread.run_sync(consumer.close)
        self._closed = True

    def lag(self) -> dict[tuple[str, int], int]:
        """High watermark minus position per assigned partition (from the local cache, no broker call)."""
        out: dict[tuple[str, int], int] = {}
        if self._consumer is None or self._closed:
            return out
        for topic, partition in list(self.assigned):
            tp = TopicPartition(topic, partition)
            try:
                _lo, hi = self._consumer.get_watermark_offsets(tp, cached=True)
                pos = self._consumer.position([tp])[0].offset
            except KafkaException:
                continue
            if hi >= 0 and pos >= 0:
                out[(topic, partition)] = max(0, hi - pos)
        return out


def _to_tps(offsets: Sequence[OffsetToCommit]) -> list[TopicPartition]:
    return [TopicPartition(o.topic, o.partition, o.offset, metadata=o.metadata) for o in offsets]


def _names(partitions: Sequence[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions) or "nothing"
