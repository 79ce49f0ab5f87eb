"""The share-group engine (`engine: share`, KIP-932): the broker keeps delivery counts and locks.

The pipeline (:mod:`sidecar.engines.pipeline`) sends records to the app and applies answers; this adapter owns
what is particular to a share group: the share consumers, the batches they acquire, and turning each
answer into ACCEPT / RELEASE / REJECT::

    consumer thread i ──poll──▶ batch ──issue/send──▶ pipeline workers ──HTTP──▶ app   (and /v1/acks)
          ▲                       │
          └── acknowledge ◀───────┴── decide() per record (+ pipeline.dead_letter() confirmed, then REJECT)

Why threads: a confluent-kafka `ShareConsumer` is not thread-safe and, in explicit mode, every record of a
poll must be acknowledged before the next poll. Each of `min(4, app.max.in.flight)` consumers lives on a
thread of its own (every call on it, close included, happens there) and has one batch in flight; the
records of a batch go to the app concurrently through the shared worker pool, so throughput comes from
several batches at once, not from one long batch.

Who may change what: a batch (`Batch`) belongs to the `_process_batch` call of its consumer thread (run in
trio through `trio.from_thread.run`); answers reach it only through `answered` (a worker or the API's
request task), which records the answer and counts down `pending`; the decisions are made by that batch's
call alone. The delivery state itself (counts, locks) is the broker's.

Invariants kept here:
- a record is REJECTed only after its DLQ record is confirmed by the broker (acks=all) — or when no DLQ is
  configured, as KIP-1191 does;
- the limit is the sidecar's `share.delivery.count.limit` (L), on the sidecar's count: the broker's, or
  with a journal (`share.journal.path`) the broker's less what deaths charged (`DeathAccount`,
  sidecar.engines.share_recovery). The group's own (G) must be at least L plus the number of share
  consumers (`required_group_limit`; with a journal, the broker's maximum): a lower G is raised or the
  sidecar refuses to start (`ShareGroupLimitUnsafe`). A release at count L, or on the broker's delivery
  G, becomes DLQ write + REJECT; a record acquired past L is dead-lettered at acquisition, unsent;
- isolation: a record acquired again whose last delivery ended in a death (the journal says so, or this
  process did not see it end) is a suspect; it goes to the app alone, once every other outcome is at the
  broker (`commit_sync`) and no consumer polls, one at a time within the lock (`_next_suspect`); after
  a death, one consumer runs until the dead incarnation's records are back (`DeathAccount.wait_turn`);
- a batch never outlives its acquisition lock: answers still missing shortly before the lock expires count as
  releases (`sidecar.LockTimeout`, as with the consumer-group engine), and late answers are reported `expired`;
  a record not even sent by then is released unsent (no attempt: `_NOT_SENT`).

Must not import the ledger or the consumer-group source's consumer: state lives in the broker, not in offset
metadata.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future
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
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType

from sidecar.config import Config, Ordering
from sidecar.core.deadletter import ArchiveOutcome, FailedRecord
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
from sidecar.core.wire import AckItem, Answer, AppError
from sidecar.engines.interfaces import AckResult, Delivery, Pipe
from sidecar.engines.share_batch import (
    AckCommit,
    Acquired,
    Batch,
    Step,
    SuspectRun,
    ack_commit,
    isolation_order,
)
from sidecar.engines.share_journal import Coord
from sidecar.engines.share_recovery import DeathAccount
from sidecar.engines.share_source import ShareSource
from sidecar.kafka.share_lag import ShareLagEstimate
from sidecar.kafka.source import SourceError

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
BROKER_MAX_DELIVERY_COUNT_LIMIT = "group.share.max.delivery.count.limit"

# Errors a share consumer reports when the broker or the group cannot serve a share group.
_REFUSAL_CODES = {
    KafkaError.GROUP_ID_NOT_FOUND,
    KafkaError.INCONSISTENT_GROUP_PROTOCOL,
    KafkaError.UNSUPPORTED_VERSION,
    KafkaError._UNSUPPORTED_FEATURE,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.INVALID_REQUEST,
}


class ShareGroupsUnavailable(SourceError):
    """The cluster (or this group id) cannot run a share group: the sidecar must not start."""


class ShareGroupLimitUnsafe(SourceError):
    """The group's delivery count limit is unknown, or too low and cannot be raised.

    The broker archives a record on its own once its delivery count reaches the group's limit, with no
    DLQ record; the sidecar must be able to dead-letter before that, so it does not start (exit 1).
    """


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

    delivery_count_limit: int  # the sidecar's: at most this many deliveries to the app
    group_delivery_count_limit: int  # the broker archives on its own at this delivery count
    group_delivery_count_limit_source: (
        str  # "group config", "broker default", "raised by the sidecar"
    )
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
    admin: AdminLike, group: str, config: Config, timeout_s: float = 15.0, *, journal: bool = False
) -> ShareSettings:
    """Check the broker, apply `share.auto.offset.reset`, and read the group's limit and lock.

    Raises ShareGroupsUnavailable when the broker predates share groups, and ShareGroupLimitUnsafe
    when the group's delivery count limit cannot be read, or is not above the sidecar's and cannot be
    raised (see `required_group_limit`; with a journal, `share.journal.path`, as far as the broker
    allows: the sidecar's counts then leave out what deaths charge). The lock falls back (group
    config → broker default → the sidecar's own configuration) with a warning, because the first
    poll is the definitive check anyway.
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
    lock, lock_source = d.lock_duration_ms, "sidecar config"
    if (v := _int_config(group_configs, GROUP_LOCK_DURATION_MS)) is not None:
        lock, lock_source = v, "group config"
    elif (v := _int_config(broker_configs, BROKER_LOCK_DURATION_MS)) is not None:
        lock, lock_source = v, "broker default"
    group_limit, group_limit_source = _group_limit(
        group, group_configs, broker_configs, d.delivery_count_limit
    )
    consumers = share_consumer_count(config)
    needed = required_group_limit(d.delivery_count_limit, consumers)
    maximum = _int_config(broker_configs, BROKER_MAX_DELIVERY_COUNT_LIMIT)
    if journal and maximum is not None:
        needed = max(needed, maximum)
    if group_limit < needed:
        _raise_group_limit(
            admin,
            group,
            needed,
            current=group_limit,
            maximum=maximum,
            sidecar_limit=d.delivery_count_limit,
            consumers=consumers,
            timeout_s=timeout_s,
        )
        warnings.append(
            f"raised the share group {group!r}'s {GROUP_DELIVERY_COUNT_LIMIT} from {group_limit} "
            f"({group_limit_source}) to {needed}: the sidecar delivers a record at most "
            f"{d.delivery_count_limit} times (its share.delivery.count.limit) and must dead-letter "
            f"it before the broker archives it without a DLQ record, and a death of a sidecar with "
            f"{consumers} share consumers can charge a record {consumers} times"
        )
        group_limit, group_limit_source = needed, f"raised by the sidecar from {group_limit}"
    dlq_entry = group_configs.get(GROUP_DLQ_TOPIC)
    broker_dlq = getattr(dlq_entry, "value", None) or None
    if broker_dlq and config.errors.dlq.enabled:
        warnings.append(
            f"the group's own DLQ ({GROUP_DLQ_TOPIC}={broker_dlq}) is set as well: the broker writes "
            "rejected records there too, so every archived record would be dead-lettered twice"
        )
    return ShareSettings(
        delivery_count_limit=d.delivery_count_limit,
        group_delivery_count_limit=group_limit,
        group_delivery_count_limit_source=group_limit_source,
        lock_duration_ms=lock,
        lock_duration_source=lock_source,
        broker_dlq_topic=broker_dlq,
        warnings=tuple(warnings),
    )


def share_consumer_count(config: Config) -> int:
    """How many share consumers one sidecar runs: `min(4, app.max.in.flight)`."""
    return max(1, min(4, config.app.max_in_flight))


def required_group_limit(sidecar_limit: int, consumers: int) -> int:
    """The least group `share.delivery.count.limit` that lets a sidecar with this limit act first.

    The broker counts an acquisition as a delivery and archives a record, with no DLQ record, when
    the delivery numbered with the group's limit G ends without an acknowledgement: a release, a
    lock expiry, or the member's death. The sidecar delivers a record to the app at most L times; a
    record acquired again after that (its deliveries' outcomes lost) is dead-lettered at acquisition,
    so that acquisition must not be past the broker's last.

    How far past L it can be: a death charges every record the sidecar held once, and each of its
    other consumers' share fetches still waiting at the broker once more (measured on Kafka 4.4
    with librdkafka 2.16: a record held at count 1 by one of four consumers of a SIGKILLed sidecar
    came back at count 4 or 5, never sent in between; with one consumer, at count 2). A record
    delivered for the L-th time when the sidecar dies comes back at most at L + consumers, and the
    acquisitions between were all below it: G >= L + consumers.
    """
    return sidecar_limit + consumers


def _group_limit(
    group: str,
    group_configs: Mapping[str, Any],
    broker_configs: Mapping[str, Any],
    sidecar_limit: int,
) -> tuple[int, str]:
    """The group's effective limit and where it comes from; ShareGroupLimitUnsafe when unknown."""
    entry = group_configs.get(GROUP_DELIVERY_COUNT_LIMIT)
    if (v := _int_config(group_configs, GROUP_DELIVERY_COUNT_LIMIT)) is not None:
        return v, "broker default" if getattr(entry, "is_default", False) else "group config"
    if (
        group_configs
        and (v := _int_config(broker_configs, BROKER_DELIVERY_COUNT_LIMIT)) is not None
    ):
        # The group describes no limit of its own (a broker where it is not a group config yet):
        # the broker-wide one applies.
        return v, "broker default"
    raise ShareGroupLimitUnsafe(
        f"cannot read the share group {group!r}'s {GROUP_DELIVERY_COUNT_LIMIT}: without it the "
        "sidecar cannot tell whether the broker would archive a record, with no DLQ record, before "
        f"the sidecar's own limit ({sidecar_limit}) is reached. Allow the sidecar "
        "DescribeConfigs (and AlterConfigs) on the group, or use engine: consumer"
    )


def _raise_group_limit(
    admin: AdminLike,
    group: str,
    needed: int,
    *,
    current: int,
    maximum: int | None,
    sidecar_limit: int,
    consumers: int,
    timeout_s: float,
) -> None:
    """Set the group's limit to `needed`; ShareGroupLimitUnsafe when the broker does not allow it."""
    fix = (
        f"set the group's {GROUP_DELIVERY_COUNT_LIMIT} to at least {needed} (kafka-configs.sh "
        f"--alter --entity-type groups --entity-name {group} --add-config "
        f"{GROUP_DELIVERY_COUNT_LIMIT}={needed}) or lower the sidecar's share.delivery.count.limit "
        f"to at most {current - consumers}"
    )
    why = (
        f"the share group {group!r}'s {GROUP_DELIVERY_COUNT_LIMIT} is {current}, below {needed}: "
        f"the sidecar's share.delivery.count.limit ({sidecar_limit}) plus its {consumers} share "
        "consumers (each can be charged once when the sidecar dies). A record whose deliveries end "
        "without an outcome (a poison pill that kills the sidecar) could be archived by the broker "
        "with no DLQ record"
    )
    if maximum is not None and needed > maximum:
        raise ShareGroupLimitUnsafe(
            f"{why}; the broker allows at most {maximum} ({BROKER_MAX_DELIVERY_COUNT_LIMIT}): "
            f"lower the sidecar's share.delivery.count.limit to at most {maximum - consumers} "
            "(or app.max.in.flight, which sets the number of share consumers up to 4)"
        )
    res = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(
                GROUP_DELIVERY_COUNT_LIMIT, str(needed), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    try:
        admin.incremental_alter_configs([res])[res].result(timeout=timeout_s)
        # The broker answers once the change is committed; its own view of the group's config
        # follows a moment later. Start only once it shows.
        deadline = time.monotonic() + timeout_s
        described = ConfigResource(ResourceType.GROUP, group)
        while True:
            configs = admin.describe_configs([described])[described].result(timeout=timeout_s)
            if (_int_config(configs, GROUP_DELIVERY_COUNT_LIMIT) or 0) >= needed:
                return
            if time.monotonic() > deadline:
                raise ShareGroupLimitUnsafe(
                    f"{why}; the sidecar set it to {needed} but the broker still describes "
                    f"{_int_config(configs, GROUP_DELIVERY_COUNT_LIMIT)} after {timeout_s:g}s: {fix}"
                )
            time.sleep(0.1)
    except KafkaException as exc:
        raise ShareGroupLimitUnsafe(
            f"{why}, and the sidecar cannot raise it ({exc}): {fix}"
        ) from exc


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


class ShareGroupEngine:
    """The `DeliveryState` of a share group: the broker's share partitions (see above)."""

    kind = "share"

    def __init__(self, pipe: Pipe[Acquired]) -> None:
        config = pipe.config
        self.pipe = pipe
        self.config = config
        self.counters = pipe.counters
        self.dlq = pipe.dlq
        self.source = ShareSource(self)
        self.consumer_count = share_consumer_count(config)
        self.settings: ShareSettings | None = None
        self._batches: set[Batch] = set()
        self._in_flight_by_partition: dict[PartitionKey, int] = {}
        self.lag_estimate = ShareLagEstimate(config.source.topics)
        self._renew_warned = False
        self._consumers_running = 0
        # Records the DLQ circuit breaker held (released to the broker instead of dead-lettered),
        # by (topic, partition, offset): acquired again past the limit, they go to the app once
        # more rather than to the DLQ at acquisition. Bounded: the oldest are forgotten first.
        self._held: dict[tuple[str, int, int], None] = {}
        # Isolation (see `_next_suspect`): records whose last release this process decided; the
        # suspects acquired and not yet settled; batches still delivering their ordinary records;
        # per consumer, whether it holds acknowledgements the broker has not received yet.
        self._known_outcome: dict[tuple[str, int, int], None] = {}
        self._suspects_waiting = 0
        self._isolation_over = trio.Event()
        self._isolation_over.set()
        self._isolation_lock = trio.Lock()
        self._delivering = 0
        self._unflushed = [False] * self.consumer_count
        self.isolated_deliveries = 0
        self._suspect_runs = 0  # batches whose suspects wait for (or have) an isolation turn
        self._isolation_turn_s = 0.05  # how long one turn takes (the app's answer and the flush)
        # The sidecar's own counts (share.journal.path) and the recovery after a death.
        self.deaths = DeathAccount(
            config.group_id,
            self.consumer_count,
            lambda topic: self.counters.bump(self.counters.broker_archived, topic),
        )

    # ----------------------------------------------------------------------------- DeliveryState

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the consumers (after reading the group's settings) until polling stops."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.lag_estimate.run, self.dlq.admin)
            task_status.started()
            await self.pipe.run_source(self.source.run)
            nursery.cancel_scope.cancel()

    def wake(self) -> None:
        """Nothing to re-evaluate: the broker decides which records each consumer acquires."""

    def intake_changed(self) -> None:
        """The consumer threads read reachability and draining before each poll."""

    def stop_intake(self) -> None:
        self.source.stop_polling()

    def release_held(self) -> None:
        """Held records were released to the broker: it hands them out again once we poll."""

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
        await self.source.close()
        self.deaths.closed_cleanly()

    def stalled(self) -> str | None:
        """Never: a share group's acknowledgements carry no write-ahead state that blocks delivery."""
        return None

    def readiness(self) -> dict[str, bool]:
        return {
            "assigned": self.source.subscribed and self.source.fatal_error is None,
            "broker_reachable": self.source.broker_ok,
        }

    def broker_error(self) -> str | None:
        return None  # the share consumers report no cause beyond broker_reachable

    def paused(self) -> set[PartitionKey]:
        return self.source.paused

    def lag(self) -> dict[PartitionKey, int]:
        return self.lag_estimate.lag()  # the sidecar's own estimate: see sidecar/kafka/share_lag.py

    def commit_metadata_bytes(self) -> dict[PartitionKey, int]:
        return {}  # no delivery state in commit metadata

    def partitions(self) -> list[dict[str, Any]]:
        paused = self.source.paused
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
                "consumers_running": self._consumers_running,
                "batches_in_flight": len(self._batches),
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
        admin = self.dlq.admin()
        if self.config.delivery.journal_path and self.deaths.journal is None:
            await self.deaths.open(self.config.delivery.journal_path)
        settings = await trio.to_thread.run_sync(
            functools.partial(
                read_share_settings,
                admin,
                self.config.group_id,
                self.config,
                journal=self.deaths.journal is not None,
            )
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
            "share group %s: at most %d deliveries to the app (share.delivery.count.limit), the "
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
        """Run the share consumers until polling stops; SourceError when one cannot continue."""
        if self.settings is None:
            await self.prepare()
        token = trio.lowlevel.current_trio_token()
        errors: list[SourceError] = []

        async def one(index: int) -> None:
            try:
                if not await self.deaths.wait_turn(index, lambda: self.source.stop_requested):
                    return
                await trio.to_thread.run_sync(self._consumer_thread, index, token)
            except SourceError as exc:
                errors.append(exc)
                # One consumer cannot continue: the others stop polling too.
                self.source.stop_polling()
                self.abandon_batches()

        async with trio.open_nursery() as watch:
            if not self.deaths.recovered.is_set():
                s = self.settings
                assert s is not None
                watch.start_soon(
                    self.deaths.watch, s.group_delivery_count_limit, s.lock_duration_ms
                )
            async with trio.open_nursery() as nursery:
                for index in range(self.consumer_count):
                    nursery.start_soon(one, index)
            watch.cancel_scope.cancel()
        if errors:
            raise errors[0]

    def _consumer_thread(self, index: int, token: trio.lowlevel.TrioToken) -> None:
        """One share consumer, start to close, on this thread only (the client is not thread-safe)."""
        # Half of the byte budget split among the consumers' batches; the other half covers a
        # response librdkafka is reading while the batch is with the app.
        budget = self.config.delivery.max_buffered_bytes // 2 // self.consumer_count
        props = share_consumer_properties(self.config.kafka, budget)
        props["client.id"] = f"{props.get('client.id', 'dlq-sidecar')}-share-{index}"
        props["error_cb"] = self._on_client_error
        try:
            consumer = ShareConsumer(props)
        except KafkaException as exc:
            raise SourceError(f"cannot create the share consumer: {exc}") from exc
        try:
            consumer.set_acknowledgement_commit_callback(
                lambda offsets, exc: trio.from_thread.run_sync(
                    self._on_ack_commit, ack_commit(offsets, exc), trio_token=token
                )
            )
            consumer.subscribe(list(self.config.source.topics))
            trio.from_thread.run_sync(self._consumer_started, trio_token=token)
            while not self.source.stop_requested:
                if not trio.from_thread.run(self._wait_intake_open, trio_token=token):
                    if self._unflushed[index]:  # isolation waits for these outcomes
                        _commit(consumer)
                        self._unflushed[index] = False
                    continue
                try:
                    messages = consumer.poll(0.5)
                except KafkaException as exc:
                    raise self._source_error(exc) from exc
                self._unflushed[index] = False  # the poll carried them
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
                step = trio.from_thread.run(self._process_batch, index, good, trio_token=token)
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
                    self._breaker_stops_polling, trio_token=token
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

    def _on_ack_commit(self, result: AckCommit) -> None:
        if result.error is None:
            self.counters.commits += 1
            self.source.broker_ok = True
            self.deaths.confirmed(result.done)
            return
        self.counters.commit_failures += 1
        # Typically the lock expired first: the broker redelivers those records (at-least-once).
        log.warning(
            "acknowledgements for %s failed: %s",
            ", ".join(f"{t}[{p}] ({n} records)" for (t, p), n in sorted(result.offsets.items())),
            result.error,
        )

    def _breaker_stops_polling(self) -> bool:
        return self.pipe.breaker_room() == 0

    async def _wait_intake_open(self) -> bool:
        """Wait while the app is unreachable (pull mode: while no poll waits), the DLQ circuit
        breaker lets no record out (open, or its probe is out) or suspects wait for isolation;
        False when the consumer should re-check for a stop."""
        if self.pipe.breaker_room() == 0:
            await trio.sleep(0.1)
            return False
        if not await self.pipe.wait_intake_open(trio.current_time() + 0.5):
            return False
        if self._suspects_waiting:
            # Isolation: no new acquisitions while suspects wait (they would be charged by a death).
            with trio.move_on_after(0.5):
                await self._isolation_over.wait()
            return not self._suspects_waiting
        return True

    # ----------------------------------------------------------------------------- one batch

    async def _process_batch(self, consumer: int, messages: Sequence[Message]) -> Step:
        """Hand a poll's records to the app, wait for every answer (or the lock), decide each ack.

        A record acquired past the limit (its earlier deliveries ended without an outcome the broker
        received: a death, a lock expiry) is not sent: it is dead-lettered at once, within its lock.
        A suspect (acquired again, its last outcome unknown to this process: see `_is_suspect`) is
        not sent with the others: the step returned flushes the others' outcomes, then the suspects
        go out one at a time (`_next_suspect`).
        """
        assert self.settings is not None
        pipe = self.pipe
        limit = self.settings.delivery_count_limit
        self.source.broker_ok = True
        lock_ms = self.settings.lock_duration_ms
        deadline = trio.current_time() + (lock_ms - _lock_margin_ms(lock_ms)) / 1000
        released: list[tuple[Message, AcknowledgeType]] = []
        # The DLQ circuit breaker lets no record out (open, or another consumer's probe is out):
        # wait for it within half the lock (a probe's verdict is usually quick), then release.
        if not await pipe.wait_breaker_room(
            trio.current_time() + (deadline - trio.current_time()) / 2
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
            self.source.assigned.add(key)
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
                    pipe.issue(Tracked(record), count, Acquired(msg, batch), lock_deadline=deadline)
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
        decisions: list[tuple[Message, AcknowledgeType]] = []
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
                    for d in deliveries:
                        nursery.start_soon(self._decide, d, decisions)
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
                pipe.retire(d)
            if run is None:
                if suspects:  # cut short before the suspects' turn: closing releases them
                    self._suspects_done(len(suspects))
                self._release_held(held)
                self.deaths.check(self._suspects_waiting)

    def _step(
        self,
        decisions: list[tuple[Message, AcknowledgeType]],
        flush: bool = False,
        next: Callable[[], Awaitable[Step]] | None = None,
    ) -> Step:
        """The step acknowledging `decisions`, told to the account of deaths first."""
        self.deaths.settle((_coord(m), t is AcknowledgeType.RELEASE) for m, t in decisions)
        return Step(decisions, flush, next)

    def _is_suspect(self, topic: str, partition: int, offset: int, count: int) -> bool:
        """Acquired again, and this process did not see its last delivery end (a release, a lock
        timeout): that delivery's outcome was lost — in a death, possibly caused by this record."""
        if count <= 1:
            return False
        return self._known_outcome.pop((topic, partition, offset), None) is None

    def _outcome_known(self, msg: Message) -> None:
        """Released by this process: when it comes back, its count holds no unknown outcome."""
        known = self._known_outcome
        known[(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))] = None
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
        pipe = self.pipe
        decisions: list[tuple[Message, AcknowledgeType]] = []
        done = False
        self._suspect_runs += 1
        try:
            async with self._isolation_lock:
                quiet = False
                with trio.move_on_at(run.deadline):
                    while not self.source.stop_requested and not pipe.stopping:
                        if not self._delivering and not any(
                            dirty for i, dirty in enumerate(self._unflushed) if i != run.consumer
                        ):
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
                    decisions = [(m, AcknowledgeType.RELEASE) for m, _t, _c in run.remaining[keep:]]
                    for m, _t, _c in run.remaining[keep:]:
                        self.deaths.unsent(_coord(m), suspect=True)
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
                self.deaths.alone(_coord(m) for m, _t, _c in chunk)
                batch = Batch(run.consumer, run.deadline)
                ds = [
                    pipe.issue(t, c, Acquired(m, batch), lock_deadline=run.deadline)
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
                            for d in ds:
                                nursery.start_soon(self._decide, d, decisions)
                finally:
                    self._batches.discard(batch)
                    for d in ds:
                        pipe.retire(d)
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
    ) -> tuple[list[tuple[Message, AcknowledgeType]], list[Message]]:
        """A poll under way when the DLQ circuit breaker opened (or its probe went out): its records
        do not go to the app; they are released (the broker counts the acquisition) as held, except
        those on the group's last delivery, which the broker would archive (processed as usual)."""
        assert self.settings is not None
        released: list[tuple[Message, AcknowledgeType]] = []
        kept: list[Message] = []
        for msg in messages:
            if (msg.delivery_count() or 1) >= self.settings.group_delivery_count_limit:
                kept.append(msg)
                continue
            self._remember_held(*_coord(msg))
            self.deaths.unsent(_coord(msg))
            self._outcome_known(msg)  # released by us: not a suspect when it comes back
            released.append((msg, AcknowledgeType.RELEASE))
        return released, kept

    def _remember_held(self, topic: str, partition: int, offset: int) -> None:
        self._held[(topic, partition, offset)] = None
        if len(self._held) > _HELD_REMEMBERED:
            del self._held[next(iter(self._held))]

    async def _wait_answers(self, batch: Batch, deliveries: Sequence[Delivery[Acquired]]) -> None:
        """Send the batch's deliveries; an answer still missing at the deadline is a release."""
        pipe = self.pipe
        for d in deliveries:
            pipe.send(d)
        with batch.cancel, trio.move_on_at(batch.deadline):
            await batch.answered.wait()
        for d in deliveries:
            if d.answer is None and not d.sent and d.handed_at is None:
                d.answer = _NOT_SENT  # no room for it at the app before the lock expired
                pipe.lock_expired(d.topic, d, "lock_expired")
            elif d.answer is None:
                # No answer within the lock (or the sidecar is stopping): a release, like a lock timeout.
                stopping = pipe.stopping or pipe.draining or self.source.stop_requested
                d.answer = Answer(
                    "release",
                    AppError(
                        SHUTDOWN if stopping else LOCK_TIMEOUT,
                        "the sidecar stopped before the app answered"
                        if stopping
                        else "no answer before the record lock expired",
                    ),
                )
                pipe.lock_expired(d.topic, d, "abandoned" if stopping else "lock_expired")

    async def _decide(
        self, d: Delivery[Acquired], out: list[tuple[Message, AcknowledgeType]]
    ) -> None:
        assert self.settings is not None and d.answer is not None
        msg = d.ref.msg
        answer = d.answer
        if answer is _NOT_SENT:  # released unsent: no attempt, not a suspect when it comes back
            self.deaths.unsent(_coord(msg))
            self._outcome_known(msg)
            out.append((msg, AcknowledgeType.RELEASE))
            return
        verdict = decide(
            ACK_BY_WORD[answer.ack], d.delivery_count, self.settings.delivery_count_limit
        )
        if isinstance(verdict, Accept):
            out.append((msg, AcknowledgeType.ACCEPT))
            return
        reason = verdict.reason if isinstance(verdict, DeadLetter) else None
        if (
            reason is None
            and (msg.delivery_count() or 1) >= self.settings.group_delivery_count_limit
        ):
            # The broker's last delivery: a release would let it archive the record, no DLQ record.
            reason = ArchiveReason.DELIVERY_COUNT_EXCEEDED
        if reason is None:
            out.append((msg, AcknowledgeType.RELEASE))  # the broker redelivers it
            self._outcome_known(msg)
            return
        await self._archive(msg, d.tracked, d.delivery_count, reason, error_info(answer.error), out)

    async def _dead_letter_exhausted(
        self,
        msg: Message,
        tracked: Tracked,
        count: int,
        out: list[tuple[Message, AcknowledgeType]],
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
        out: list[tuple[Message, AcknowledgeType]],
        *,
        unsent: bool = False,
    ) -> None:
        """DLQ write, then REJECT; a release when it was not written (the sidecar is stopping)."""
        assert self.settings is not None
        broker = msg.delivery_count() or 1  # the broker's count: its limit is on that
        outcome = await self.pipe.dead_letter(
            tracked,
            delivery_count,
            reason,
            error,
            consequence="stopping without acknowledging it",
            write=self._write_dlq,
            # Held means released; on the group's last delivery the broker would archive it
            # without a DLQ record, so it is written even with the breaker open.
            may_hold=broker < self.settings.group_delivery_count_limit,
        )
        if outcome.done:
            out.append((msg, AcknowledgeType.REJECT))
            return
        if unsent:  # dead-lettered at acquisition: no attempt to count
            self.deaths.unsent(_coord(msg))
        if outcome is ArchiveOutcome.HELD:
            rec = tracked.record
            self._remember_held(rec.topic, rec.partition, rec.offset)
            out.append((msg, AcknowledgeType.RELEASE))  # the broker hands it out again
            return
        # Not written: never REJECT (that would drop it). A release lets the broker redeliver it,
        # except at the group's limit, where the broker archives it itself.
        if broker >= self.settings.group_delivery_count_limit:  # the broker archives it
            rec = tracked.record
            self.deaths.archived_by_broker(
                (rec.topic, rec.partition, rec.offset), broker, "released"
            )
        out.append((msg, AcknowledgeType.RELEASE))
        self._outcome_known(msg)

    async def _write_dlq(self, failed: FailedRecord, dlq_topic: str) -> bool:
        await self.dlq.write(failed, dlq_topic)
        return True

    # ----------------------------------------------------------------------------- answers

    def answered(
        self, delivery: Delivery[Acquired], ack: Ack, answer: Answer | AckItem
    ) -> AckResult:
        if ack is Ack.RENEW:
            if not self._renew_warned:
                self._renew_warned = True
                log.warning(
                    "renew: confluent-kafka's share consumer cannot renew a record lock (no RENEW "
                    "acknowledgement type); the record keeps its original lock"
                )
            return "ok"
        delivery.answer = answer
        self.deaths.answered(_coord(delivery.ref.msg), ack is Ack.RELEASE)
        batch = delivery.ref.batch
        batch.pending -= 1
        if batch.pending <= 0:
            batch.answered.set()
        return "ok"

    async def not_reached(self, deliveries: Sequence[Delivery[Acquired]]) -> bool:
        """Not an attempt: wait for the app within the earliest batch's lifetime, then send again.

        The broker has counted the acquisition already; sending again once the app is back (rather
        than releasing now) is what keeps an app restart from using up deliveries.
        """
        deadline = min(d.ref.batch.deadline for d in deliveries)
        return await self.pipe.wait_app_reachable(deadline)


# ------------------------------------------------------------------------------- helpers

_KNOWN_OUTCOMES_MAX = 100_000  # records released by this process, remembered until acquired again
_ISOLATION_POLL_S = 0.02  # how often a waiting suspect checks that nothing else is unsettled
_NOT_SENT = Answer("release", AppError(LOCK_TIMEOUT, "never sent before the record lock expired"))


def _coord(msg: Message) -> Coord:
    return (str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))


def _acknowledge(
    consumer: ShareConsumer, decisions: Sequence[tuple[Message, AcknowledgeType]]
) -> None:
    for msg, ack_type in decisions:
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


_COMMIT_TIMEOUT_S = 10.0
# A share consumer's close that takes this long is logged.
_SLOW_CLOSE_S = 2.0

# How many held records the share engine remembers (see ShareGroupEngine._held).
_HELD_REMEMBERED = 100_000


def _lock_margin_ms(lock_ms: int) -> int:
    # Room for the DLQ write and the acknowledgement to reach the broker before the lock expires.
    return min(5000, max(1000, lock_ms // 5))


__all__ = [
    "SHARE_REFUSED_PROPERTIES",
    "ShareGroupEngine",
    "ShareGroupLimitUnsafe",
    "ShareGroupsUnavailable",
    "ShareSettings",
    "ShareSource",
    "check_broker_configs",
    "read_share_settings",
    "refusal_from_error",
    "required_group_limit",
    "share_consumer_count",
    "share_consumer_properties",
]
