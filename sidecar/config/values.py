"""The configuration's values: string enums and the frozen dataclasses a `Config` is made of.

Defaults live here only: a key is required exactly when its attribute has no default (see
`sidecar.config.schema`), so the two can never disagree. The values are immutable, compare by
value, and derive what they can (`AppConfig.host`, `ApiConfig.address`) with `sidecar.config.syntax`.

Imports: the standard library, `sidecar.config.syntax`, `sidecar.core.ordering` (`Ordering`, the
one copy) and `sidecar.core.routes` (`RouteRule`). Never `sidecar.config.dump` or `sidecar.config.schema`: they read these classes (the
effective configuration as plain data is `sidecar.config.dump.dump_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from sidecar.config.schemas import SchemasConfig
from sidecar.config.syntax import ListenAddress, parse_listen, split_app_url
from sidecar.config.tiers import RetryTiersConfig
from sidecar.core.ordering import Ordering
from sidecar.core.routes import RouteRule

__all__ = [
    "JOURNAL_AUTO",
    "ApiConfig",
    "AppConfig",
    "AppFormat",
    "AppMode",
    "Config",
    "DeadLetterQueueConfig",
    "DeliveryConfig",
    "Engine",
    "ErrorsConfig",
    "ErrorsTolerance",
    "LogFormat",
    "LogLevel",
    "LoggingConfig",
    "MetricsConfig",
    "SourceConfig",
    "SourceIntake",
    "StatusAck",
    "TracingConfig",
    "TracingExporter",
]

# `share.journal.path`'s default: the journal's path derived from the group id at start-up
# (sidecar.engines.share.journal.default_journal_path).
JOURNAL_AUTO = "auto"

# --------------------------------------------------------------------------------------------
# Enumerations (string enums: they compare equal to, and format as, their YAML spelling)


class Engine(StrEnum):
    CONSUMER = "consumer"
    SHARE = "share"


class SourceIntake(StrEnum):
    """How the consumer engine takes its records from librdkafka (source.intake)."""

    THREAD = "thread"  # a poll thread hands batches to trio's thread
    SIGNAL = "signal"  # trio's thread waits on the consumer queue's wake-up (or falls back)


class AppMode(StrEnum):
    SINGLE = "single"
    BATCH = "batch"
    PULL = "pull"  # nothing connects to the app: it pulls from GET /v1/records on the control API


class AppFormat(StrEnum):
    """What a request to the app looks like (app.format): the sidecar's own format, or CloudEvents."""

    RAW = "raw"
    CLOUDEVENTS = "cloudevents"


class StatusAck(StrEnum):
    """What an HTTP status code means when the app's answer has no JSON ack (app.status.mapping);
    ``route-missing``: the app has no such route (the URL is wrong): not an attempt, intake paused."""

    ACCEPT = "accept"
    RELEASE = "release"
    REJECT = "reject"
    ROUTE_MISSING = "route-missing"


class ErrorsTolerance(StrEnum):
    ALL = "all"
    NONE = "none"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogFormat(StrEnum):
    AUTO = "auto"  # text when stderr is a terminal (a person reads it), else json (a collector)
    JSON = "json"
    LOGFMT = "logfmt"
    TEXT = "text"


class TracingExporter(StrEnum):
    NONE = "none"
    CONSOLE = "console"
    OTLP_HTTP = "otlp-http"
    OTLP_GRPC = "otlp-grpc"


# dataclass lists its fields in the same order as the YAML file.


# --------------------------------------------------------------------------------------------
# Configuration values. kw_only: a required field may follow a defaulted one, so each
# dataclass lists its fields in the same order as the YAML file.


def _empty_mapping() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceConfig:
    topics: tuple[str, ...]
    intake: SourceIntake = SourceIntake.SIGNAL


@dataclass(frozen=True, slots=True, kw_only=True)
class AppConfig:
    """How to reach the application. `host`, `port`, `authority` and `path` are derived from
    `url` (the HTTP request target and Host header); over a Unix socket only `path` matters.

    In pull mode nothing connects to the app, so there is no URL: `url` must be left out ("")
    and the derived fields are empty; single and batch mode require it."""

    url: str = ""
    unix_socket: str | None = None
    mode: AppMode = AppMode.SINGLE
    batch_max_records: int = 100
    batch_linger_ms: int = 5
    timeout_ms: int = 10000
    max_in_flight: int = 64
    connect_backoff_initial_ms: int = 100
    connect_backoff_max_ms: int = 5000
    status_mapping: Mapping[int, StatusAck] = field(default_factory=_empty_mapping)
    headers: Mapping[str, str] = field(default_factory=_empty_mapping)
    format: AppFormat = AppFormat.RAW
    cloudevents_source: str = "kafka://{cluster}/{topic}"
    cloudevents_type: str = "dlq-sidecar.kafka.record"
    host: str = field(init=False)
    port: int = field(init=False)
    authority: str = field(init=False)
    path: str = field(init=False)

    def __post_init__(self) -> None:
        if self.mode is AppMode.PULL or not self.url:
            _check_pull_url(self.url, self.mode)
            for name, empty in (("host", ""), ("port", 0), ("authority", ""), ("path", "")):
                object.__setattr__(self, name, empty)
            return
        host, port, path = split_app_url(self.url, self.unix_socket)
        authority = f"[{host}]" if ":" in host else host
        if port != 80:
            authority = f"{authority}:{port}"
        # Frozen dataclass: derived fields are set once, here, the documented way.
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)
        object.__setattr__(self, "authority", authority)
        object.__setattr__(self, "path", path)


def _check_pull_url(url: str, mode: AppMode) -> None:
    """`app.url` exactly when something connects to the app (ValueError: blamed on app.url)."""
    if mode is AppMode.PULL and url:
        raise ValueError(
            "must be left out with app.mode: pull: nothing connects to the app, which pulls "
            "records from GET /v1/records on the control API (api.listen)"
        )
    if mode is not AppMode.PULL and not url:
        raise ValueError(
            f"required with app.mode: {mode} (the app's http://host:port/path, or a path with "
            "app.unix_socket); only app.mode: pull runs without one"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryConfig:
    """Delivery counts, locks, retry backoff and the in-flight bounds (share.* and errors.retry.*)."""

    delivery_count_limit: int = 5
    lock_duration_ms: int = 30000
    partition_max_record_locks: int = 2000
    # engine share: the deaths journal (sidecar.engines.share.journal); `auto` (JOURNAL_AUTO): a
    # file named after the group under the user's state directory; None (null): no journal.
    journal_path: str | None = JOURNAL_AUTO
    max_in_flight_records: int = 10000
    max_buffered_records_per_partition: int = 10000
    max_buffered_bytes: int = 64 * 1024 * 1024
    retry_delay_initial_ms: int = 1000
    retry_delay_max_ms: int = 60000
    retry_delay_multiplier: float = 2.0
    retry_delay_jitter: float = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterQueueConfig:
    """errors.deadletterqueue.*; `topic_name` may contain ``{topic}``; ``""`` means no DLQ."""

    topic_name: str = "dlq.{topic}"
    topic_name_prefix: str = "dlq."
    copy_record_enable: bool = False
    auto_create_enable: bool = True
    topic_partitions: int = 1
    topic_replication_factor: int = 1
    context_headers_enable: bool = True
    stacktrace_max_bytes: int = 8192
    transactional_enable: bool = False
    produce_retries_timeout_ms: int = 120000
    # How often the log start offsets of the source partitions that headers-only DLQ records point
    # at are read (sidecar.engines.payload_watch): one ListOffsets request per leader, only while
    # such records are watched.
    source_check_interval_ms: int = 60000
    # errors.deadletterqueue.circuit.breaker.* (sidecar.core.breaker): on by default. It trips when
    # more than half of at least 5 records finished within 5 minutes were dead-lettered: a broken
    # deploy stops after at most 4 DLQ records, even on a topic of a handful of records, and one
    # poison pill never trips it (1 of 5 is not more than half; nor is any share below one half).
    # An app that rejects most records on purpose turns it off (enable: false).
    circuit_breaker_enable: bool = True
    circuit_breaker_ratio: float = 0.5
    circuit_breaker_window_ms: int = 300_000
    circuit_breaker_min_records: int = 5
    circuit_breaker_cooldown_ms: int = 30_000
    # errors.deadletterqueue.routes (ordered rules) and .routes.app.allowed (the DLQ topics a reject
    # may name): sidecar.config.routes reads and checks them, sidecar.core.routes applies them.
    routes: tuple[RouteRule, ...] = ()
    routes_app_allowed: tuple[str, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.topic_name != ""

    def topic_for(self, source_topic: str) -> str | None:
        """The DLQ topic for records of `source_topic`, or None when no DLQ is configured."""
        if not self.topic_name:
            return None
        return self.topic_name.replace("{topic}", source_topic)


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorsConfig:
    tolerance: ErrorsTolerance = ErrorsTolerance.ALL
    dlq: DeadLetterQueueConfig = field(default_factory=DeadLetterQueueConfig)
    tiers: RetryTiersConfig = field(default_factory=RetryTiersConfig)  # sidecar.config.tiers
    log_enable: bool = False
    log_include_messages: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiConfig:
    """The two listeners (docs/security.md).

    ``listen`` is the control API (acks, status: it changes and reveals record state): loopback
    or a Unix socket only. ``observability_listen`` ("" = none) serves only the read-only
    ``/healthz``, ``/readyz`` and ``/metrics`` and may listen on the pod IP. The connection and
    time limits hold on each listener (``sidecar.http.server`` says what each one answers).
    """

    listen: str = "127.0.0.1:8787"
    token: str = ""
    observability_listen: str = ""
    max_connections: int = 1024
    max_connections_per_peer: int = 256
    max_request_bytes: int = 4 * 1024 * 1024
    max_ack_items: int = 10_000
    idle_timeout_ms: int = 5_000
    keep_alive_timeout_ms: int = 60_000
    header_timeout_ms: int = 10_000
    body_timeout_ms: int = 10_000
    body_min_rate_bytes_per_s: int = 500
    request_timeout_ms: int = 30_000
    send_timeout_ms: int = 10_000

    @property
    def address(self) -> ListenAddress:
        return parse_listen(self.listen)

    @property
    def observability_address(self) -> ListenAddress | None:
        return parse_listen(self.observability_listen) if self.observability_listen else None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggingConfig:
    level: LogLevel = LogLevel.INFO
    format: LogFormat = LogFormat.AUTO


@dataclass(frozen=True, slots=True, kw_only=True)
class TracingConfig:
    exporter: TracingExporter = TracingExporter.NONE
    service_name: str = "dlq-sidecar"


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsConfig:
    enable: bool = True
    # File that counts this pod's process starts and fatal exits across container restarts (None: off).
    exit_record_path: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """The whole configuration. Compares by value; not hashable (it holds read-only mappings)."""

    kafka: Mapping[str, str | int | bool]
    source: SourceConfig
    engine: Engine = Engine.CONSUMER
    ordering: Ordering = Ordering.KEY
    app: AppConfig
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    errors: ErrorsConfig = field(default_factory=ErrorsConfig)
    offset_metadata_max_bytes: int = 4096
    commit_interval_ms: int = 1000
    shutdown_drain_timeout_ms: int = 20000
    commit_stall_timeout_ms: int = 300000
    api: ApiConfig = field(default_factory=ApiConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    schemas: SchemasConfig = field(default_factory=SchemasConfig)
    # What reading the file noted without failing: old key names still read, one line each (the
    # daemon logs them at start, check-config prints them). Not a setting: not compared, not dumped.
    deprecations: tuple[str, ...] = field(default=(), compare=False)

    @property
    def group_id(self) -> str:
        return str(self.kafka["group.id"])

    def dlq_topic_for(self, source_topic: str) -> str | None:
        """The DLQ topic for records of `source_topic`, or None when no DLQ is configured."""
        return self.errors.dlq.topic_for(source_topic)

    @property
    def cloudevents_source(self) -> str:
        """`app.cloudevents.source` with ``{cluster}`` replaced (``{topic}`` is left for each record).

        ``{cluster}`` is the first of ``kafka.bootstrap.servers`` without a ``PROTOCOL://``
        prefix: the sidecar has no cheaper stable name for the cluster at start-up.
        """
        first = str(self.kafka["bootstrap.servers"]).split(",")[0].strip()
        cluster = first.split("://", 1)[-1]
        return self.app.cloudevents_source.replace("{cluster}", cluster)
