"""Plain DLQ writes (at-least-once): the producer handle, its delivery reports, `write()`.

Owns `PlainDlqWriter`: the producer handle, the lock every call on it takes, and the rule that
writing never loops and never drops silently (told in its docstring); and `Waves`, which hands
the records to librdkafka one wave per DLQ partition.

Imports the pure core, confluent-kafka and the DLQ modules below it (record, errors, topics); never the
ledger, the source, the engines or the HTTP modules.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from sidecar.core.deadletter import FailedRecord
from sidecar.kafka.dlq.errors import RETRIABLE_CODES, DlqFatalError
from sidecar.kafka.dlq.record import DLQ_HEADER_PREFIX, DlqRecord, build_dlq_record, estimated_size
from sidecar.kafka.dlq.tier_record import build_tier_record
from sidecar.kafka.dlq.topics import DlqTopics, producer_properties
from sidecar.kafka.errors import kafka_error
from sidecar.kafka.logsummary import librdkafka_logger

log = logging.getLogger("sidecar.dlq")


@dataclass(slots=True)
class _Pending:
    done: trio.Event = field(default_factory=trio.Event)
    error: KafkaError | None = None


class Waves:
    """Hands DLQ records to librdkafka one wave per DLQ partition: a record waits while its partition
    has records whose delivery report is not back, and goes with the others that waited once they are.

    librdkafka's idempotent producer sends no further request to a partition while five or more of its
    messages are in flight (`rd_kafka_toppar_producer_serve` in src/rdkafka_broker.c compares the
    partition's in-flight message count with the limit of five requests), yet a message queued past
    `linger.ms` sets its broker thread's next wake-up to now (`rd_kafka_msgq_allow_wakeup_at` in
    src/rdkafka_msg.c): that thread spins until the broker's acknowledgement arrives. Held here, the records wait without a thread; librdkafka sends each wave
    as one request, which is all it would have sent meanwhile.
    """

    __slots__ = ("_next", "_unconfirmed")

    def __init__(self) -> None:
        self._unconfirmed: dict[tuple[str, int], int] = {}
        self._next: dict[tuple[str, int], trio.Event] = {}

    def waiting(self) -> int:
        """DLQ partitions with a wave in flight."""
        return len(self._unconfirmed)

    async def turn(self, key: tuple[str, int]) -> None:
        """Return once a record for `key` may go to librdkafka (then `handed` at once)."""
        if self._unconfirmed.get(key):
            event = self._next.get(key)
            if event is None:
                event = self._next[key] = trio.Event()
            await event.wait()

    def handed(self, key: tuple[str, int]) -> None:
        """A record for `key` was handed to librdkafka; `confirmed` when its report is back."""
        self._unconfirmed[key] = self._unconfirmed.get(key, 0) + 1

    def confirmed(self, key: tuple[str, int]) -> None:
        left = self._unconfirmed.get(key, 0) - 1
        if left > 0:
            self._unconfirmed[key] = left
            return
        self._unconfirmed.pop(key, None)
        event = self._next.pop(key, None)
        if event is not None:
            event.set()

    def release_all(self) -> None:
        """The producer was replaced: what the old one held will never be reported; let all go."""
        self._unconfirmed.clear()
        events, self._next = self._next, {}
        for event in events.values():
            event.set()


class PlainDlqWriter:
    """Writes DLQ records with acks=all and waits for the broker's confirmation of each.

    Writing never loops and never drops silently (docs/guarantees.md): an idempotent acks=all producer, retriable failures retried, a record too large
    retried once as headers only, anything else fatal — never an infinite loop and never a silent drop.

    `PlainDlqWriter` owns the producer handle: `run()` creates it and serves its delivery reports; every call
    that acts on the handle (produce, and in :mod:`sidecar.kafka.dlq.txn` the transaction calls and the swap of
    a replaced producer) takes `_handle_lock`, one at a time in order; the poll does not (librdkafka's handle is
    thread-safe, and a poll only waits for reports). Every call that can wait (poll, the transaction calls) runs
    in a worker thread, so the trio thread never blocks on librdkafka; produce() only queues a record and
    returns, so it runs in the trio thread. Delivery reports come back to
    trio through the trio token; only the trio thread changes the writer's counters. The transaction protocol
    (a subclass, :class:`sidecar.kafka.dlq.txn.DlqWriter`) may replace the handle, under the same lock.
    """

    def __init__(
        self,
        kafka: Mapping[str, Any],
        group: str,
        copy_record: bool,
        stacktrace_max_bytes: int,
        retries_timeout_ms: int,
        auto_create: bool,
        topic_partitions: int,
        topic_replication_factor: int,
        transactional_id: str | None = None,
    ) -> None:
        self._kafka = dict(kafka)
        self.group = group
        self.copy_record = copy_record
        self.stacktrace_max_bytes = stacktrace_max_bytes
        self.retries_timeout_ms = retries_timeout_ms
        self.topics = DlqTopics(
            kafka,
            auto_create=auto_create,
            topic_partitions=topic_partitions,
            topic_replication_factor=topic_replication_factor,
        )
        self._producer: Producer | None = None
        # The transactional mode's id (sidecar.kafka.dlq.txn); None: plain writes. Fixed before run().
        self.transactional_id = transactional_id
        self._handle_lock = trio.Lock()  # one call on the producer handle at a time (FIFO)
        self._token: trio.lowlevel.TrioToken | None = None
        # Event-driven polling (see run()): set when a call may have given the producer work.
        self._poll_wake = trio.Event()
        self._poll_asked = False
        self._waves = Waves()  # records handed to librdkafka one wave per DLQ partition
        self.poll_sleeping = False  # nothing to serve: the poll loop waits for a call on the handle
        self.written = 0
        self.failed = 0
        self.copies_dropped = 0
        # App-supplied `__dlq.*` headers left out of written DLQ records (see is_reserved_header).
        self.reserved_headers_dropped = 0
        self._reserved_drop_logged = False
        self._init_protocol()

    def _init_protocol(self) -> None:
        """The subclass's own state (the transaction protocol's), set up at the end of __init__."""

    # -- start-up ---------------------------------------------------------------------------------

    @property
    def auto_create(self) -> bool:
        return self.topics.auto_create

    def admin(self) -> AdminClient:
        return self.topics.admin()

    def prepare_topics_sync(self, topics: Sequence[str]) -> dict[str, int]:
        """Make sure every DLQ topic exists (creating it when allowed) and learn its partition count."""
        return self.topics.prepare_sync(topics)

    def _new_producer(self) -> Producer:
        return Producer(
            producer_properties(self._kafka, self.transactional_id),
            logger=librdkafka_logger(),
        )

    async def _started(self) -> None:
        """Called once the producer exists, before run() reports started (the transactional
        protocol initialises its transactions here)."""

    def _poll_failed(self, producer: Producer, err: KafkaError) -> bool:
        """A poll reported `err` (fatal): True when the subclass took care of it, else it is raised."""
        return False

    # -- running ----------------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the producer: serve its delivery reports while any are due, then flush what is pending.

        Event-driven: the producer is polled only while it has work (`len(producer)`: records not
        yet confirmed, reports and events not yet served) or after a call that may have queued an
        event (`_ask_poll`); otherwise this task sleeps on an event, so an idle writer does no
        periodic work. A fatal error that librdkafka reports while nothing is due surfaces with
        the next call on the handle (its own error, or the poll that call asks for).
        """
        self._token = trio.lowlevel.current_trio_token()
        self._producer = self._new_producer()
        await self._started()
        self._ask_poll()  # serve whatever start-up queued (logs), once
        task_status.started()
        try:
            while True:
                await self._wait_poll_work()
                # Not under the handle lock: librdkafka's handle is thread-safe, and a poll waits
                # up to its timeout for something to serve. Held across that wait, the lock would
                # make every produce and transaction call queue behind it (a transaction's commit
                # would wait out a whole idle poll). The lock
                # orders the calls that act on the producer (produce, the transaction calls, the
                # swap in the transaction protocol's _replace_producer). A poll of a producer
                # swapped out meanwhile only serves that producer's own reports, and
                # _poll_failed ignores what a replaced producer reports.
                producer = self._producer
                try:
                    await trio.to_thread.run_sync(producer.poll, 0.02, abandon_on_cancel=True)
                except KafkaException as exc:
                    if not self._poll_failed(producer, kafka_error(exc)):
                        raise
                await trio.lowlevel.checkpoint()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(12):
                await trio.to_thread.run_sync(self._producer.flush, 10, abandon_on_cancel=True)

    def _release_waves(self) -> None:
        """The producer was swapped (under the handle lock): the old one's reports never come."""
        self._waves.release_all()
        self._waves = Waves()

    def _ask_poll(self) -> None:
        """Poll the producer at least once more (a call on the handle may have queued an event)."""
        self._poll_asked = True
        self._poll_wake.set()

    async def _wait_poll_work(self) -> None:
        """Return once the producer has something to serve; sleep (no thread, no timer) otherwise."""
        while True:
            if self._poll_asked:
                self._poll_asked = False
                return
            producer = self._producer
            # rd_kafka_outq_len(): brief and non-blocking, safe from the trio thread.
            if producer is not None and len(producer) > 0:
                return
            self._poll_wake = trio.Event()
            self.poll_sleeping = True
            try:
                await self._poll_wake.wait()
            finally:
                self.poll_sleeping = False

    def _dlq_record(
        self, failed: FailedRecord, dlq_topic: str, drop_copy_reason: str | None = None
    ) -> DlqRecord:
        """The DLQ record for `failed` in `dlq_topic` (whose partitions are known), as configured;
        with `drop_copy_reason`, the error context headers only. A retry tier's record (`failed.tier`
        set) is `build_tier_record`'s, always whole."""
        if failed.tier is not None:
            return build_tier_record(failed, dlq_topic, self.topics.partitions[dlq_topic])
        return build_dlq_record(
            failed,
            dlq_topic,
            self.topics.partitions[dlq_topic],
            self.copy_record,
            self.stacktrace_max_bytes,
            drop_copy_reason=drop_copy_reason,
        )

    async def write(self, failed: FailedRecord, dlq_topic: str) -> DlqRecord:
        """Write the DLQ record for `failed` and return once the broker confirmed it (acks=all).

        Retriable failures are retried with backoff for up to `retries_timeout_ms`; a record too large
        for the topic is written once more as headers only; anything else raises DlqFatalError.
        """
        started = time.monotonic()
        delay_s = 0.2
        drop_reason: str | None = None
        too_large_seen = 0
        while True:
            if dlq_topic not in self.topics.partitions:
                await trio.to_thread.run_sync(self.prepare_topics_sync, [dlq_topic])
            record = self._dlq_record(failed, dlq_topic, drop_reason)
            limit = self.topics.max_bytes.get(dlq_topic)
            if failed.tier is not None:
                limit = None  # a tier record is never cut to headers: the broker's word decides
            if drop_reason is None and limit is not None and estimated_size(record) > limit:
                drop_reason = (
                    f"record too large for DLQ topic {dlq_topic} (about {estimated_size(record)} bytes, "
                    f"max.message.bytes={limit}); written with the error context headers only"
                )
                continue
            err = await self._produce(record)
            if err is None:
                self.written += 1
                if drop_reason is not None:
                    self.copies_dropped += 1
                self._count_dropped_headers(record, failed)
                return record
            self.failed += 1
            code = err.code()
            if code == KafkaError.MSG_SIZE_TOO_LARGE and failed.tier is not None:
                too_large_seen += 1
                if too_large_seen == 1:
                    continue  # maybe batched with a larger one: once more on its own
                raise DlqFatalError(
                    f"the retry tier record of {failed.topic}[{failed.partition}]@{failed.offset} is "
                    f"too large for {dlq_topic} ({err.str()}); its offset is not committed"
                )
            if code == KafkaError.MSG_SIZE_TOO_LARGE and drop_reason is None:
                too_large_seen += 1
                if too_large_seen == 1 and limit is not None:
                    # The broker checks whole batches: a small record batched with a large one is
                    # rejected with it. It fits on its own, so write it again unchanged.
                    continue
                drop_reason = (
                    f"record too large for DLQ topic {dlq_topic} ({err.str()}); "
                    "written with the error context headers only"
                )
                log.warning(
                    "DLQ record for %s[%d]@%d too large; retrying headers only",
                    failed.topic,
                    failed.partition,
                    failed.offset,
                )
                continue
            if code in (
                KafkaError.UNKNOWN_TOPIC_OR_PART,
                KafkaError._UNKNOWN_TOPIC,
                KafkaError._UNKNOWN_PARTITION,
            ):
                exists = await trio.to_thread.run_sync(self.topics.exists_sync, dlq_topic)
                if not exists and not self.auto_create:
                    raise DlqFatalError(
                        f"DLQ topic {dlq_topic} does not exist and auto-create is off; the record "
                        f"{failed.topic}[{failed.partition}]@{failed.offset} was not written and its offset "
                        "is not committed"
                    )
                self.topics.forget(dlq_topic)
            elif not (err.retriable() or code in RETRIABLE_CODES):
                raise DlqFatalError(
                    f"writing the DLQ record of {failed.topic}[{failed.partition}]@{failed.offset} to "
                    f"{dlq_topic} failed: {err.name()}: {err.str()}"
                )
            if (time.monotonic() - started) * 1000 > self.retries_timeout_ms:
                raise DlqFatalError(
                    f"writing the DLQ record of {failed.topic}[{failed.partition}]@{failed.offset} to "
                    f"{dlq_topic} kept failing for {self.retries_timeout_ms} ms: {err.name()}: {err.str()}"
                )
            log.warning(
                "DLQ write to %s failed (%s), retrying in %.1fs", dlq_topic, err.name(), delay_s
            )
            await trio.sleep(delay_s)
            delay_s = min(delay_s * 2, 5.0)

    def _count_dropped_headers(self, record: DlqRecord, failed: FailedRecord) -> None:
        """Count the app's `__dlq.*` headers left out of a written record; warn the first time only
        (a misbehaving app would otherwise write one warning per record), later ones at debug."""
        if not record.dropped_headers:
            return
        self.reserved_headers_dropped += len(record.dropped_headers)
        level = logging.DEBUG if self._reserved_drop_logged else logging.WARNING
        self._reserved_drop_logged = True
        shown = ", ".join(repr(name[:64]) for name in record.dropped_headers[:5])
        log.log(
            level,
            "the app's DLQ headers for %s[%d]@%d tried to set the sidecar's own %s* headers; dropped %d "
            "(%s)%s",
            failed.topic,
            failed.partition,
            failed.offset,
            DLQ_HEADER_PREFIX,
            len(record.dropped_headers),
            shown,
            "" if level == logging.DEBUG else "; further drops are logged at debug level",
        )

    async def _produce(self, record: DlqRecord) -> KafkaError | None:
        assert self._producer is not None and self._token is not None, "run() first"
        pending = _Pending()
        token = self._token
        key = (record.topic, record.partition)
        await self._waves.turn(key)
        waves = self._waves  # a new one if the producer was replaced meanwhile

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            # Called on the poll thread; hand the result back to trio.
            def finish() -> None:
                pending.error = err
                pending.done.set()
                waves.confirmed(key)

            token.run_sync_soon(finish)

        while True:
            try:
                # Under the handle lock (a transaction call in progress first, in
                # order), but in this thread: produce() only queues the record in librdkafka and
                # returns (a full queue raises BufferError at once), so it needs no worker
                # thread, which would cost two thread wake-ups per DLQ record.
                async with self._handle_lock:
                    assert self._producer is not None
                    self._producer.produce(
                        record.topic,
                        value=record.value,
                        key=record.key,
                        partition=record.partition,
                        headers=list(record.headers),
                        on_delivery=on_delivery,
                    )
                    waves.handed(key)  # before any report of it can come back
                self._ask_poll()  # its delivery report is due: poll until it is served
                break
            except BufferError:
                await trio.sleep(0.01)
            except KafkaException as exc:
                return kafka_error(exc)
        await pending.done.wait()
        return pending.error


__all__ = ["PlainDlqWriter"]
