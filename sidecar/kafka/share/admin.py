"""The share group's start-up checks through the admin client (`engine: share`, KIP-932 / KIP-1191).

Before the first share consumer joins: does the broker know share groups (`check_broker_configs`), the
group's `share.auto.offset.reset`, and its delivery count limit and record lock, read and where needed
raised (`read_share_settings`): the sidecar must be able to dead-letter a record before the broker
archives it on its own. Blocking calls: run them in a worker thread. Raises the errors of
:mod:`sidecar.kafka.share.errors`; every `KafkaException` is translated or turned into a warning here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from sidecar.config import Config
from sidecar.core.share_limits import required_group_limit, share_consumer_count
from sidecar.kafka.dlq.topics import producer_properties
from sidecar.kafka.logsummary import librdkafka_logger
from sidecar.kafka.share.errors import ShareGroupLimitUnsafe, ShareGroupsUnavailable

# Group configs (KIP-932 / KIP-1191) and their broker-wide defaults.
GROUP_DELIVERY_COUNT_LIMIT = "share.delivery.count.limit"
GROUP_LOCK_DURATION_MS = "share.record.lock.duration.ms"
GROUP_AUTO_OFFSET_RESET = "share.auto.offset.reset"
GROUP_DLQ_TOPIC = "errors.deadletterqueue.topic.name"
BROKER_DELIVERY_COUNT_LIMIT = "group.share.delivery.count.limit"
BROKER_LOCK_DURATION_MS = "group.share.record.lock.duration.ms"
BROKER_MAX_DELIVERY_COUNT_LIMIT = "group.share.max.delivery.count.limit"


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
    consumers = share_consumer_count(config.app.max_in_flight)
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


def share_admin(kafka: Mapping[str, Any]) -> AdminClient:
    """An admin client on the sidecar's connection settings (those of the DLQ producer; keep it
    referenced until its futures are resolved: a dropped client never answers)."""
    return AdminClient(producer_properties(kafka), logger=librdkafka_logger())


__all__ = [
    "GROUP_LOCK_DURATION_MS",
    "AdminLike",
    "ShareSettings",
    "check_broker_configs",
    "read_share_settings",
    "share_admin",
]
