"""The key tables: which YAML key goes where, of which kind, and the readers of the odd keys.

One table per section (`_Key`: YAML name, value kind, owning dataclass attribute), `_TOP_KEYS` for
the top level. The seeds' dotted property names (``share.*``, ``errors.*``) are flat top-level
keys, spelt verbatim; ``kafka:`` is passed through to librdkafka, except the properties the
sidecar must own. Custom readers: ``kafka``, ``source.topics``, ``app.unix_socket``, ``share.journal.path``
(and ``metrics.exit.record.path``),
``app.status.mapping``, ``app.headers``, and the listen/token checks of ``api``.

Imports: the standard library and the `sidecar.config` modules errors, environment, syntax,
values, kinds, routes (the DLQ routes' readers), schemas (the ``schemas:`` section), tiers (the retry tiers' reader), suggest and
librdkafka (librdkafka's own check of ``kafka:``); not checks, load, yamlcore, masking or dump.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

from sidecar.config.environment import _Context
from sidecar.config.errors import _Invalid
from sidecar.config.kinds import (
    _Bool,
    _Choice,
    _Custom,
    _describe,
    _describe_key,
    _Float,
    _Int,
    _int_text,
    _join,
    _Key,
    _mapping,
    _Section,
    _Str,
)
from sidecar.config.librdkafka import check_properties
from sidecar.config.routes import _read_allowed, _read_routes
from sidecar.config.schemas import schemas_key
from sidecar.config.suggest import closest
from sidecar.config.syntax import _unix_path_error, parse_listen, topic_name_error
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


def _read_kafka(raw: object, path: str, ctx: _Context) -> Mapping[str, str | int | bool]:
    data = _mapping(raw, path)
    sidecar_names = {key.name for key in _TOP_KEYS}
    out: dict[str, str | int | bool] = {}
    for name, value in data.items():
        key_path = _join(path, name)
        if name in _KAFKA_OWNED:
            raise _Invalid(key_path, f"must not be set: {_KAFKA_OWNED[name]}")
        if name in sidecar_names:
            raise _Invalid(
                key_path,
                "this is a sidecar setting, not a Kafka client property; move it to the top level",
            )
        if isinstance(value, str):
            out[name] = ctx.expand(value, key_path)[0]
        elif isinstance(value, bool):
            out[name] = value
        elif isinstance(value, int):
            if not -(2**63) <= value < 2**63:
                raise _Invalid(key_path, f"expected a 64-bit integer, got {_describe(value)}")
            out[name] = value
        else:
            raise _Invalid(
                key_path, f"expected a string, integer or boolean, got {_describe(value)}"
            )
    check_properties(out, path)
    for name in _KAFKA_REQUIRED:
        value = out.get(name)
        if value is None:
            typo = closest(name, [n for n in out if n not in _KAFKA_REQUIRED])
            if typo is not None:
                raise _Invalid(
                    _join(path, typo), f"unknown key; did you mean '{name}'? (a required key)"
                )
            raise _Invalid(_join(path, name), "required key is missing (a string)")
        if not isinstance(value, str) or not value.strip():
            raise _Invalid(
                _join(path, name), f"expected a non-empty string, got {_describe(value)}"
            )
    return MappingProxyType(out)


def _read_topics(raw: object, path: str, ctx: _Context) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise _Invalid(path, f"expected a list of topic names, got {_describe(raw)}")
    if not raw:
        raise _Invalid(path, "must list at least one topic")
    topics: list[str] = []
    for index, item in enumerate(raw):
        item_path = f"{path}[{index}]"
        name = _Str(check=topic_name_error).read(item, item_path, ctx)
        if name in topics:
            raise _Invalid(item_path, f"topic {name!r} is listed twice")
        topics.append(name)
    return tuple(topics)


def _read_unix_socket(raw: object, path: str, ctx: _Context) -> str | None:
    if raw is None:
        return None
    return _Str(check=_unix_path_error).read(raw, path, ctx)


def _journal_path_error(value: str) -> str | None:
    if value.endswith("/"):
        return "must name a file, not a directory (e.g. /var/lib/dlq-sidecar/share-journal)"
    if "\0" in value:
        return "must not contain a NUL character"
    return None


def _read_journal_path(raw: object, path: str, ctx: _Context) -> str | None:
    if raw is None:
        return None
    return _Str(allow_empty=False, check=_journal_path_error).read(raw, path, ctx)


def _read_status_mapping(raw: object, path: str, ctx: _Context) -> Mapping[int, StatusAck]:
    data = raw if raw is not None else {}
    if not isinstance(data, dict):
        raise _Invalid(path, f"expected a mapping of status code to ack, got {_describe(data)}")
    out: dict[int, StatusAck] = {}
    for key, value in data.items():
        key_path = _join(path, _describe_key(key))
        if isinstance(key, str) and key.isascii() and key.isdigit():
            if len(key) > 3:
                raise _Invalid(
                    key_path, f"an HTTP status code is in 100..599, got {len(key)} digits"
                )
            code = int(key)
        elif isinstance(key, int) and not isinstance(key, bool):
            code = key
        else:
            raise _Invalid(key_path, f"expected an HTTP status code as key, got {_describe(key)}")
        if not 100 <= code <= 599:
            raise _Invalid(key_path, f"an HTTP status code is in 100..599, got {_int_text(code)}")
        if code in out:
            raise _Invalid(key_path, f"status {code} is mapped twice")
        out[code] = StatusAck(_Choice(StatusAck).read(value, key_path, ctx))
    return MappingProxyType(out)


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Framing and routing headers are the HTTP client's business; a static override would corrupt
# the request or the keep-alive connection.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te"}
)


def _read_headers(raw: object, path: str, ctx: _Context) -> Mapping[str, str]:
    data = _mapping({} if raw is None else raw, path)
    out: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in data.items():
        key_path = _join(path, name)
        if not _TOKEN.fullmatch(name):
            raise _Invalid(key_path, "not a valid HTTP header name")
        if name.lower() in _RESERVED_HEADERS:
            raise _Invalid(key_path, "this header is set by the sidecar's HTTP client")
        if name.lower() in seen:
            raise _Invalid(key_path, "header is listed twice (names are case-insensitive)")
        seen.add(name.lower())
        text = _Str().read(value, key_path, ctx)
        # The rule of the request formatter (sidecar/core/wire/requests.py), checked here so a bad value is a
        # start-up error, not a failure at the first delivery. The value is never echoed: it may
        # be a secret.
        if not (text.isascii() and text.isprintable()):
            raise _Invalid(
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
    _Key("topics", _Custom(_read_topics, "a list of topic names"), SourceConfig, "topics"),
)

_APP_KEYS = (
    # Empty (or left out) only with app.mode: pull; AppConfig checks the pair.
    _Key("url", _Str(allow_empty=True), AppConfig, "url"),
    _Key("unix_socket", _Custom(_read_unix_socket, "a path or null"), AppConfig, "unix_socket"),
    _Key("mode", _Choice(AppMode), AppConfig, "mode"),
    _Key("batch.max.records", _Int(1, 10_000), AppConfig, "batch_max_records"),
    _Key("batch.linger.ms", _Int(0, 10_000), AppConfig, "batch_linger_ms"),
    _Key("timeout.ms", _Int(1, _MS_HOUR), AppConfig, "timeout_ms"),
    _Key("max.in.flight", _Int(1, 4096), AppConfig, "max_in_flight"),
    _Key("connect.backoff.initial.ms", _Int(1, 60_000), AppConfig, "connect_backoff_initial_ms"),
    _Key("connect.backoff.max.ms", _Int(1, _MS_HOUR), AppConfig, "connect_backoff_max_ms"),
    _Key(
        "status.mapping",
        _Custom(
            _read_status_mapping, "a mapping of status code to accept|release|reject|route-missing"
        ),
        AppConfig,
        "status_mapping",
    ),
    _Key(
        "headers", _Custom(_read_headers, "a mapping of header name to value"), AppConfig, "headers"
    ),
    _Key("format", _Choice(AppFormat), AppConfig, "format"),
    # The source is checked as a URI-reference in `checks`, once `{cluster}` and `{topic}` are known.
    _Key("cloudevents.source", _Str(allow_empty=False), AppConfig, "cloudevents_source"),
    _Key(
        "cloudevents.type",
        _Str(allow_empty=False, check=_cloudevents_string_error),
        AppConfig,
        "cloudevents_type",
    ),
)

_API_KEYS = (
    _Key("listen", _Str(allow_empty=False, check=_check_listen), ApiConfig, "listen"),
    _Key("token", _Str(check=_check_api_token), ApiConfig, "token"),
    _Key(
        "observability.listen",
        _Str(check=_check_optional_listen),
        ApiConfig,
        "observability_listen",
    ),
    _Key("max.connections", _Int(1, 65_536), ApiConfig, "max_connections"),
    _Key("max.connections.per.peer", _Int(1, 65_536), ApiConfig, "max_connections_per_peer"),
    _Key("max.request.bytes", _Int(1024, 64 * 1024 * 1024), ApiConfig, "max_request_bytes"),
    _Key("max.ack.items", _Int(1, 100_000), ApiConfig, "max_ack_items"),
    _Key("idle.timeout.ms", _Int(10, _MS_HOUR), ApiConfig, "idle_timeout_ms"),
    _Key("keep.alive.timeout.ms", _Int(10, _MS_HOUR), ApiConfig, "keep_alive_timeout_ms"),
    _Key("header.timeout.ms", _Int(10, _MS_HOUR), ApiConfig, "header_timeout_ms"),
    _Key("body.timeout.ms", _Int(10, _MS_HOUR), ApiConfig, "body_timeout_ms"),
    _Key("body.min.rate.bytes.per.s", _Int(0, 2**30), ApiConfig, "body_min_rate_bytes_per_s"),
    _Key("request.timeout.ms", _Int(10, _MS_HOUR), ApiConfig, "request_timeout_ms"),
    _Key("send.timeout.ms", _Int(10, _MS_HOUR), ApiConfig, "send_timeout_ms"),
)
_LOGGING_KEYS = (
    _Key("level", _Choice(LogLevel), LoggingConfig, "level"),
    _Key("format", _Choice(LogFormat), LoggingConfig, "format"),
)
_TRACING_KEYS = (
    _Key("exporter", _Choice(TracingExporter), TracingConfig, "exporter"),
    _Key("service.name", _Str(allow_empty=False), TracingConfig, "service_name"),
)
_METRICS_KEYS = (
    _Key("enable", _Bool(), MetricsConfig, "enable"),
    _Key(
        "exit.record.path",
        _Custom(_read_journal_path, "a file path or null"),
        MetricsConfig,
        "exit_record_path",
    ),
)

_D, _Q, _E, _T = DeliveryConfig, DeadLetterQueueConfig, ErrorsConfig, RetryTiersConfig
_DLQ = "errors.deadletterqueue."
_BREAKER = _DLQ + "circuit.breaker."

_TOP_KEYS: tuple[_Key, ...] = (
    _Key("kafka", _Custom(_read_kafka, "a mapping of librdkafka properties"), Config, "kafka"),
    _Key("source", _Section(SourceConfig, _SOURCE_KEYS), Config, "source"),
    _Key("engine", _Choice(Engine), Config, "engine"),
    _Key("ordering", _Choice(Ordering), Config, "ordering"),
    _Key("app", _Section(AppConfig, _APP_KEYS, derived_from="url"), Config, "app"),
    # The sidecar's own limit on deliveries to the app, for both engines. Its old name,
    # `share.delivery.count.limit`, said neither: it is also the name of a share group's own
    # limit (the broker's, see sidecar.kafka.share.admin), and it applies to engine: consumer too.
    _Key("delivery.count.limit", _Int(1, 100), _D, "delivery_count_limit"),
    _Key(
        "share.delivery.count.limit",
        _Int(1, 100),
        _D,
        "delivery_count_limit",
        replaced_by="delivery.count.limit",
    ),
    _Key("share.record.lock.duration.ms", _Int(1000, _MS_HOUR), _D, "lock_duration_ms"),
    _Key("share.partition.max.record.locks", _Int(1, 100_000), _D, "partition_max_record_locks"),
    _Key(
        "share.journal.path",
        _Custom(_read_journal_path, "a file path, auto or null"),
        _D,
        "journal_path",
    ),
    _Key("max.in.flight.records", _Int(1, 1_000_000), _D, "max_in_flight_records"),
    _Key(
        "max.buffered.records.per.partition",
        _Int(1, 1_000_000),
        _D,
        "max_buffered_records_per_partition",
    ),
    _Key("max.buffered.bytes", _Int(16 * 1024 * 1024, 2**40), _D, "max_buffered_bytes"),
    _Key("errors.tolerance", _Choice(ErrorsTolerance), _E, "tolerance"),
    _Key("errors.retry.delay.initial.ms", _Int(0, _MS_HOUR), _D, "retry_delay_initial_ms"),
    _Key("errors.retry.delay.max.ms", _Int(0, _MS_DAY), _D, "retry_delay_max_ms"),
    _Key("errors.retry.delay.multiplier", _Float(1.0, 100.0), _D, "retry_delay_multiplier"),
    _Key("errors.retry.delay.jitter", _Float(0.0, 1.0), _D, "retry_delay_jitter"),
    _Key("errors.retry.tiers", _Custom(read_tiers, "a list of durations"), _T, "delays_ms"),
    _Key("errors.retry.tier.threshold.ms", _Int(0, 30 * _MS_DAY), _T, "threshold_ms"),
    _Key("errors.retry.tier.topic.name", _Str(allow_empty=False), _T, "topic_name"),
    _Key(_DLQ + "topic.name", _Str(), _Q, "topic_name"),
    _Key(_DLQ + "topic.name.prefix", _Str(), _Q, "topic_name_prefix"),
    _Key(_DLQ + "copy.record.enable", _Bool(), _Q, "copy_record_enable"),
    _Key(_DLQ + "auto.create.enable", _Bool(), _Q, "auto_create_enable"),
    _Key(_DLQ + "topic.partitions", _Int(1, 100_000, also=(-1,)), _Q, "topic_partitions"),
    _Key(
        _DLQ + "topic.replication.factor",
        _Int(1, 32_767, also=(-1,)),
        _Q,
        "topic_replication_factor",
    ),
    _Key(_DLQ + "context.headers.enable", _Bool(), _Q, "context_headers_enable"),
    _Key(_DLQ + "stacktrace.max.bytes", _Int(0, 1_048_576), _Q, "stacktrace_max_bytes"),
    _Key(_DLQ + "transactional.enable", _Bool(), _Q, "transactional_enable"),
    _Key(_DLQ + "produce.retries.timeout.ms", _Int(0, _MS_DAY), _Q, "produce_retries_timeout_ms"),
    # The DLQ circuit breaker (the ratio's upper bound is exclusive: checked in `checks`).
    _Key(_BREAKER + "enable", _Bool(), _Q, "circuit_breaker_enable"),
    _Key(_BREAKER + "ratio", _Float(0.0, 1.0), _Q, "circuit_breaker_ratio"),
    _Key(_BREAKER + "window.ms", _Int(1000, _MS_DAY), _Q, "circuit_breaker_window_ms"),
    _Key(_BREAKER + "min.records", _Int(1, 10_000_000), _Q, "circuit_breaker_min_records"),
    _Key(_BREAKER + "cooldown.ms", _Int(1000, _MS_DAY), _Q, "circuit_breaker_cooldown_ms"),
    # DLQ routes (sidecar.config.routes): ordered rules, and the topics a reject may name.
    _Key(_DLQ + "routes", _Custom(_read_routes, "a list of rules"), _Q, "routes"),
    _Key(
        _DLQ + "routes.app.allowed",
        _Custom(_read_allowed, "a list of topic names"),
        _Q,
        "routes_app_allowed",
    ),
    _Key("errors.log.enable", _Bool(), _E, "log_enable"),
    _Key("errors.log.include.messages", _Bool(), _E, "log_include_messages"),
    _Key("offset.metadata.max.bytes", _Int(128, 1_048_576), Config, "offset_metadata_max_bytes"),
    _Key("commit.interval.ms", _Int(1, _MS_HOUR), Config, "commit_interval_ms"),
    _Key("shutdown.drain.timeout.ms", _Int(0, _MS_HOUR), Config, "shutdown_drain_timeout_ms"),
    _Key("commit.stall.timeout.ms", _Int(0, _MS_DAY), Config, "commit_stall_timeout_ms"),
    _Key("api", _Section(ApiConfig, _API_KEYS), Config, "api"),
    _Key("logging", _Section(LoggingConfig, _LOGGING_KEYS), Config, "logging"),
    _Key("tracing", _Section(TracingConfig, _TRACING_KEYS), Config, "tracing"),
    _Key("metrics", _Section(MetricsConfig, _METRICS_KEYS), Config, "metrics"),
    schemas_key(Config),
)
