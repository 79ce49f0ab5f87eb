"""Dead-letter records: what goes into one (pure `build_dlq_record`) and writing it safely (`DlqWriter`).

The record follows KIP-1191: `__dlq.errors.*` context headers (UTF-8 strings, numbers in decimal) that overwrite
same-named original headers, the key/value/headers copied only when asked, partition = source partition modulo the
DLQ topic's partition count, and Kafka 4.4's cause text in `__dlq.errors.message`. Writing follows seed 004: an
idempotent acks=all producer, retriable failures retried, a record too large retried once as headers only, anything
else fatal — never an infinite loop and never a silent drop.

`FailedRecord` (the DLQ step's output) and the cause texts come from the pure core (`sidecar.deadletter`,
`sidecar.outcome`) and are re-exported here. Must not import the ledger, the source or the HTTP modules.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.cimpl import NewTopic

from sidecar.core.deadletter import FailedRecord
from sidecar.core.errors import DlqError
from sidecar.core.outcome import CAUSE_DELIVERY_COUNT, CAUSE_REJECTED  # noqa: F401 (re-exported)

log = logging.getLogger("sidecar.dlq")

H_TOPIC = "__dlq.errors.topic"
H_PARTITION = "__dlq.errors.partition"
H_OFFSET = "__dlq.errors.offset"
H_GROUP = "__dlq.errors.group"
H_DELIVERY_COUNT = "__dlq.errors.delivery.count"
H_EXC_CLASS = "__dlq.errors.exception.class.name"
H_EXC_MESSAGE = "__dlq.errors.exception.message"
H_EXC_STACKTRACE = "__dlq.errors.exception.stacktrace"
H_MESSAGE = "__dlq.errors.message"
# Ours, in the same namespace: set when the copy of the original record had to be dropped.
H_COPY_DROPPED = "__dlq.errors.copy.dropped"
DLQ_HEADER_PREFIX = "__dlq."
# Markers `dlq-sidecar dlq replay` puts on a replayed record (sidecar/dlqtool.py). They are the record's
# replay history: a DLQ record must keep them even when the original headers are not copied, so a record
# that fails again after a replay is recognisable and never replayed in a loop.
REPLAY_HEADER_PREFIX = "__dlq.replay."

# The topic config Kafka 4.4 checks before a share group may use a topic as its DLQ (KIP-1191).
TOPIC_CONFIG_GROUP_DLQ = "errors.deadletterqueue.group.enable"

Header = tuple[str, bytes | None]

# Transactional mode. Every librdkafka transaction call gets TXN_CALL_TIMEOUT_S and is called again on a
# retriable error for up to TXN_RETRY_BUDGET_S. A call still blocked TXN_CALL_WATCHDOG_S after it began is
# given up on: send_offsets_to_transaction() waits for its result with no time limit, and its coordinator
# request never times out (librdkafka issues #5456, #5511: after a broker restart the group coordinator
# can stay cached as a decommissioned broker, and nothing wakes the request up). Such a producer is
# replaced by a new one with the same transactional.id, which fences it and aborts its transaction.
TXN_CALL_TIMEOUT_S = 10.0
TXN_RETRY_BUDGET_S = 30.0
TXN_CALL_WATCHDOG_S = 25.0
TXN_INIT_TIMEOUT_S = 60.0

# After an abort, the DLQ partitions the transaction wrote to are checked for its ABORT marker: their last
# stable offset must pass the end of the log as it was right after the abort. A Kafka 4.x broker can skip
# the marker when the partition has no leader at that moment (KAFKA-20734: the transaction coordinator
# takes the partition for deleted), which leaves the aborted DLQ records in an open transaction that the
# producer's next commit to that partition would commit: a DLQ record written twice. Other producers'
# transactions may hold the stable offset back for ABORT_SETTLE_S; past that, an abort-only transaction
# (one probe record per partition, then abort) writes the missing marker, at most ABORT_REPAIR_ROUNDS times.
ABORT_SETTLE_S = 3.0
ABORT_REPAIR_ROUNDS = 2
ABORT_CHECK_BUDGET_S = 20.0
PROBE_HEADER = "__dlq.sidecar.abort.probe"

# A commit whose outcome is unknown (commit_transaction() failed fatally, overstayed its watchdog, kept
# timing out, or its transaction could not be aborted afterwards) is settled instead of stopping the
# sidecar: the producer is replaced (the new one's init_transactions() returns once the coordinator has
# ended the old transaction, completing a commit that reached it and aborting anything else), then the
# group's committed offsets are read, stable ones only (UNSTABLE_OFFSET_COMMIT is waited out), for up
# to OUTCOME_READ_BUDGET_S and compared with what the transaction sent (`transaction_committed`).
OUTCOME_READ_BUDGET_S = 60.0


@dataclass(frozen=True, slots=True)
class DlqRecord:
    """What `DlqWriter` hands to produce(): every header name has a UTF-8 encoding.

    `dropped_headers` names the app's extra headers that were left out because they would have set
    one of ours (`is_reserved_header`); the writer counts and logs them.
    """

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    dropped_headers: tuple[str, ...] = ()


def is_reserved_header(name: str) -> bool:
    """True for a header name in the sidecar's own namespace (`__dlq.`, in any case).

    The app may add headers to its DLQ record (KIP-1034), never set ours: a `__dlq.replay.count` from
    the app would reset the replay loop guard, a `__dlq.errors.topic` would misdirect a replay.
    """
    return name[: len(DLQ_HEADER_PREFIX)].lower() == DLQ_HEADER_PREFIX


def _encodable_name(name: str) -> str:
    # confluent-kafka encodes header names as UTF-8 in C and crashes (a segfault, not an exception) on a
    # lone surrogate. The wire refuses those from the app; anything else that carries one (a source
    # header name, a future caller) has it replaced here, so produce() is never handed one.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return name.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return name


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", errors="replace")


def _cap_utf8(text: str, max_bytes: int) -> bytes:
    data = _utf8(text)
    if len(data) <= max_bytes:
        return data
    marker = b"... [truncated]"
    cut = data[: max(0, max_bytes - len(marker))]
    # Do not end in the middle of a multi-byte character.
    return cut.decode("utf-8", errors="ignore").encode() + marker


def build_dlq_record(
    failed: FailedRecord,
    dlq_topic: str,
    dlq_partitions: int,
    copy_record: bool,
    stacktrace_max_bytes: int,
    *,
    drop_copy_reason: str | None = None,
) -> DlqRecord:
    """The DLQ record for `failed`. Pure: the same input always gives the same record.

    Header rules, in one place: the context headers (`H_*`) are ours; the app's extra headers are added
    unless `is_reserved_header` (then they are dropped and named in `dropped_headers`) and overwrite
    same-named original headers; original headers are copied only with `copy_record` (the replay
    history always). Every name is made encodable and every text value is UTF-8 (unencodable code points
    replaced), so nothing reaches produce() that it cannot encode.
    """
    context: list[tuple[str, bytes]] = [
        (H_TOPIC, _utf8(failed.topic)),
        (H_PARTITION, str(failed.partition).encode()),
        (H_OFFSET, str(failed.offset).encode()),
        (H_GROUP, _utf8(failed.group)),
        (H_DELIVERY_COUNT, str(failed.delivery_count).encode()),
        (H_MESSAGE, _utf8(failed.cause)),
    ]
    if failed.exception_class:
        context.append((H_EXC_CLASS, _utf8(failed.exception_class)))
    if failed.exception_message is not None and (
        failed.exception_class or failed.exception_message
    ):
        context.append((H_EXC_MESSAGE, _cap_utf8(failed.exception_message, 16384)))
    if failed.stacktrace:
        context.append((H_EXC_STACKTRACE, _cap_utf8(failed.stacktrace, stacktrace_max_bytes)))
    copy = copy_record and drop_copy_reason is None
    if drop_copy_reason is not None:
        context.append((H_COPY_DROPPED, _utf8(drop_copy_reason)))
    app_headers: list[tuple[str, bytes]] = []
    dropped: list[str] = []
    for raw_name, header_value in failed.extra_headers:
        name = _encodable_name(raw_name)
        if is_reserved_header(name):
            dropped.append(name)
        else:
            app_headers.append((name, header_value))
    overridden = {name for name, _ in context} | {n for n, _ in app_headers}

    originals = ((_encodable_name(n), v) for n, v in failed.headers)
    headers: list[Header] = []
    if copy:
        # Original headers first, in order; same-named context and app headers overwrite (drop) them.
        headers.extend((n, v) for n, v in originals if n not in overridden)
    else:
        # Headers only: still carry the replay history (see REPLAY_HEADER_PREFIX).
        headers.extend(
            (n, v)
            for n, v in originals
            if n.startswith(REPLAY_HEADER_PREFIX) and n not in overridden
        )
    headers.extend(app_headers)
    headers.extend(context)

    if failed.replacement_value_set and drop_copy_reason is None:
        value = failed.replacement_value
    else:
        value = failed.value if copy else None
    key = failed.key if copy else None
    return DlqRecord(
        topic=dlq_topic,
        partition=failed.partition % max(1, dlq_partitions),
        key=key,
        value=value,
        headers=tuple(headers),
        dropped_headers=tuple(dropped),
    )


# ------------------------------------------------------------------------------------------- writer


class DlqFatalError(DlqError):
    """A DLQ record could not be written and retrying cannot help: the sidecar must stop."""


class DlqTxnAbortable(DlqError):
    """Transactional mode: the open transaction cannot commit. After `txn_abort()` it may be redone."""


class DlqTxnStuck(DlqTxnAbortable):
    """A transaction call overstayed its watchdog; `txn_abort()` replaces the producer."""


class DlqStartupError(DlqError):
    """A DLQ topic is missing, cannot be created, or cannot be described at start-up."""


@dataclass(slots=True)
class _Pending:
    done: trio.Event = field(default_factory=trio.Event)
    error: KafkaError | None = None


def producer_properties(
    kafka: Mapping[str, Any], transactional_id: str | None = None
) -> dict[str, Any]:
    """The DLQ producer's properties: the user's connection settings, our safety settings."""
    consumer_only = {
        "group.id",
        "group.instance.id",
        "group.protocol",
        "group.remote.assignor",
        "auto.offset.reset",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "partition.assignment.strategy",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "max.poll.interval.ms",
        "fetch.min.bytes",
        "fetch.wait.max.ms",
        "fetch.max.bytes",
        "max.partition.fetch.bytes",
        "isolation.level",
        "enable.partition.eof",
        "queued.min.messages",
        "queued.max.messages.kbytes",
        "auto.commit.interval.ms",
        "check.crcs",
        "max.poll.records",
        "share.acknowledgement.mode",
        "transactional.id",
    }
    props = {k: v for k, v in kafka.items() if k not in consumer_only}
    props.update(
        {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            # A write that cannot be confirmed within this time is reported to us and retried by us,
            # so the partition stays paused and nothing is committed past the record meanwhile.
            "message.timeout.ms": 30000,
            # A deleted DLQ topic must surface in seconds (and stop the sidecar when auto-create
            # is off), not after librdkafka's default 30 s of waiting for metadata.
            "topic.metadata.propagation.max.ms": 5000,
        }
    )
    if transactional_id:
        props["transactional.id"] = transactional_id
    return props


class DlqWriter:
    """Writes DLQ records with acks=all and waits for the broker's confirmation of each."""

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
    ) -> None:
        self._kafka = dict(kafka)
        self.group = group
        self.copy_record = copy_record
        self.stacktrace_max_bytes = stacktrace_max_bytes
        self.retries_timeout_ms = retries_timeout_ms
        self.auto_create = auto_create
        self.topic_partitions = topic_partitions
        self.topic_replication_factor = topic_replication_factor
        self._producer: Producer | None = None
        self.transactional_id: str | None = None  # set before run() for the transactional mode
        self._handle_lock = trio.Lock()  # one call on the producer handle at a time (FIFO)
        self._stuck = False  # a transaction call on the producer overstayed its watchdog
        # The producer's fatal error, when replacing the producer recovers from it (`replaceable`):
        # the producer is replaced before it is used again.
        self._broken: KafkaError | None = None
        self._in_txn = False  # begun and not yet committed or aborted
        self._abandoned: list[Producer] = []  # fenced producers a thread may still be blocked in
        # DLQ partitions the open transaction has written to (or tried to), checked after an abort.
        self._txn_touched: set[tuple[str, int]] = set()
        self.abort_markers_repaired = 0
        self.producers_replaced = 0
        self.outcomes_settled = 0  # commits whose unknown outcome was read from the group's offsets
        self._partitions: dict[str, int] = {}
        self._max_bytes: dict[str, int | None] = {}
        self._token: trio.lowlevel.TrioToken | None = None
        self._polling = False
        self.written = 0
        self.failed = 0
        self.copies_dropped = 0
        # App-supplied `__dlq.*` headers left out of written DLQ records (see is_reserved_header).
        self.reserved_headers_dropped = 0
        self._reserved_drop_logged = False

    # -- start-up ---------------------------------------------------------------------------------

    def admin(self) -> AdminClient:
        return AdminClient(producer_properties(self._kafka))

    def prepare_topics_sync(self, topics: Sequence[str]) -> dict[str, int]:
        """Make sure every DLQ topic exists (creating it when allowed) and learn its partition count."""
        admin = self.admin()
        try:
            md = admin.list_topics(timeout=15)
        except KafkaException as exc:
            raise DlqStartupError(
                f"cannot read cluster metadata to check the DLQ topics: {exc}"
            ) from exc
        missing = [t for t in dict.fromkeys(topics) if t not in md.topics]
        if missing and not self.auto_create:
            raise DlqStartupError(
                f"DLQ topic(s) {', '.join(missing)} do not exist and "
                "errors.deadletterqueue.auto.create.enable is false; create them or enable auto-create"
            )
        for topic in missing:
            self._create_topic(admin, topic)
        deadline = time.monotonic() + 30
        out: dict[str, int] = {}
        for topic in dict.fromkeys(topics):
            while True:
                tmd = admin.list_topics(topic, timeout=10).topics.get(topic)
                if tmd is not None and tmd.error is None and tmd.partitions:
                    out[topic] = len(tmd.partitions)
                    break
                if time.monotonic() > deadline:
                    raise DlqStartupError(
                        f"DLQ topic {topic} has no partitions after 30s: {tmd and tmd.error}"
                    )
                time.sleep(0.1)
        self._partitions.update(out)
        for topic in out:
            self._max_bytes[topic] = self._topic_max_message_bytes(admin, topic)
        return out

    def _topic_max_message_bytes(self, admin: AdminClient, topic: str) -> int | None:
        res = ConfigResource(ConfigResource.Type.TOPIC, topic)
        try:
            configs = admin.describe_configs([res])[res].result(timeout=15)
            entry = configs.get("max.message.bytes")
            return int(entry.value) if entry is not None and entry.value else None
        except (KafkaException, ValueError, TypeError):
            return None  # not allowed to describe: learn it from a MSG_SIZE_TOO_LARGE instead

    def _create_topic(self, admin: AdminClient, topic: str) -> None:
        attempts: list[dict[str, str]] = [{TOPIC_CONFIG_GROUP_DLQ: "true"}, {}]
        last: Exception | None = None
        for config in attempts:
            new = NewTopic(
                topic, self.topic_partitions, self.topic_replication_factor, config=config
            )
            try:
                admin.create_topics([new], operation_timeout=30)[topic].result(timeout=30)
                log.info("created DLQ topic %s (%d partitions)", topic, self.topic_partitions)
                return
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    return
                if (
                    isinstance(err, KafkaError)
                    and err.code() == KafkaError.INVALID_CONFIG
                    and config
                ):
                    # A broker before 4.4 does not know the share-group DLQ topic config.
                    last = exc
                    continue
                raise DlqStartupError(f"cannot create DLQ topic {topic}: {exc}") from exc
        raise DlqStartupError(f"cannot create DLQ topic {topic}: {last}")

    # -- running ----------------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the producer: serve delivery reports until cancelled, then flush what is pending."""
        self._token = trio.lowlevel.current_trio_token()
        self._producer = Producer(
            producer_properties(self._kafka, self.transactional_id),
            logger=logging.getLogger("sidecar.librdkafka"),
        )
        if self.transactional_id:
            # Fences an earlier incarnation with the same id and aborts its open transaction.
            await trio.to_thread.run_sync(self._producer.init_transactions, 60)
        self._polling = True
        task_status.started()
        try:
            while True:
                # The handle is used by one thread at a time (confluent-kafka serialises calls,
                # and a poll loop re-taking it could starve a transaction call for minutes).
                async with self._handle_lock:
                    producer = self._producer
                    try:
                        await trio.to_thread.run_sync(producer.poll, 0.02, abandon_on_cancel=True)
                    except KafkaException as exc:
                        err = _kafka_error(exc)
                        if self._is_abandoned(producer):
                            # A producer being replaced (or already replaced) reports its own
                            # fencing (the successor's init_transactions() fenced it, possibly
                            # before the swap below could take this lock) or the fatal error it
                            # is replaced for. It is never used again.
                            log.info("the replaced DLQ producer reported %s; ignored", err)
                        elif self.transactional_id and replaceable(err):
                            # A transactional producer's fatal error also fails the transaction
                            # call under way (if any), which ends its transaction by replacing
                            # the producer; the next transaction begins on a new one anyway.
                            log.warning(
                                "the transactional DLQ producer failed (%s); it is replaced "
                                "before its next use",
                                err,
                            )
                            self._broken = err
                        else:
                            raise
                await trio.lowlevel.checkpoint()
        finally:
            self._polling = False
            with trio.CancelScope(shield=True), trio.move_on_after(12):
                await trio.to_thread.run_sync(self._producer.flush, 10, abandon_on_cancel=True)

    # -- transactional mode: DLQ records and the offset commit in one Kafka transaction -------------
    #
    # librdkafka's rules (rdkafka.h): an error from a transaction call is fatal (the producer is
    # unusable), requires an abort (abort_transaction(), then the transaction may be redone), or
    # is retriable (call the same function again; a timed-out commit_transaction() resumes where it
    # was). A fatal error stops the sidecar only when a new producer cannot get past it (`replaceable`):
    # otherwise the producer is replaced, which ends its transaction. Before commit_transaction() that
    # is an abort, and the transaction is redone; after it the outcome is read (`_settle_outcome`).

    async def _txn_call(self, what: str, fn: Callable[[Producer], Any]) -> Any:
        """Run `fn(producer)` in a thread; DlqTxnStuck when it is still blocked after the watchdog."""
        assert self._producer is not None
        producer = self._producer
        with trio.move_on_after(TXN_CALL_WATCHDOG_S):
            async with self._handle_lock:
                # Abandoned, not waited for, past the watchdog: the thread stays blocked in the old
                # producer until librdkafka lets go, and txn_abort() replaces that producer.
                return await trio.to_thread.run_sync(fn, producer, abandon_on_cancel=True)
        self._stuck = True
        raise DlqTxnStuck(f"{what} still blocked after {TXN_CALL_WATCHDOG_S:.0f} s")

    async def txn_begin(self) -> None:
        if self._broken is not None:
            await self._replace_producer()
        try:
            await self._txn_call("begin_transaction", lambda p: p.begin_transaction())
        except KafkaException as exc:
            # Begin fails only on a producer in the wrong state (an earlier transaction not ended),
            # or on one that failed fatally since: a new producer gets past the latter.
            err = _kafka_error(exc)
            if not (err.fatal() and replaceable(err)):
                raise DlqFatalError(f"cannot begin a DLQ transaction: {err}") from exc
            log.warning("begin_transaction: %s; replacing the producer", err)
            await self._replace_producer()
            try:
                await self._txn_call("begin_transaction", lambda p: p.begin_transaction())
            except KafkaException as again:
                raise DlqFatalError(
                    f"cannot begin a DLQ transaction: {_kafka_error(again)}"
                ) from again
        self._in_txn = True
        self._txn_touched = set()

    async def txn_produce(self, failed: FailedRecord, dlq_topic: str) -> DlqRecord:
        """Produce inside the open transaction and wait for the broker's acknowledgement.

        A record known to be too large goes headers-only up front: inside a transaction a failed
        produce poisons the whole transaction, so there is no retry-and-fall-back as in `write`.
        A retriable failure (a broker restart, a timeout) raises DlqTxnAbortable: the transaction is
        aborted and redone; so does a fatal error that a new producer recovers from (`replaceable`);
        anything else is fatal.
        """
        if dlq_topic not in self._partitions:
            await trio.to_thread.run_sync(self.prepare_topics_sync, [dlq_topic])
        if self._broken is not None:
            raise DlqTxnAbortable(f"the transactional DLQ producer failed: {self._broken}")
        record = build_dlq_record(
            failed,
            dlq_topic,
            self._partitions[dlq_topic],
            self.copy_record,
            self.stacktrace_max_bytes,
        )
        limit = self._max_bytes.get(dlq_topic)
        dropped = False
        if limit is not None and _estimated_size(record) > limit:
            record = build_dlq_record(
                failed,
                dlq_topic,
                self._partitions[dlq_topic],
                self.copy_record,
                self.stacktrace_max_bytes,
                drop_copy_reason=(
                    f"record too large for DLQ topic {dlq_topic} (max.message.bytes={limit}); "
                    "written with the error context headers only"
                ),
            )
            dropped = True
        self._txn_touched.add((record.topic, record.partition))
        err = await self._produce(record)
        if err is not None:
            self.failed += 1
            what = (
                f"transactional DLQ write of {failed.topic}[{failed.partition}]@{failed.offset} to "
                f"{dlq_topic} failed: {err.name()}: {err.str()}"
            )
            if err.fatal():
                if not replaceable(err):
                    raise DlqFatalError(what)
                self._broken = err
                raise DlqTxnAbortable(what)
            if (
                err.retriable()
                or err.txn_requires_abort()
                or err.code() in _RETRIABLE_CODES
                or err.code() in _TXN_PURGED
            ):
                raise DlqTxnAbortable(what)
            raise DlqFatalError(what)
        self.written += 1
        if dropped:
            self.copies_dropped += 1
        self._count_dropped_headers(record, failed)
        return record

    async def txn_commit(self, offsets: list[TopicPartition], group_metadata: object) -> None:
        """Add `offsets` to the open transaction and commit it.

        Returns once it committed. DlqTxnAbortable: it did not commit; abort it (a no-op when it has
        been ended here already), then it may be redone. DlqFatalError: the producer cannot go on
        (`replaceable`), or the outcome stayed unknown (the group's offsets unreadable).

        Once commit_transaction() has been called, the commit may have reached the coordinator
        whatever the call says, and an abort then is refused (INVALID_TXN_STATE, fatal) or would
        let a redo write the DLQ records twice. So every way out of the commit but a success ends
        the transaction here and knows how: an abort that succeeded, or `_settle_outcome`.
        """
        started = trio.current_time()
        if self._broken is not None:
            raise DlqTxnAbortable(f"the transactional DLQ producer failed: {self._broken}")
        while offsets:
            try:
                await self._txn_call(
                    "send_offsets_to_transaction",
                    lambda p: p.send_offsets_to_transaction(
                        offsets, group_metadata, TXN_CALL_TIMEOUT_S
                    ),
                )
                break
            except KafkaException as exc:
                # Not committing yet: whatever went wrong, an abort (or a fencing) ends it.
                err = _kafka_error(exc)
                if err.fatal():
                    if not replaceable(err):
                        raise DlqFatalError(f"send_offsets_to_transaction: {err}") from exc
                    self._broken = err
                    raise DlqTxnAbortable(f"send_offsets_to_transaction: {err}") from exc
                if (
                    not err.retriable()
                    or err.txn_requires_abort()
                    or trio.current_time() - started > TXN_RETRY_BUDGET_S
                ):
                    raise DlqTxnAbortable(f"send_offsets_to_transaction: {err}") from exc
                log.warning("send_offsets_to_transaction: %s; calling it again", err)
                await trio.sleep(0.5)
        while True:
            try:
                await self._txn_call(
                    "commit_transaction", lambda p: p.commit_transaction(TXN_CALL_TIMEOUT_S)
                )
                self._in_txn = False
                self._txn_touched = set()
                return
            except DlqTxnStuck as exc:
                # commit_transaction() keeps to its timeout; one that did not may have reached
                # the coordinator.
                why = str(exc)
            except KafkaException as exc:
                err = _kafka_error(exc)
                if err.fatal() and not replaceable(err):
                    raise DlqFatalError(f"commit_transaction: {err}") from exc
                if err.txn_requires_abort() and not err.fatal():
                    # librdkafka failed the transaction, but an EndTxn(commit) sent before may
                    # still have reached the coordinator (rd_kafka_txn_handle_EndTxn): only an
                    # abort that succeeds proves it did not.
                    if await self._abort_after_commit(f"commit_transaction: {err}"):
                        raise DlqTxnAbortable(f"commit_transaction: {err}") from exc
                    why = f"commit_transaction: {err}, and its abort failed"
                elif err.retriable() and not err.fatal():
                    if trio.current_time() - started <= TXN_RETRY_BUDGET_S:
                        # A timeout: the commit goes on in the background; calling the function
                        # again resumes it.
                        log.warning("commit_transaction: %s; calling it again", err)
                        await trio.sleep(0.5)
                        continue
                    why = f"commit_transaction kept failing for {TXN_RETRY_BUDGET_S:.0f} s: {err}"
                else:
                    why = f"commit_transaction: {err}"
            if await self._settle_outcome(offsets, why):
                return
            raise DlqTxnAbortable(f"{why}; it did not commit")

    async def _abort_after_commit(self, why: str) -> bool:
        """Abort a transaction whose commit failed; True when the abort succeeded (it did not commit).

        False when abort_transaction() failed or overstayed: the outcome is then unknown."""
        log.warning("%s; aborting the transaction", why)
        touched = self._txn_touched
        try:
            await self._txn_call(
                "abort_transaction", lambda p: p.abort_transaction(TXN_CALL_TIMEOUT_S)
            )
        except (KafkaException, DlqTxnStuck) as exc:
            err = _kafka_error(exc) if isinstance(exc, KafkaException) else None
            if err is not None and err.fatal() and not replaceable(err):
                raise DlqFatalError(f"abort_transaction: {err}") from exc
            if err is not None and err.fatal():
                self._broken = err
            log.warning("abort_transaction after a failed commit: %s", exc)
            return False
        self._in_txn = False
        self._txn_touched = set()
        if touched:
            await self._check_abort_markers(touched)
        return True

    async def _settle_outcome(self, offsets: list[TopicPartition], why: str) -> bool:
        """End a transaction whose commit's outcome is unknown and learn it: True when it committed.

        The new producer's init_transactions() fences the old one and returns once the coordinator
        has ended the old transaction, as it will stay; the group's stable committed offsets then
        say which way (`transaction_committed`). An aborted one's DLQ partitions are checked for
        the ABORT marker. DlqFatalError when the offsets cannot be read (see OUTCOME_READ_BUDGET_S).
        """
        if not offsets:
            raise DlqFatalError(f"the DLQ transaction commit's outcome is unknown: {why}")
        log.warning(
            "the DLQ transaction commit's outcome is unknown (%s); fencing the producer and reading "
            "the group's committed offsets to learn it",
            why,
        )
        touched, self._txn_touched = self._txn_touched, set()
        await self._replace_producer()
        parts = sorted({(tp.topic, tp.partition) for tp in offsets})
        committed = await self._group_offsets(
            parts, deadline=trio.current_time() + OUTCOME_READ_BUDGET_S
        )
        if committed is None:
            raise DlqFatalError(
                f"the DLQ transaction commit's outcome is unknown ({why}): the group's committed "
                f"offsets for {_names(parts)} could not be read within {OUTCOME_READ_BUDGET_S:.0f} s"
            )
        self.outcomes_settled += 1
        if transaction_committed(offsets, committed):
            log.warning("the DLQ transaction had committed (the group's offsets are its own)")
            return True
        log.warning("the DLQ transaction had not committed; it is redone")
        if touched:
            await self._check_abort_markers(touched)
        return False

    async def _group_offsets(
        self, parts: list[tuple[str, int]], *, deadline: float
    ) -> dict[tuple[str, int], tuple[int, str | None]] | None:
        """The group's stable committed offset and metadata of each partition, retried until
        `deadline` (a pending transactional commit, a coordinator loading); None when not read."""
        while True:
            try:
                return await trio.to_thread.run_sync(self._group_offsets_sync, parts)
            except (KafkaException, TimeoutError) as exc:
                if trio.current_time() + 0.5 > deadline:
                    log.warning("reading the group's committed offsets: %s", exc)
                    return None
                log.debug("reading the group's committed offsets: %s; again", exc)
            await trio.sleep(0.5)

    def _group_offsets_sync(
        self, parts: list[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int, str | None]]:
        admin = self.admin()  # referenced until the results are in: a dropped client never answers
        request = ConsumerGroupTopicPartitions(self.group, [TopicPartition(t, p) for t, p in parts])
        futures = admin.list_consumer_group_offsets(
            [request], require_stable=True, request_timeout=5
        )
        result = futures[self.group].result(timeout=10)
        out: dict[tuple[str, int], tuple[int, str | None]] = {}
        for tp in result.topic_partitions or []:
            if tp.error is not None:
                # UNSTABLE_OFFSET_COMMIT: a transactional commit is still pending on it.
                raise KafkaException(tp.error)
            out[(tp.topic, tp.partition)] = (tp.offset, tp.metadata)
        return out

    async def txn_abort(self) -> None:
        """End the open transaction without committing it. DlqFatalError when that cannot be done.

        Only for a transaction that did not commit: `txn_commit` settles the ones it has tried to
        commit. An abort that fails or overstays (or a producer stuck in an earlier call, which
        makes abort_transaction() answer "conflicting call in progress", or one that failed
        fatally) is done by fencing instead: a new producer with the same transactional.id; its
        init_transactions() aborts the transaction. Then the DLQ partitions it wrote to are checked
        for the ABORT marker (KAFKA-20734).
        """
        if not self._in_txn and not self._stuck and self._broken is None:
            return
        touched, self._txn_touched = self._txn_touched, set()
        await self._end_open_txn()
        if touched:
            await self._check_abort_markers(touched)

    async def _end_open_txn(self) -> None:
        started = trio.current_time()
        while not self._stuck and self._broken is None:
            try:
                await self._txn_call(
                    "abort_transaction", lambda p: p.abort_transaction(TXN_CALL_TIMEOUT_S)
                )
                self._in_txn = False
                return
            except DlqTxnStuck:
                break
            except KafkaException as exc:
                err = _kafka_error(exc)
                if err.fatal():
                    if not replaceable(err):
                        raise DlqFatalError(f"abort_transaction: {err}") from exc
                    # E.g. INVALID_TXN_STATE: librdkafka sends EndTxn(abort) for a transaction
                    # whose AddPartitionsToTxn failed in transport (it cannot know whether the
                    # coordinator got it), and the coordinator, which never did, refuses it.
                    log.warning("abort_transaction: %s; replacing the producer", err)
                    break
                if not err.retriable() or trio.current_time() - started > TXN_RETRY_BUDGET_S:
                    log.warning("abort_transaction: %s; replacing the producer", err)
                    break
                log.warning("abort_transaction: %s; calling it again", err)
                await trio.sleep(0.5)
        await self._replace_producer()

    # -- KAFKA-20734: an ABORT marker the broker skipped ------------------------------------------

    async def _check_abort_markers(self, touched: set[tuple[str, int]]) -> None:
        """Make sure the aborted transaction's DLQ records are really aborted (see ABORT_SETTLE_S)."""
        parts = sorted(touched)
        deadline = trio.current_time() + ABORT_CHECK_BUDGET_S
        targets = await self._log_ends(parts, committed=False, deadline=deadline)
        if targets is None:
            log.warning(
                "could not read the end of DLQ partitions %s after an abort; its markers are unchecked",
                _names(parts),
            )
            return
        for rnd in range(ABORT_REPAIR_ROUNDS + 1):
            hanging = await self._unsettled(targets, deadline)
            if not hanging:
                return
            if rnd == ABORT_REPAIR_ROUNDS or trio.current_time() > deadline:
                log.error(
                    "DLQ partitions %s still hold an open transaction after the abort and %d "
                    "abort-only transactions; if it is this producer's, its next commit to them "
                    "makes the aborted DLQ records visible (a DLQ record written twice)",
                    _names(hanging),
                    rnd,
                )
                return
            log.warning(
                "the broker did not write the ABORT marker to DLQ partitions %s (Kafka "
                "KAFKA-20734: no partition leader at that moment); ending the aborted records with "
                "an abort-only transaction",
                _names(hanging),
            )
            self.abort_markers_repaired += 1
            await self._abort_only(hanging)

    async def _unsettled(
        self, targets: dict[tuple[str, int], int], deadline: float
    ) -> list[tuple[str, int]]:
        """The partitions whose last stable offset stays short of its target for ABORT_SETTLE_S."""
        settle_at = min(trio.current_time() + ABORT_SETTLE_S, deadline)
        while True:
            stable = await self._log_ends(list(targets), committed=True, deadline=settle_at)
            short = [tp for tp in targets if stable is None or stable.get(tp, -1) < targets[tp]]
            if not short or trio.current_time() >= settle_at:
                return short
            await trio.sleep(0.2)

    async def _log_ends(
        self, parts: list[tuple[str, int]], *, committed: bool, deadline: float
    ) -> dict[tuple[str, int], int] | None:
        """Each partition's end offset (the last stable offset when `committed`), retried until
        `deadline` while a partition has no leader; None when it could not be read in time."""
        while True:
            try:
                return await trio.to_thread.run_sync(self._list_ends_sync, parts, committed)
            except (KafkaException, TimeoutError) as exc:
                if trio.current_time() + 0.5 > deadline:
                    log.debug("list_offsets on %s: %s", _names(parts), exc)
                    return None
            await trio.sleep(0.5)

    def _list_ends_sync(
        self, parts: list[tuple[str, int]], committed: bool
    ) -> dict[tuple[str, int], int]:
        level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
        admin = self.admin()  # referenced until the results are in: a dropped client never answers
        futures = admin.list_offsets(
            {TopicPartition(t, p): OffsetSpec.latest() for t, p in parts},  # type: ignore[no-untyped-call]
            isolation_level=level,
            request_timeout=5,
        )
        return {
            (tp.topic, tp.partition): int(f.result(timeout=10).offset) for tp, f in futures.items()
        }

    async def _abort_only(self, parts: list[tuple[str, int]]) -> None:
        """A transaction with one probe record (no key or value, header PROBE_HEADER) per partition,
        aborted: its ABORT marker also ends the earlier records left open on those partitions."""
        try:
            await self._txn_call("begin_transaction", lambda p: p.begin_transaction())
            self._in_txn = True
            for topic, partition in parts:
                probe = DlqRecord(topic, partition, None, None, ((PROBE_HEADER, b"abort-only"),))
                err = await self._produce(probe)
                if err is not None:
                    log.warning("abort-only probe to %s[%d]: %s", topic, partition, err.str())
        except (KafkaException, DlqTxnStuck) as exc:
            log.warning("abort-only transaction: %s", exc)
        if self._in_txn or self._stuck:
            await self._end_open_txn()

    def _is_abandoned(self, producer: Producer) -> bool:
        return any(producer is p for p in self._abandoned)

    async def _replace_producer(self) -> None:
        old = self._producer
        if old is not None and not self._is_abandoned(old):
            # Marked before the successor fences it: the old handle may report its fencing from a
            # poll that is under way while this still waits for the handle lock to swap them.
            # A thread may also still be blocked in it: it is left to librdkafka (fenced, its
            # transaction aborted), never called by us again once swapped.
            self._abandoned.append(old)
        producer = Producer(
            producer_properties(self._kafka, self.transactional_id),
            logger=logging.getLogger("sidecar.librdkafka"),
        )
        log.warning(
            "replacing the transactional DLQ producer (transactional.id %s): the new one fences "
            "the old and ends its open transaction (a commit that reached the coordinator is "
            "completed, anything else aborted)",
            self.transactional_id,
        )
        try:
            await trio.to_thread.run_sync(producer.init_transactions, TXN_INIT_TIMEOUT_S)
        except KafkaException as exc:
            raise DlqFatalError(
                f"cannot start a new transactional DLQ producer: {_kafka_error(exc)}"
            ) from exc
        async with self._handle_lock:
            self._producer = producer
            self._stuck = False
            self._broken = None
            self._in_txn = False
        self.producers_replaced += 1

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
            if dlq_topic not in self._partitions:
                await trio.to_thread.run_sync(self.prepare_topics_sync, [dlq_topic])
            record = build_dlq_record(
                failed,
                dlq_topic,
                self._partitions[dlq_topic],
                self.copy_record,
                self.stacktrace_max_bytes,
                drop_copy_reason=drop_reason,
            )
            limit = self._max_bytes.get(dlq_topic)
            if drop_reason is None and limit is not None and _estimated_size(record) > limit:
                drop_reason = (
                    f"record too large for DLQ topic {dlq_topic} (about {_estimated_size(record)} bytes, "
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
                exists = await trio.to_thread.run_sync(self._topic_exists, dlq_topic)
                if not exists and not self.auto_create:
                    raise DlqFatalError(
                        f"DLQ topic {dlq_topic} does not exist and auto-create is off; the record "
                        f"{failed.topic}[{failed.partition}]@{failed.offset} was not written and its offset "
                        "is not committed"
                    )
                self._partitions.pop(dlq_topic, None)
            elif not (err.retriable() or code in _RETRIABLE_CODES):
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

    def _topic_exists(self, topic: str) -> bool:
        try:
            md = self.admin().list_topics(timeout=10)
        except KafkaException:
            return True  # cannot tell: treat as retriable
        return topic in md.topics

    async def _produce(self, record: DlqRecord) -> KafkaError | None:
        assert self._producer is not None and self._token is not None, "run() first"
        pending = _Pending()
        token = self._token

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            # Called on the poll thread; hand the result back to trio.
            def finish() -> None:
                pending.error = err
                pending.done.set()

            token.run_sync_soon(finish)

        producer = self._producer
        while True:
            try:
                # produce() takes the handle too: take it from a worker thread under our lock, so
                # the event loop never blocks behind a poll() in progress.
                async with self._handle_lock:
                    await trio.to_thread.run_sync(
                        lambda: producer.produce(
                            record.topic,
                            value=record.value,
                            key=record.key,
                            partition=record.partition,
                            headers=list(record.headers),
                            on_delivery=on_delivery,
                        )
                    )
                break
            except BufferError:
                await trio.sleep(0.01)
            except KafkaException as exc:
                err = exc.args[0]
                return (
                    err if isinstance(err, KafkaError) else KafkaError(KafkaError._FAIL, str(exc))
                )
        await pending.done.wait()
        return pending.error


def _estimated_size(record: DlqRecord) -> int:
    """Bytes the record takes in a batch of its own, generously rounded up (batch + record overhead)."""
    size = 61 + 21 + len(record.key or b"") + len(record.value or b"")
    for name, value in record.headers:
        size += 10 + len(name.encode()) + len(value or b"")
    return size


def _names(parts: Sequence[tuple[str, int]]) -> str:
    return ", ".join(f"{t}[{p}]" for t, p in parts)


def _kafka_error(exc: KafkaException) -> KafkaError:
    err = exc.args[0] if exc.args else None
    return err if isinstance(err, KafkaError) else KafkaError(KafkaError._FAIL, str(exc))


# Fatal producer errors that a new producer with the same transactional.id cannot get past, or must not
# try to: another live producer holds our transactional.id (two sidecars with one id; replacing ours
# would fence theirs, and theirs ours, in turn), or the client is not allowed or not able to do
# transactions at all. Every other fatal error (INVALID_TXN_STATE, an idempotence sequence error, ...)
# is librdkafka giving up on its own transactional state: a new producer starts from the coordinator's.
_FATAL_FOR_GOOD = {
    KafkaError._FENCED,
    KafkaError.PRODUCER_FENCED,
    KafkaError.INVALID_PRODUCER_EPOCH,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.UNSUPPORTED_VERSION,
    KafkaError._UNSUPPORTED_FEATURE,
    KafkaError.INVALID_TRANSACTION_TIMEOUT,
}


def replaceable(err: KafkaError) -> bool:
    """True for a fatal transactional-producer error that replacing the producer recovers from."""
    return err.code() not in _FATAL_FOR_GOOD


CommittedOffsets = Mapping[tuple[str, int], tuple[int, str | None]]


def transaction_committed(sent: Sequence[TopicPartition], committed: CommittedOffsets) -> bool:
    """Whether a transaction whose outcome was unknown committed, from the group's stable committed
    offsets once it has ended (read after a fencing): True when a partition's committed offset and
    metadata are exactly what the transaction sent.

    One partition is enough, and needed: a transaction commits all its offsets or none, but a partition
    lost meanwhile may have moved on under its next owner. An aborted transaction leaves the earlier
    commit, and that always differs: the transaction carries a record newly counted done on each of its
    partitions (a higher offset, or the done record in the metadata).
    """
    for tp in sent:
        got = committed.get((tp.topic, tp.partition))
        if got is not None and got[0] == tp.offset and (got[1] or "") == (tp.metadata or ""):
            return True
    return False


# Delivery reports of records purged by an abort: the transaction they were in is gone.
_TXN_PURGED = {KafkaError._PURGE_INFLIGHT, KafkaError._PURGE_QUEUE}

_RETRIABLE_CODES = {
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
}
