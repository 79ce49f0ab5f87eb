"""The share-group engine (`engine: share`, KIP-932): the broker keeps delivery counts and locks.

Owns the share consumers, the batches they acquire and the mapping of the app's answers to
ACCEPT / RELEASE / REJECT:

    consumer thread i ──poll──▶ batch ──▶ workers ──HTTP──▶ app          (and /v1/acks for 202 answers)
          ▲                       │
          └── acknowledge ◀───────┴── answers (+ DLQ write confirmed, then REJECT)

Why threads: a confluent-kafka `ShareConsumer` is not thread-safe and, in explicit mode, every record of a
poll must be acknowledged before the next poll. Each of `min(4, app.max.in.flight)` consumers lives on a
thread of its own (every call on it, close included, happens there) and has one batch in flight; the
records of a batch go to the app concurrently through the shared worker pool, so throughput comes from
several batches at once, not from one long batch.

Invariants kept here:
- a record is REJECTed only after its DLQ record is confirmed by the broker (acks=all) — or when no DLQ is
  configured, as KIP-1191 does;
- a release on the record's last allowed delivery is turned into DLQ write + REJECT, because the broker would
  otherwise archive it silently; the limit is the group's `share.delivery.count.limit` (read from the
  cluster), or the sidecar's own when that is lower;
- a batch never outlives its acquisition lock: answers still missing shortly before the lock expires count as
  releases, and late answers are reported `expired`.

The engine exposes the surface the daemon, the local API and the metrics use on the consumer-group engine
(`ack`, `readiness`, `status`, `counters`, `source`, `slots`, `drain`, ...). Must not import the ledger or the
consumer-group source's consumer: state lives in the broker, not in offset metadata.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
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
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType
from opentelemetry import trace

from sidecar.appclient import AppNotReachable, AppTarget
from sidecar.config import AppMode, Config, ErrorsTolerance, Ordering
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
from sidecar.dlq import CAUSE_DELIVERY_COUNT, CAUSE_REJECTED, DlqFatalError, FailedRecord
from sidecar.engine import Counters
from sidecar.source import SourceError
from sidecar.tracing import AttemptContext, Tracing
from sidecar.wire import AckItem, Answer, AppError, RecordView

log = logging.getLogger("sidecar.share")

PartitionKey = tuple[str, int]

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

# Group configs (KIP-932 / KIP-1191) and their broker-wide defaults.
GROUP_DELIVERY_COUNT_LIMIT = "share.delivery.count.limit"
GROUP_LOCK_DURATION_MS = "share.record.lock.duration.ms"
GROUP_AUTO_OFFSET_RESET = "share.auto.offset.reset"
GROUP_DLQ_TOPIC = "errors.deadletterqueue.topic.name"
BROKER_DELIVERY_COUNT_LIMIT = "group.share.delivery.count.limit"
BROKER_LOCK_DURATION_MS = "group.share.record.lock.duration.ms"

# Errors a share consumer reports when the broker or the group cannot serve a share group.
_REFUSAL_CODES = {
    KafkaError.GROUP_ID_NOT_FOUND,
    KafkaError.INCONSISTENT_GROUP_PROTOCOL,
    KafkaError.UNSUPPORTED_VERSION,
    KafkaError._UNSUPPORTED_FEATURE,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.INVALID_REQUEST,
}

_ACK_TYPES = {
    "accept": AcknowledgeType.ACCEPT,
    "release": AcknowledgeType.RELEASE,
    "reject": AcknowledgeType.REJECT,
}


class ShareGroupsUnavailable(SourceError):
    """The cluster (or this group id) cannot run a share group: the sidecar must not start."""


def _suggest(reason: str, group: str) -> str:
    return (
        f"share groups are not available for group {group!r}: {reason}. The share engine needs Kafka 4.2+ "
        "with share groups enabled (feature share.version >= 1) and a group.id that is not already a "
        "consumer group; use a fresh group.id, enable share groups, or set engine: consumer"
    )


# ------------------------------------------------------------------------------- start-up checks


@dataclass(frozen=True, slots=True)
class ShareSettings:
    """What the cluster says about this share group, and where each value came from."""

    delivery_count_limit: int
    delivery_count_limit_source: str  # "group config", "broker default", "sidecar config"
    lock_duration_ms: int
    lock_duration_source: str
    broker_dlq_topic: str | None = None  # the group's own (KIP-1191) DLQ topic, if set
    warnings: tuple[str, ...] = ()


class AdminLike(Protocol):
    """The slice of confluent-kafka's AdminClient the start-up checks use."""

    def list_topics(self, *args: Any, **kwargs: Any) -> Any: ...

    def describe_configs(self, *args: Any, **kwargs: Any) -> dict[ConfigResource, Future[Any]]: ...

    def incremental_alter_configs(
        self, *args: Any, **kwargs: Any
    ) -> dict[ConfigResource, Future[Any]]: ...


def check_broker_configs(broker_configs: Mapping[str, str | None]) -> None:
    """Raise ShareGroupsUnavailable when a broker's configuration shows it predates share groups.

    A broker that knows share groups (Kafka 4.0+) has the `group.share.*` settings. Whether the
    `share.version` feature is enabled is not visible through librdkafka's admin API; the first
    poll tells (see `refusal_from_error`).
    """
    if not any(name.startswith("group.share.") for name in broker_configs):
        raise ShareGroupsUnavailable(
            "the broker has no group.share.* settings, so it predates share groups (Kafka < 4.0)"
        )


def refusal_from_error(err: KafkaError) -> str | None:
    """The reason to give when a share consumer error means share groups cannot work here."""
    if err.code() in _REFUSAL_CODES:
        return f"the broker refused the share group ({err.name()}: {err.str()})"
    return None


def _int_config(configs: Mapping[str, Any], name: str) -> int | None:
    entry = configs.get(name)
    value = getattr(entry, "value", None)
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def read_share_settings(
    admin: AdminLike, group: str, config: Config, timeout_s: float = 15.0
) -> ShareSettings:
    """Check the broker, apply `share.auto.offset.reset`, and read the group's limit and lock.

    Raises ShareGroupsUnavailable when the broker predates share groups. Anything the sidecar is not
    allowed to read falls back (group config → broker default → the sidecar's own configuration) with
    a warning, because the first poll is the definitive check anyway.
    """
    warnings: list[str] = []
    broker_configs: Mapping[str, Any] = {}
    try:
        md = admin.list_topics(timeout=timeout_s)
        broker_id = str(sorted(md.brokers)[0])
        res = ConfigResource(ResourceType.BROKER, broker_id)
        broker_configs = admin.describe_configs([res])[res].result(timeout=timeout_s)
    except (KafkaException, IndexError) as exc:
        warnings.append(f"cannot describe the broker's configuration ({exc}); not checked")
    if broker_configs:
        check_broker_configs({k: getattr(v, "value", None) for k, v in broker_configs.items()})

    if str(config.kafka.get("auto.offset.reset", "")) == "earliest":
        # Share groups start at the latest offset unless the group says otherwise.
        res = ConfigResource(
            ResourceType.GROUP,
            group,
            incremental_configs=[
                ConfigEntry(
                    GROUP_AUTO_OFFSET_RESET,
                    "earliest",
                    incremental_operation=AlterConfigOpType.SET,
                )
            ],
        )
        try:
            admin.incremental_alter_configs([res])[res].result(timeout=timeout_s)
        except KafkaException as exc:
            warnings.append(
                f"cannot set the group config {GROUP_AUTO_OFFSET_RESET}=earliest ({exc}); the group "
                "starts at the latest offset unless it is set already"
            )

    group_configs: Mapping[str, Any] = {}
    try:
        res = ConfigResource(ResourceType.GROUP, group)
        group_configs = admin.describe_configs([res])[res].result(timeout=timeout_s)
    except KafkaException as exc:
        warnings.append(f"cannot describe the group's configuration ({exc}); using defaults")

    d = config.delivery
    limit, limit_source = d.delivery_count_limit, "sidecar config"
    lock, lock_source = d.lock_duration_ms, "sidecar config"
    if (v := _int_config(group_configs, GROUP_DELIVERY_COUNT_LIMIT)) is not None:
        limit, limit_source = v, "group config"
    elif (v := _int_config(broker_configs, BROKER_DELIVERY_COUNT_LIMIT)) is not None:
        limit, limit_source = v, "broker default"
    if (v := _int_config(group_configs, GROUP_LOCK_DURATION_MS)) is not None:
        lock, lock_source = v, "group config"
    elif (v := _int_config(broker_configs, BROKER_LOCK_DURATION_MS)) is not None:
        lock, lock_source = v, "broker default"
    if limit_source != "sidecar config" and d.delivery_count_limit < limit:
        # The broker archives at its own limit whatever we do, so we must act no later than that;
        # acting earlier is safe and honours a lower limit in the sidecar's configuration.
        limit, limit_source = (
            d.delivery_count_limit,
            f"sidecar config (below the {limit_source}'s {limit})",
        )
    dlq_entry = group_configs.get(GROUP_DLQ_TOPIC)
    broker_dlq = getattr(dlq_entry, "value", None) or None
    if broker_dlq and config.errors.dlq.enabled:
        warnings.append(
            f"the group's own DLQ ({GROUP_DLQ_TOPIC}={broker_dlq}) is set as well: the broker writes "
            "rejected records there too, so every archived record would be dead-lettered twice"
        )
    return ShareSettings(
        delivery_count_limit=limit,
        delivery_count_limit_source=limit_source,
        lock_duration_ms=lock,
        lock_duration_source=lock_source,
        broker_dlq_topic=broker_dlq,
        warnings=tuple(warnings),
    )


def share_consumer_properties(kafka: Mapping[str, Any]) -> dict[str, Any]:
    """The user's `kafka:` properties a ShareConsumer accepts, plus explicit acknowledgement."""
    props = {k: v for k, v in kafka.items() if k not in SHARE_REFUSED_PROPERTIES}
    props.setdefault("max.poll.records", 500)
    props["share.acknowledgement.mode"] = "explicit"
    return props


# ------------------------------------------------------------------------------- batches


@dataclass(slots=True, eq=False)
class _Batch:
    """One poll's records on one consumer; all of them are acknowledged before that consumer polls again."""

    consumer: int
    deadline: float  # trio time: answers after this count as releases (the lock is about to expire)
    pending: int = 0
    answered: trio.Event = field(default_factory=trio.Event)
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)  # stop waiting for answers
    hard: trio.CancelScope = field(default_factory=trio.CancelScope)  # stop the DLQ writes too


@dataclass(slots=True, eq=False)
class _Delivery:
    msg: Message
    delivery_id: str
    delivery_count: int
    batch: _Batch
    answer: Answer | AckItem | None = None


@dataclass(frozen=True, slots=True)
class _AckCommit:
    offsets: dict[PartitionKey, int]
    error: str | None


class ShareSource:
    """What the daemon, API and metrics read as `engine.source`, for share consumers.

    A share consumer has no assignment the client can see; `assigned` holds the partitions records came
    from, and `paused` is all of them while intake is stopped (app unreachable, draining).
    """

    def __init__(self, engine: ShareEngine) -> None:
        self._engine = engine
        self.assigned: set[PartitionKey] = set()
        self.broker_ok = True
        self.subscribed = False
        self.fatal_error: str | None = None
        self._stop_polling = False
        self._stopped = trio.Event()

    @property
    def paused(self) -> set[PartitionKey]:
        e = self._engine
        if e.draining or not e.app_reachable or self._stop_polling:
            return set(self.assigned)
        return set()

    @property
    def stop_requested(self) -> bool:
        return self._stop_polling

    def start(self) -> None:
        """Nothing to do before `run`: each consumer is created on its own thread."""

    async def run(self) -> None:
        try:
            await self._engine.run_consumers()
        finally:
            self._stopped.set()

    def stop_polling(self) -> None:
        self._stop_polling = True

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def close(self, grace_s: float = 30.0) -> None:
        """The consumers close on their own threads once polling stops; wait for that.

        DLQ writes still retrying after `grace_s` are cut short: their records are released.
        """
        self._stop_polling = True
        self._engine.abandon_batches()
        with trio.move_on_after(grace_s):
            await self._stopped.wait()
            return
        self._engine.abandon_batches(hard=True)
        await self._stopped.wait()

    def lag(self) -> dict[PartitionKey, int]:
        # The share-partition start offset lives in the broker; the client has no per-member lag.
        return {}


class ShareEngine:
    """Everything between the share consumers and the app. One per sidecar process."""

    def __init__(self, config: Config, *, tracing: Tracing | None = None) -> None:
        self.config = config
        self.tracing = tracing or Tracing(
            config.tracing.service_name, config.group_id, config.tracing.exporter.value
        )
        self.observe_app_latency: Callable[[float], None] = _ignore
        self.observe_dlq_latency: Callable[[float], None] = _ignore
        app = config.app
        self.app = app_client_for(config)
        self.dlq = dlq_writer_for(config)
        dlq = config.errors.dlq
        self.transactional = (
            False  # config validation refuses the transactional DLQ with share groups
        )
        self.dlq_ready = not dlq.enabled
        self.source = ShareSource(self)
        self.slots: dict[PartitionKey, Any] = {}  # no ledgers: the broker keeps the delivery state
        self.counters = Counters()
        self.consumer_count = max(1, min(4, app.max_in_flight))
        self.settings: ShareSettings | None = None
        self.app_reachable = True
        self.app_down_since: float | None = None
        self._app_back = trio.Event()
        self.draining = False
        self.stopping = False
        self.failure: str | None = None
        self.started_at = time.time()
        self.stop_event = trio.Event()
        self.drain_cancel = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._deliveries: dict[str, _Delivery] = {}
        self._batches: set[_Batch] = set()
        self._in_flight_by_partition: dict[PartitionKey, int] = {}
        self._attempt_spans: dict[tuple[str, int, int], trace.SpanContext] = {}
        self._work_send, self._work_recv = trio.open_memory_channel[_Delivery](math.inf)
        self._seq = itertools.count()
        self._renew_warned = False
        self._consumers_running = 0

    # ----------------------------------------------------------------------------- daemon surface

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def request_stop(self) -> None:
        self.stop_event.set()

    def kick(self) -> None:
        """Nothing polls a ledger here; kept for the daemon's shutdown sequence."""

    async def scheduler(self) -> None:
        """Nothing to schedule: the broker decides which records each consumer acquires."""
        await trio.sleep_forever()

    async def committer(self) -> None:
        """Acknowledgements travel with each consumer's next poll (or its close), not on a timer."""
        await trio.sleep_forever()

    async def commit_all(self) -> None:
        """See `committer`: the consumer threads send what is pending when they close."""

    def stalled(self) -> str | None:
        """Never: a share group's acknowledgements carry no write-ahead state that blocks delivery."""
        return None

    def readiness(self) -> dict[str, bool]:
        return {
            "assigned": self.source.subscribed and self.source.fatal_error is None,
            "broker_reachable": self.source.broker_ok,
            "app_reachable": self.app_reachable,
            "dlq_writable": self.dlq_ready and self.failure is None,
        }

    def in_flight_records(self) -> int:
        return len(self._deliveries)

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            log.error("stopping: %s", reason)
        self.stopping = True
        self.stop_event.set()

    async def drain(self, deadline_s: float) -> None:
        """Stop polling and let the batches in flight finish (answers and DLQ writes) until the deadline."""
        self.draining = True
        self.source.stop_polling()
        with self.drain_cancel, trio.move_on_after(deadline_s):
            await self.source.wait_stopped()
        # Whatever is still unanswered is released when its batch ends now.
        self.abandon_batches()

    def abandon_batches(self, *, hard: bool = False) -> None:
        for batch in list(self._batches):
            batch.cancel.cancel()
            if hard:
                batch.hard.cancel()

    # ----------------------------------------------------------------------------- start-up

    async def prepare(self) -> ShareSettings:
        """Start-up checks against the cluster; ShareGroupsUnavailable when share groups cannot work."""
        admin = self.dlq.admin()
        settings = await trio.to_thread.run_sync(
            read_share_settings, admin, self.config.group_id, self.config
        )
        for warning in settings.warnings:
            log.warning("%s", warning)
        if self.config.ordering is not Ordering.NONE:
            log.warning(
                "ordering: %s does not apply to engine: share: share groups hand records of one "
                "partition to many consumers at once, so records are delivered with no ordering "
                "(ordering: none); use engine: consumer where order matters",
                self.config.ordering.value,
            )
        margin_ms = _lock_margin_ms(settings.lock_duration_ms)
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
            "share group %s: delivery count limit %d (%s), record lock %d ms (%s), %d consumers",
            self.config.group_id,
            settings.delivery_count_limit,
            settings.delivery_count_limit_source,
            settings.lock_duration_ms,
            settings.lock_duration_source,
            self.consumer_count,
        )
        self.settings = settings
        return settings

    # ----------------------------------------------------------------------------- consumer threads

    async def run_consumers(self) -> None:
        """Run the share consumers until polling stops; SourceError when one cannot continue."""
        if self.settings is None:
            await self.prepare()
        token = trio.lowlevel.current_trio_token()
        errors: list[SourceError] = []

        async def one(index: int) -> None:
            try:
                await trio.to_thread.run_sync(self._consumer_thread, index, token)
            except SourceError as exc:
                errors.append(exc)
                # One consumer cannot continue: the others stop polling too.
                self.source.stop_polling()
                self.abandon_batches()

        async with trio.open_nursery() as nursery:
            for index in range(self.consumer_count):
                nursery.start_soon(one, index)
        if errors:
            raise errors[0]

    def _consumer_thread(self, index: int, token: trio.lowlevel.TrioToken) -> None:
        """One share consumer, start to close, on this thread only (the client is not thread-safe)."""
        props = share_consumer_properties(self.config.kafka)
        props["client.id"] = f"{props.get('client.id', 'dlq-sidecar')}-share-{index}"
        props["error_cb"] = self._on_client_error
        try:
            consumer = ShareConsumer(props)
        except KafkaException as exc:
            raise SourceError(f"cannot create the share consumer: {exc}") from exc
        try:
            consumer.set_acknowledgement_commit_callback(
                lambda offsets, exc: trio.from_thread.run_sync(
                    self._on_ack_commit, _ack_commit(offsets, exc), trio_token=token
                )
            )
            consumer.subscribe(list(self.config.source.topics))
            trio.from_thread.run_sync(self._consumer_started, trio_token=token)
            while not self.source.stop_requested:
                if not trio.from_thread.run(self._wait_intake_open, trio_token=token):
                    continue
                try:
                    messages = consumer.poll(0.5)
                except KafkaException as exc:
                    raise self._source_error(exc) from exc
                good: list[Message] = []
                for msg in messages:
                    err = msg.error()
                    if err is None:
                        good.append(msg)
                        continue
                    reason = refusal_from_error(err)
                    if reason is not None or err.fatal():
                        raise self._source_error(KafkaException(err))
                    log.warning("share consumer error: %s", err)
                if not good:
                    continue
                decisions = trio.from_thread.run(self._process_batch, index, good, trio_token=token)
                for msg, ack_type in decisions:
                    try:
                        consumer.acknowledge(msg, ack_type)
                    except (IllegalStateException, KafkaException) as exc:
                        # The client no longer holds the record (its lock ran out first): the broker
                        # redelivers it, at least once as always.
                        topic, partition, offset = _coords(msg)
                        log.warning(
                            "cannot acknowledge %s[%d]@%d (%s): %s",
                            topic,
                            partition,
                            offset,
                            ack_type.name,
                            exc,
                        )
                # The acknowledgements go to the broker with the next poll (or the close below).
        finally:
            try:
                consumer.close()
            except KafkaException as exc:
                log.warning("closing share consumer %d: %s", index, exc)
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._consumer_stopped, trio_token=token)

    def _source_error(self, exc: KafkaException) -> SourceError:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError):
            reason = refusal_from_error(err)
            if reason is not None:
                return ShareGroupsUnavailable(_suggest(reason, self.config.group_id))
            return SourceError(f"share consumer error: {err.name()}: {err.str()}")
        return SourceError(f"share consumer error: {exc}")

    def _on_client_error(self, err: KafkaError) -> None:
        # librdkafka's global errors, on a consumer thread: only a flag the API reads.
        if err.code() in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT):
            self.source.broker_ok = False
        log.warning("kafka client error: %s", err)

    def _consumer_started(self) -> None:
        self._consumers_running += 1
        self.source.subscribed = True

    def _consumer_stopped(self) -> None:
        self._consumers_running -= 1
        if self._consumers_running <= 0:
            self.source.subscribed = False

    def _on_ack_commit(self, result: _AckCommit) -> None:
        if result.error is None:
            self.counters.commits += 1
            self.source.broker_ok = True
            return
        self.counters.commit_failures += 1
        # Typically the lock expired first: the broker redelivers those records (at-least-once).
        log.warning(
            "acknowledgements for %s failed: %s",
            ", ".join(f"{t}[{p}] ({n} records)" for (t, p), n in sorted(result.offsets.items())),
            result.error,
        )

    async def _wait_intake_open(self) -> bool:
        """Wait while the app is unreachable; False when the consumer should re-check for a stop."""
        if self.app_reachable:
            return True
        with trio.move_on_after(0.5):
            await self._app_back.wait()
        return self.app_reachable

    # ----------------------------------------------------------------------------- one batch

    async def _process_batch(
        self, consumer: int, messages: Sequence[Message]
    ) -> list[tuple[Message, AcknowledgeType]]:
        """Hand a poll's records to the app, wait for every answer (or the lock), decide each ack."""
        assert self.settings is not None
        self.source.broker_ok = True
        lock_ms = self.settings.lock_duration_ms
        deadline = trio.current_time() + (lock_ms - _lock_margin_ms(lock_ms)) / 1000
        batch = _Batch(consumer, deadline)
        deliveries: list[_Delivery] = []
        for msg in messages:
            topic, partition, offset = _coords(msg)
            count = msg.delivery_count() or 1
            delivery_id = f"{topic}/{partition}/{offset}.{count}.{next(self._seq)}"
            d = _Delivery(msg, delivery_id, count, batch)
            deliveries.append(d)
            self._deliveries[delivery_id] = d
            key = (topic, partition)
            self.source.assigned.add(key)
            self._in_flight_by_partition[key] = self._in_flight_by_partition.get(key, 0) + 1
        batch.pending = len(deliveries)
        self._batches.add(batch)
        try:
            for d in deliveries:
                self._work_send.send_nowait(d)
            with batch.cancel, trio.move_on_at(deadline):
                await batch.answered.wait()
            for d in deliveries:
                if d.answer is None:
                    # No answer within the lock (or the sidecar is stopping): a release, like a lock timeout.
                    self._deliveries.pop(d.delivery_id, None)
                    stopping = self.stopping or self.draining or self.source.stop_requested
                    d.answer = Answer(
                        "release",
                        AppError(
                            "sidecar.Shutdown" if stopping else "sidecar.LockExpired",
                            "the sidecar stopped before the app answered"
                            if stopping
                            else "no answer before the record lock expired",
                        ),
                    )
                    outcome = "abandoned" if stopping else "lock_expired"
                    self.counters.bump(self.counters.delivered, outcome)
                    self.counters.bump(self.counters.by_topic, (_coords(d.msg)[0], outcome))
            decisions: list[tuple[Message, AcknowledgeType]] = []
            # Cut short only at close: records left without a decision stay unacknowledged, and
            # closing the consumer releases them (never a REJECT without a confirmed DLQ record).
            with batch.hard:
                async with trio.open_nursery() as nursery:
                    for d in deliveries:
                        nursery.start_soon(self._decide, d, decisions)
            return decisions
        finally:
            self._batches.discard(batch)
            for d in deliveries:
                self._deliveries.pop(d.delivery_id, None)
                key = _coords(d.msg)[:2]
                left = self._in_flight_by_partition.get(key, 1) - 1
                if left > 0:
                    self._in_flight_by_partition[key] = left
                else:
                    self._in_flight_by_partition.pop(key, None)

    async def _decide(self, d: _Delivery, out: list[tuple[Message, AcknowledgeType]]) -> None:
        assert self.settings is not None and d.answer is not None
        answer = d.answer
        word = answer.ack
        if word == "accept":
            out.append((d.msg, AcknowledgeType.ACCEPT))
            return
        at_limit = d.delivery_count >= self.settings.delivery_count_limit
        if word == "release" and not at_limit:
            out.append((d.msg, AcknowledgeType.RELEASE))
            return
        cause = CAUSE_REJECTED if word == "reject" else CAUSE_DELIVERY_COUNT
        if await self._archive(d, answer, cause):
            out.append((d.msg, AcknowledgeType.REJECT))
        else:
            # Not written: never REJECT (that would drop it). A release lets the broker redeliver it,
            # except at the limit, where the broker archives it itself (logged in _archive).
            out.append((d.msg, AcknowledgeType.RELEASE))

    # ----------------------------------------------------------------------------- HTTP workers

    async def worker(self) -> None:
        timeout_s = self.config.app.timeout_ms / 1000
        batch_mode = self.config.app.mode == AppMode.BATCH
        max_batch = self.config.app.batch_max_records
        while True:
            first = await self._work_recv.receive()
            if not batch_mode:
                await self._deliver_one(first, timeout_s)
                continue
            items = [first]
            if self.config.app.batch_linger_ms > 0:
                with trio.move_on_after(self.config.app.batch_linger_ms / 1000):
                    while len(items) < max_batch:
                        items.append(await self._work_recv.receive())
            else:
                while len(items) < max_batch:
                    try:
                        items.append(self._work_recv.receive_nowait())
                    except trio.WouldBlock:
                        break
            await self._deliver_batch(items, timeout_s)

    def _record_view(self, d: _Delivery) -> RecordView:
        return record_view(d.msg, d.delivery_count, d.delivery_id)

    def _start_span(self, record: RecordView) -> tuple[RecordView, AttemptContext | None]:
        return start_attempt_span(self.tracing, record)

    def _end_span(
        self, actx: AttemptContext | None, record: RecordView, answer: Answer | None
    ) -> None:
        end_attempt_span(actx, record, answer, self._attempt_spans)

    async def _deliver_one(self, d: _Delivery, timeout_s: float) -> None:
        while d.delivery_id in self._deliveries:
            record, actx = self._start_span(self._record_view(d))
            started = time.perf_counter()
            try:
                answer = await self.app.deliver(record, timeout_s)
            except AppNotReachable as exc:
                self._end_span(actx, record, None)
                if not await self._wait_app(d.batch, str(exc)):
                    return
                continue
            except BaseException:
                if actx is not None:
                    Tracing.end_attempt(
                        actx, "abandoned", "sidecar.Shutdown", "the sidecar stopped mid-attempt"
                    )
                raise
            self.counters.attempts += 1
            self.observe_app_latency(time.perf_counter() - started)
            self._end_span(actx, record, answer)
            self._apply_answer(d.delivery_id, answer)
            return

    async def _deliver_batch(self, items: list[_Delivery], timeout_s: float) -> None:
        while live := [d for d in items if d.delivery_id in self._deliveries]:
            traced = [self._start_span(self._record_view(d)) for d in live]
            records = [r for r, _ in traced]
            started = time.perf_counter()
            try:
                answers = await self.app.deliver_batch(records, timeout_s)
            except AppNotReachable as exc:
                for record, actx in traced:
                    self._end_span(actx, record, None)
                if not await self._wait_app(min((d.batch for d in live), key=_deadline), str(exc)):
                    return
                continue
            except BaseException:
                for _record, actx in traced:
                    if actx is not None:
                        Tracing.end_attempt(
                            actx, "abandoned", "sidecar.Shutdown", "the sidecar stopped mid-attempt"
                        )
                raise
            self.counters.attempts += len(live)
            self.observe_app_latency(time.perf_counter() - started)
            for (record, actx), d in zip(traced, live, strict=True):
                answer = answers.get(d.delivery_id) or Answer(
                    "release", reason="missing from the batch answer"
                )
                self._end_span(actx, record, answer)
                self._apply_answer(d.delivery_id, answer)
            return

    async def _wait_app(self, batch: _Batch, reason: str) -> bool:
        """The app is not listening: not an attempt. Wait for it within the batch's lifetime.

        The broker has counted the acquisition already; sending again once the app is back (rather
        than releasing now) is what keeps an app restart from using up deliveries.
        """
        self.counters.not_attempted += 1
        if self.app_reachable:
            log.warning("the app is not reachable (%s): pausing intake until it is back", reason)
            self.app_reachable = False
            self.app_down_since = time.monotonic()
            self._app_back = trio.Event()
            if self._nursery is not None:
                self._nursery.start_soon(self._probe_app)
        with trio.move_on_at(batch.deadline):
            await self._app_back.wait()
        return self.app_reachable

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
            self._app_back.set()
            return

    # ----------------------------------------------------------------------------- answers

    def _apply_answer(self, delivery_id: str, answer: Answer | AckItem) -> str:
        """Record an app answer; returns 'ok', 'unknown' or 'expired' (the /v1/acks result words)."""
        d = self._deliveries.get(delivery_id)
        if d is None:
            self.counters.expired_answers += 1
            return "expired" if _looks_like_delivery_id(delivery_id) else "unknown"
        if isinstance(answer, Answer) and answer.ack == "deferred":
            return "ok"  # answered later through /v1/acks, within the batch's lifetime
        if answer.ack == "renew":
            if not self._renew_warned:
                self._renew_warned = True
                log.warning(
                    "renew: confluent-kafka's share consumer cannot renew a record lock (no RENEW "
                    "acknowledgement type); the record keeps its original lock"
                )
            return "ok"
        del self._deliveries[delivery_id]
        d.answer = answer
        self.counters.bump(self.counters.delivered, answer.ack)
        self.counters.bump(self.counters.by_topic, (_coords(d.msg)[0], answer.ack))
        d.batch.pending -= 1
        if d.batch.pending <= 0:
            d.batch.answered.set()
        return "ok"

    def ack(self, items: Sequence[AckItem]) -> list[tuple[str, str]]:
        """`POST /v1/acks`: apply each answer; per id ok / unknown / expired."""
        return [(item.delivery_id, self._apply_answer(item.delivery_id, item)) for item in items]

    # ----------------------------------------------------------------------------- DLQ

    async def _archive(self, d: _Delivery, answer: Answer | AckItem, cause: str) -> bool:
        """Write the DLQ record (True once confirmed, or when no DLQ is configured); False when not written."""
        msg = d.msg
        topic, partition, offset = _coords(msg)
        reason = "rejected" if cause == CAUSE_REJECTED else "delivery_count_exceeded"
        err = answer.error
        if err is None and cause == CAUSE_DELIVERY_COUNT:
            err = AppError(
                "sidecar.DeliveryCountExceeded", "released or timed out at the delivery limit"
            )
        if self.config.errors.tolerance == ErrorsTolerance.NONE:
            self.fail(
                f"errors.tolerance is none and {topic}[{partition}]@{offset} was archived ({reason}"
                f"{': ' + err.class_name if err and err.class_name else ''}); stopping without "
                "acknowledging it"
            )
            self._warn_if_broker_archives(d)
            return False
        self._log_archived(d, reason, err)
        dlq_topic = self.config.dlq_topic_for(topic)
        if dlq_topic is None:
            self.counters.bump(self.counters.archived, reason)
            return True  # no DLQ: archived records are logged and skipped (KIP-1191)
        failed = FailedRecord(
            topic=topic,
            partition=partition,
            offset=offset,
            key=key_bytes(msg),
            value=value_bytes(msg),
            headers=message_headers(msg),
            group=self.config.group_id,
            delivery_count=d.delivery_count,
            cause=cause,
            exception_class=(err.class_name or None) if err else None,
            exception_message=(err.message or None) if err else None,
            stacktrace=err.stacktrace if err else None,
            extra_headers=answer.dlq_headers,
            replacement_value=answer.dlq_value,
            replacement_value_set=answer.dlq_value_set,
        )
        span = None
        last_attempt = self._attempt_spans.pop((topic, partition, offset), None)
        if self.tracing.enabled:
            hdrs = dict(failed.headers)
            tp, ts = hdrs.get("traceparent"), hdrs.get("tracestate")
            span, trace_headers = self.tracing.start_dlq_write(
                source_topic=topic,
                partition=partition,
                offset=offset,
                dlq_topic=dlq_topic,
                reason=reason,
                traceparent=tp.decode("latin-1") if tp else None,
                tracestate=ts.decode("latin-1") if ts else None,
                links=[trace.Link(last_attempt)] if last_attempt is not None else [],
            )
            failed = dataclasses.replace(
                failed, extra_headers=(*failed.extra_headers, *trace_headers)
            )
        started = time.perf_counter()
        try:
            await self.dlq.write(failed, dlq_topic)
        except DlqFatalError as exc:
            self.counters.dlq_failed += 1
            if span is not None:
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
                span.end()
            self.fail(str(exc))
            self._warn_if_broker_archives(d)
            return False
        except BaseException:
            if span is not None:
                span.end()
            raise
        self.observe_dlq_latency(time.perf_counter() - started)
        if span is not None:
            span.end()
        self.counters.dlq_written += 1
        self.counters.bump(self.counters.archived, reason)
        return True

    def _warn_if_broker_archives(self, d: _Delivery) -> None:
        assert self.settings is not None
        if d.delivery_count >= self.settings.delivery_count_limit:
            topic, partition, offset = _coords(d.msg)
            log.error(
                "%s[%d]@%d is on its last delivery: released without a DLQ record, the broker archives "
                "it (share groups cannot hand it out again); it is not in the DLQ",
                topic,
                partition,
                offset,
            )

    def _log_archived(self, d: _Delivery, reason: str, err: AppError | None) -> None:
        errors = self.config.errors
        if not errors.log_enable:
            return
        topic, partition, offset = _coords(d.msg)
        extra: dict[str, Any] = {
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "delivery_count": d.delivery_count,
            "reason": reason,
            "exception_class": err.class_name if err else None,
            "exception_message": err.message if err else None,
        }
        if errors.log_include_messages:
            extra["key"] = _printable(key_bytes(d.msg))
            extra["value"] = _printable(value_bytes(d.msg))
        log.error("record archived", extra={"fields": extra})

    # ----------------------------------------------------------------------------- status

    def status(self) -> dict[str, Any]:
        paused = self.source.paused
        partitions = [
            {
                "topic": topic,
                "partition": partition,
                "in_flight": self._in_flight_by_partition.get((topic, partition), 0),
                "paused": (topic, partition) in paused,
                "lag": None,
            }
            for topic, partition in sorted(self.source.assigned)
        ]
        c = self.counters
        s = self.settings
        return {
            "group": self.config.group_id,
            "engine": "share",
            "app_reachable": self.app_reachable,
            "draining": self.draining,
            "failure": self.failure,
            "uptime_s": round(time.time() - self.started_at, 3),
            "in_flight": self.in_flight_records(),
            "paused_partitions": [f"{t}[{p}]" for t, p in sorted(paused)],
            "partitions": partitions,
            "share": {
                "consumers": self.consumer_count,
                "consumers_running": self._consumers_running,
                "batches_in_flight": len(self._batches),
                "delivery_count_limit": s.delivery_count_limit if s else None,
                "delivery_count_limit_source": s.delivery_count_limit_source if s else None,
                "lock_duration_ms": s.lock_duration_ms if s else None,
                "lock_duration_source": s.lock_duration_source if s else None,
            },
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


# ------------------------------------------------------------------------------- helpers


def _lock_margin_ms(lock_ms: int) -> int:
    # Room for the DLQ write and the acknowledgement to reach the broker before the lock expires.
    return min(5000, max(1000, lock_ms // 5))


def _deadline(batch: _Batch) -> float:
    return batch.deadline


def _coords(msg: Message) -> tuple[str, int, int]:
    return str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0)


def _printable(data: bytes | None) -> str | None:
    return None if data is None else data[:1024].decode("utf-8", errors="backslashreplace")


def _ack_commit(offsets: Mapping[Any, Any], exc: Exception | None) -> _AckCommit:
    counts = {(str(tp.topic), int(tp.partition)): len(offs) for tp, offs in offsets.items()}
    return _AckCommit(counts, None if exc is None else str(exc))


def _looks_like_delivery_id(delivery_id: str) -> bool:
    parts = delivery_id.split("/")
    return len(parts) == 3 and parts[1].isdigit()


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


__all__ = [
    "SHARE_REFUSED_PROPERTIES",
    "ShareEngine",
    "ShareGroupsUnavailable",
    "ShareSettings",
    "ShareSource",
    "check_broker_configs",
    "read_share_settings",
    "refusal_from_error",
    "share_consumer_properties",
]
