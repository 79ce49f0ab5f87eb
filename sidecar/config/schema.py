"""The key tables: which YAML key goes where, of which kind, and the readers of the odd keys.

Owns one table per section (`Key`: YAML name, kind, owning attribute), `TOP_KEYS`, and the custom
readers (``kafka``, ``source.topics``, ``app.unix_socket``, ``share.journal.path``, ``app.headers`` ...).
The seeds' dotted property names (``share.*``, ``errors.*``) are flat top-level keys, spelt verbatim.

Imports the `sidecar.config` modules errors, environment, syntax, values, kinds, routes, schemas, tiers,
suggest and librdkafka; not checks, load, yamlcore, masking or dump.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from sidecar.config.environment import ReadContext
from sidecar.config.errors import Invalid
from sidecar.config.kinds import (
    BoolKey,
    ChoiceKey,
    CustomKey,
    FloatKey,
    IntKey,
    Key,
    Section,
    StrKey,
    describe_key,
    describe_value,
    int_text,
    join_path,
    mapping_at,
)
from sidecar.config.librdkafka import check_properties
from sidecar.config.routes import read_allowed, read_routes
from sidecar.config.schemas import schemas_key
from sidecar.config.suggest import closest
from sidecar.config.syntax import parse_listen, topic_name_error, unix_path_error
from sidecar.config.tiers import RetryTiersConfig, read_tiers
from sidecar.config.values import (
    ApiConfig,
    AppConfig,
    AppFormat,
    AppMode,
    Config,
    DeadLetterQueueConfig,
    DeliveryConfig,
    Engine,
    ErrorsConfig,
    ErrorsTolerance,
    LogFormat,
    LoggingConfig,
    LogLevel,
    MetricsConfig,
    SourceConfig,
    SourceIntake,
    StatusAck,
    TracingConfig,
    TracingExporter,
)
from sidecar.core.ordering import Ordering

# --------------------------------------------------------------------------------------------
# Custom readers


# Properties the sidecar must own: it stores offsets and commits them itself, only past records
# that are done; librdkafka's auto-commit would commit records still in flight.
_KAFKA_OWNED = {
    "enable.auto.commit": "the sidecar commits offsets itself, only past records that are done",
    "enable.auto.offset.store": "the sidecar stores offsets itself, only for records that are done",
}
_KAFKA_REQUIRED = ("bootstrap.servers", "group.id")


def _read_kafka(raw: object, path: str, ctx: ReadContext) -> Mapping[str, str | int | bool]:
    data = mapping_at(raw, path)
    sidecar_names = {key.name for key in TOP_KEYS}
    out: dict[str, str | int | bool] = {}
    for name, value in data.items():
        key_path = join_path(path, name)
        if name in _KAFKA_OWNED:
            raise Invalid(key_path, f"must not be set: {_KAFKA_OWNED[name]}")
        if name in sidecar_names:
            raise Invalid(
                key_path,
                "this is a sidecar setting, not a Kafka client property; move it to the top level",
            )
        if isinstance(value, str):
            out[name] = ctx.expand(value, key_path)[0]
        elif isinstance(value, bool):
            out[name] = value
        elif isinstance(value, int):
            if not -(2**63) <= value < 2**63:
                raise Invalid(key_path, f"expected a 64-bit integer, got {describe_value(value)}")
            out[name] = value
        else:
            raise Invalid(
                key_path, f"expected a string, integer or boolean, got {describe_value(value)}"
            )
    check_properties(out, path)
    for name in _KAFKA_REQUIRED:
        value = out.get(name)
        if value is None:
            typo = closest(name, [n for n in out if n not in _KAFKA_REQUIRED])
            if typo is not None:
                raise Invalid(
                    join_path(path, typo), f"unknown key; did you mean '{name}'? (a required key)"
                )
            raise Invalid(join_path(path, name), "required key is missing (a string)")
        if not isinstance(value, str) or not value.strip():
            raise Invalid(
                join_path(path, name), f"expected a non-empty string, got {describe_value(value)}"
            )
    return MappingProxyType(out)


def _read_topics(raw: object, path: str, ctx: ReadContext) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise Invalid(path, f"expected a list of topic names, got {describe_value(raw)}")
    if not raw:
        raise Invalid(path, "must list at least one topic")
    topics: list[str] = []
    for index, item in enumerate(raw):
        item_path = f"{path}[{index}]"
        name = StrKey(check=topic_name_error).read(item, item_path, ctx)
        if name in topics:
            raise Invalid(item_path, f"topic {name!r} is listed twice")
        topics.append(name)
    return tuple(topics)


def _read_unix_socket(raw: object, path: str, ctx: ReadContext) -> str | None:
    if raw is None:
        return None
    return StrKey(check=unix_path_error).read(raw, path, ctx)


def _journal_path_error(value: str) -> str | None:
    if value.endswith("/"):
        return "must name a file, not a directory (e.g. /var/lib/dlq-sidecar/share-journal)"
    if "\0" in value:
        return "must not contain a NUL character"
    return None


def _read_journal_path(raw: object, path: str, ctx: ReadContext) -> str | None:
    if raw is None:
        return None
    return StrKey(allow_empty=False, check=_journal_path_error).read(raw, path, ctx)


def _read_status_mapping(raw: object, path: str, ctx: ReadContext) -> Mapping[int, StatusAck]:
    data = raw if raw is not None else {}
    if not isinstance(data, dict):
        raise Invalid(path, f"expected a mapping of status code to ack, got {describe_value(data)}")
    out: dict[int, StatusAck] = {}
    for key, value in data.items():
        key_path = join_path(path, describe_key(key))
        if isinstance(key, str) and key.isascii() and key.isdigit():
            if len(key) > 3:
                raise Invalid(
                    key_path, f"an HTTP status code is in 100..599, got {len(key)} digits"
                )
            code = int(key)
        elif isinstance(key, int) and not isinstance(key, bool):
            code = key
        else:
            raise Invalid(
                key_path, f"expected an HTTP status code as key, got {describe_value(key)}"
            )
        if not 100 <= code <= 599:
            raise Invalid(key_path, f"an HTTP status code is in 100..599, got {int_text(code)}")
        if code in out:
            raise Invalid(key_path, f"status {code} is mapped twice")
        out[code] = StatusAck(ChoiceKey(StatusAck).read(value, key_path, ctx))
    return MappingProxyType(out)


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Framing and routing headers are the HTTP client's business; a static override would corrupt
# the request or the keep-alive connection.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te"}
)


def _read_headers(raw: object, path: str, ctx: ReadContext) -> Mapping[str, str]:
    data = mapping_at({} if raw is None else raw, path)
    out: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in data.items():
        key_path = join_path(path, name)
        if not _TOKEN.fullmatch(name):
            raise Invalid(key_path, "not a valid HTTP header name")
        if name.lower() in _RESERVED_HEADERS:
            raise Invalid(key_path, "this header is set by the sidecar's HTTP client")
        if name.lower() in seen:
            raise Invalid(key_path, "header is listed twice (names are case-insensitive)")
        seen.add(name.lower())
        text = StrKey().read(value, key_path, ctx)
        # The rule of the request formatter (sidecar/core/wire/requests.py), checked here so a bad value is a
        # start-up error, not a failure at the first delivery. The value is never echoed: it may
        # be a secret.
        if not (text.isascii() and text.isprintable()):
            raise Invalid(
                key_path,
                "a header value must be visible ASCII and spaces: no TAB, CR, LF or other control "
                "characters, no non-ASCII text",
            )
        out[name] = text
    return MappingProxyType(out)


def _check_listen(value: str) -> str | None:
    try:
        parse_listen(value)
    except ValueError as exc:
        return str(exc)
    return None


def _check_optional_listen(value: str) -> str | None:
    return _check_listen(value) if value else None


_API_TOKEN_MIN_CHARS = 16


def _check_api_token(value: str) -> str | None:
    if not value:
        return None  # no token
    if not all("!" <= ch <= "~" for ch in value):
        # A Secret made with `echo token | kubectl create secret ...` ends in a newline.
        return "must be printable ASCII without spaces or line breaks"
    if len(value) < _API_TOKEN_MIN_CHARS:
        return f"must be at least {_API_TOKEN_MIN_CHARS} characters (use 32 random bytes, hex)"
    return None


# The CloudEvents String type excludes control characters (core spec, "Type System").
_CE_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _cloudevents_string_error(value: str) -> str | None:
    if _CE_CONTROL.search(value):
        return "must be a CloudEvents String: no control characters"
    return None


_MS_HOUR = 3_600_000
_MS_DAY = 86_400_000

_SOURCE_KEYS = (
    Key("topics", CustomKey(_read_topics, "a list of topic names"), SourceConfig, "topics"),
    Key("intake", ChoiceKey(SourceIntake), SourceConfig, "intake"),
)

_APP_KEYS = (
    # Empty (or left out) only with app.mode: pull; AppConfig checks the pair.
    Key("url", StrKey(allow_empty=True), AppConfig, "url"),
    Key("unix_socket", CustomKey(_read_unix_socket, "a path or null"), AppConfig, "unix_socket"),
    Key("mode", ChoiceKey(AppMode), AppConfig, "mode"),
    Key("batch.max.records", IntKey(1, 10_000), AppConfig, "batch_max_records"),
    Key("batch.linger.ms", IntKey(0, 10_000), AppConfig, "batch_linger_ms"),
    Key("timeout.ms", IntKey(1, _MS_HOUR), AppConfig, "timeout_ms"),
    Key("max.in.flight", IntKey(1, 4096), AppConfig, "max_in_flight"),
    Key("connect.backoff.initial.ms", IntKey(1, 60_000), AppConfig, "connect_backoff_initial_ms"),
    Key("connect.backoff.max.ms", IntKey(1, _MS_HOUR), AppConfig, "connect_backoff_max_ms"),
    Key(
        "status.mapping",
        CustomKey(
            _read_status_mapping, "a mapping of status code to accept|release|reject|route-missing"
        ),
        AppConfig,
        "status_mapping",
    ),
    Key(
        "headers",
        CustomKey(_read_headers, "a mapping of header name to value"),
        AppConfig,
        "headers",
    ),
    Key("format", ChoiceKey(AppFormat), AppConfig, "format"),
    # The source is checked as a URI-reference in `checks`, once `{cluster}` and `{topic}` are known.
    Key("cloudevents.source", StrKey(allow_empty=False), AppConfig, "cloudevents_source"),
    Key(
        "cloudevents.type",
        StrKey(allow_empty=False, check=_cloudevents_string_error),
        AppConfig,
        "cloudevents_type",
    ),
)

_API_KEYS = (
    Key("listen", StrKey(allow_empty=False, check=_check_listen), ApiConfig, "listen"),
    Key("token", StrKey(check=_check_api_token), ApiConfig, "token"),
    Key(
        "observability.listen",
        StrKey(check=_check_optional_listen),
        ApiConfig,
        "observability_listen",
    ),
    Key("max.connections", IntKey(1, 65_536), ApiConfig, "max_connections"),
    Key("max.connections.per.peer", IntKey(1, 65_536), ApiConfig, "max_connections_per_peer"),
    Key("max.request.bytes", IntKey(1024, 64 * 1024 * 1024), ApiConfig, "max_request_bytes"),
    Key("max.ack.items", IntKey(1, 100_000), ApiConfig, "max_ack_items"),
    Key("idle.timeout.ms", IntKey(10, _MS_HOUR), ApiConfig, "idle_timeout_ms"),
    Key("keep.alive.timeout.ms", IntKey(10, _MS_HOUR), ApiConfig, "keep_alive_timeout_ms"),
    Key("header.timeout.ms", IntKey(10, _MS_HOUR), ApiConfig, "header_timeout_ms"),
    Key("body.timeout.ms", IntKey(10, _MS_HOUR), ApiConfig, "body_timeout_ms"),
    Key("body.min.rate.bytes.per.s", IntKey(0, 2**30), ApiConfig, "body_min_rate_bytes_per_s"),
    Key("request.timeout.ms", IntKey(10, _MS_HOUR), ApiConfig, "request_timeout_ms"),
    Key("send.timeout.ms", IntKey(10, _MS_HOUR), ApiConfig, "send_timeout_ms"),
)
_LOGGING_KEYS = (
    Key("level", ChoiceKey(LogLevel), LoggingConfig, "level"),
    Key("format", ChoiceKey(LogFormat), LoggingConfig, "format"),
)
_TRACING_KEYS = (
    Key("exporter", ChoiceKey(TracingExporter), TracingConfig, "exporter"),
    Key("service.name", StrKey(allow_empty=False), TracingConfig, "service_name"),
)
_METRICS_KEYS = (
    Key("enable", BoolKey(), MetricsConfig, "enable"),
    Key(
        "exit.record.path",
        CustomKey(_read_journal_path, "a file path or null"),
        MetricsConfig,
        "exit_record_path",
    ),
)

_D, _Q, _E, _T = DeliveryConfig, DeadLetterQueueConfig, ErrorsConfig, RetryTiersConfig
DLQ_PREFIX = "errors.deadletterqueue."
_BREAKER = DLQ_PREFIX + "circuit.breaker."

TOP_KEYS: tuple[Key, ...] = (
    Key("kafka", CustomKey(_read_kafka, "a mapping of librdkafka properties"), Config, "kafka"),
    Key("source", Section(SourceConfig, _SOURCE_KEYS), Config, "source"),
    Key("engine", ChoiceKey(Engine), Config, "engine"),
    Key("ordering", ChoiceKey(Ordering), Config, "ordering"),
    Key("app", Section(AppConfig, _APP_KEYS, derived_from="url"), Config, "app"),
    # The sidecar's own limit on deliveries to the app, for both engines. Its old name,
    # `share.delivery.count.limit`, said neither: it is also the name of a share group's own
    # limit (the broker's, see sidecar.kafka.share.admin), and it applies to engine: consumer too.
    Key("delivery.count.limit", IntKey(1, 100), _D, "delivery_count_limit"),
    Key(
        "share.delivery.count.limit",
        IntKey(1, 100),
        _D,
        "delivery_count_limit",
        replaced_by="delivery.count.limit",
    ),
    Key("share.record.lock.duration.ms", IntKey(1000, _MS_HOUR), _D, "lock_duration_ms"),
    Key("share.partition.max.record.locks", IntKey(1, 100_000), _D, "partition_max_record_locks"),
    Key(
        "share.journal.path",
        CustomKey(_read_journal_path, "a file path, auto or null"),
        _D,
        "journal_path",
    ),
    Key("max.in.flight.records", IntKey(1, 1_000_000), _D, "max_in_flight_records"),
    Key(
        "max.buffered.records.per.partition",
        IntKey(1, 1_000_000),
        _D,
        "max_buffered_records_per_partition",
    ),
    Key("max.buffered.bytes", IntKey(16 * 1024 * 1024, 2**40), _D, "max_buffered_bytes"),
    Key("errors.tolerance", ChoiceKey(ErrorsTolerance), _E, "tolerance"),
    Key("errors.retry.delay.initial.ms", IntKey(0, _MS_HOUR), _D, "retry_delay_initial_ms"),
    Key("errors.retry.delay.max.ms", IntKey(0, _MS_DAY), _D, "retry_delay_max_ms"),
    Key("errors.retry.delay.multiplier", FloatKey(1.0, 100.0), _D, "retry_delay_multiplier"),
    Key("errors.retry.delay.jitter", FloatKey(0.0, 1.0), _D, "retry_delay_jitter"),
    Key("errors.retry.tiers", CustomKey(read_tiers, "a list of durations"), _T, "delays_ms"),
    Key("errors.retry.tier.threshold.ms", IntKey(0, 30 * _MS_DAY), _T, "threshold_ms"),
    Key("errors.retry.tier.topic.name", StrKey(allow_empty=False), _T, "topic_name"),
    Key(DLQ_PREFIX + "topic.name", StrKey(), _Q, "topic_name"),
    Key(DLQ_PREFIX + "topic.name.prefix", StrKey(), _Q, "topic_name_prefix"),
    Key(DLQ_PREFIX + "copy.record.enable", BoolKey(), _Q, "copy_record_enable"),
    Key(DLQ_PREFIX + "auto.create.enable", BoolKey(), _Q, "auto_create_enable"),
    Key(DLQ_PREFIX + "topic.partitions", IntKey(1, 100_000, also=(-1,)), _Q, "topic_partitions"),
    Key(
        DLQ_PREFIX + "topic.replication.factor",
        IntKey(1, 32_767, also=(-1,)),
        _Q,
        "topic_replication_factor",
    ),
    Key(DLQ_PREFIX + "context.headers.enable", BoolKey(), _Q, "context_headers_enable"),
    Key(DLQ_PREFIX + "stacktrace.max.bytes", IntKey(0, 1_048_576), _Q, "stacktrace_max_bytes"),
    Key(DLQ_PREFIX + "transactional.enable", BoolKey(), _Q, "transactional_enable"),
    Key(
        DLQ_PREFIX + "produce.retries.timeout.ms",
        IntKey(0, _MS_DAY),
        _Q,
        "produce_retries_timeout_ms",
    ),
    Key(
        DLQ_PREFIX + "source.check.interval.ms",
        IntKey(100, _MS_DAY),
        _Q,
        "source_check_interval_ms",
    ),
    # The DLQ circuit breaker (the ratio's upper bound is exclusive: checked in `checks`).
    Key(_BREAKER + "enable", BoolKey(), _Q, "circuit_breaker_enable"),
    Key(_BREAKER + "ratio", FloatKey(0.0, 1.0), _Q, "circuit_breaker_ratio"),
    Key(_BREAKER + "window.ms", IntKey(1000, _MS_DAY), _Q, "circuit_breaker_window_ms"),
    Key(_BREAKER + "min.records", IntKey(1, 10_000_000), _Q, "circuit_breaker_min_records"),
    Key(_BREAKER + "cooldown.ms", IntKey(1000, _MS_DAY), _Q, "circuit_breaker_cooldown_ms"),
    # DLQ routes (sidecar.config.routes): ordered rules, and the topics a reject may name.
    Key(DLQ_PREFIX + "routes", CustomKey(read_routes, "a list of rules"), _Q, "routes"),
    Key(
        DLQ_PREFIX + "routes.app.allowed",
        CustomKey(read_allowed, "a list of topic names"),
        _Q,
        "routes_app_allowed",
    ),
    Key("errors.log.enable", BoolKey(), _E, "log_enable"),
    Key("errors.log.include.messages", BoolKey(), _E, "log_include_messages"),
    Key("offset.metadata.max.bytes", IntKey(128, 1_048_576), Config, "offset_metadata_max_bytes"),
    Key("commit.interval.ms", IntKey(1, _MS_HOUR), Config, "commit_interval_ms"),
    Key("shutdown.drain.timeout.ms", IntKey(0, _MS_HOUR), Config, "shutdown_drain_timeout_ms"),
    Key("commit.stall.timeout.ms", IntKey(0, _MS_DAY), Config, "commit_stall_timeout_ms"),
    Key("api", Section(ApiConfig, _API_KEYS), Config, "api"),
    Key("logging", Section(LoggingConfig, _LOGGING_KEYS), Config, "logging"),
    Key("tracing", Section(TracingConfig, _TRACING_KEYS), Config, "tracing"),
    Key("metrics", Section(MetricsConfig, _METRICS_KEYS), Config, "metrics"),
    schemas_key(Config),
)
