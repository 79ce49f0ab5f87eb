"""Cross-key rules, checked after every key has its own type and range.

Owns the rules that relate keys to each other (``app.timeout.ms`` below the lock duration, a
backoff's max at least its initial value, transactions only with the consumer engine, librdkafka's
prefetch within ``max.buffered.bytes``), the two API listeners, and the start-up checks of the DLQ: a
bad DLQ topic name (for any source topic) is a configuration error, not a runtime surprise. Each raises `Invalid` with the key it blames.

Imports: the standard library and the `sidecar.config` modules errors, syntax, values, schema
(for the DLQ key prefix), routes (`check_routes`) and schemas (`check_schemas`), and `sidecar.core.budget`; not load, yamlcore, masking or dump.
"""

from __future__ import annotations

from sidecar.config.errors import Invalid
from sidecar.config.routes import check_routes
from sidecar.config.schema import DLQ_PREFIX
from sidecar.config.schemas import check_schemas
from sidecar.config.syntax import is_loopback_host, topic_name_error
from sidecar.config.tiers import check_tier_topics
from sidecar.config.values import ApiConfig, AppFormat, AppMode, Config, Engine
from sidecar.core.budget import BudgetError, split_budget

# RFC 3986: the characters a URI-reference may hold (unreserved, reserved, and '%' escapes).
_URI_CHARS = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~:/?#[]@!$&'()*+,;=%"
)


def check_config(config: Config) -> None:
    app, delivery = config.app, config.delivery
    if app.timeout_ms >= delivery.lock_duration_ms and app.mode is not AppMode.PULL:
        # The lock bounds the whole attempt; a request that may outlive it would be answered
        # after the record was already released to someone else.
        raise Invalid(
            "app.timeout.ms",
            f"must be less than share.record.lock.duration.ms ({delivery.lock_duration_ms}), "
            f"got {app.timeout_ms}",
        )
    if app.connect_backoff_max_ms < app.connect_backoff_initial_ms:
        raise Invalid(
            "app.connect.backoff.max.ms",
            f"must be at least app.connect.backoff.initial.ms ({app.connect_backoff_initial_ms}), "
            f"got {app.connect_backoff_max_ms}",
        )
    if delivery.retry_delay_max_ms < delivery.retry_delay_initial_ms:
        raise Invalid(
            "errors.retry.delay.max.ms",
            f"must be at least errors.retry.delay.initial.ms ({delivery.retry_delay_initial_ms}), "
            f"got {delivery.retry_delay_max_ms}",
        )
    if config.errors.dlq.transactional_enable and config.engine is Engine.SHARE:
        raise Invalid(
            DLQ_PREFIX + "transactional.enable",
            "needs engine: consumer (share groups cannot commit acknowledgements in a transaction)",
        )
    try:
        # librdkafka's prefetch counts against the byte budget: what the user set under `kafka:`
        # must leave the sidecar's own buffer its part.
        split_budget(delivery.max_buffered_bytes, config.kafka)
    except BudgetError as exc:
        raise Invalid(exc.key, exc.reason) from None
    _check_api_listeners(config.api)
    _check_api_limits(config.api)
    _check_circuit_breaker(config)
    _check_dlq_topic(config)
    check_tier_topics(
        config.errors.tiers,
        config.source.topics,
        prefix=config.errors.dlq.topic_name_prefix,
        dlq_topic_for=config.dlq_topic_for,
        prefix_key=DLQ_PREFIX + "topic.name.prefix",
    )
    check_routes(config)
    _check_cloudevents_source(config)
    _check_pull_mode(config)
    check_schemas(config.schemas, config.source.topics)


def _check_pull_mode(config: Config) -> None:
    """Pull mode: the keys that say how to reach the app contradict it (app.url: `AppConfig`)."""
    app = config.app
    if app.mode is not AppMode.PULL:
        return
    if app.unix_socket is not None:
        raise Invalid(
            "app.unix_socket",
            "must be left out with app.mode: pull: nothing connects to the app; the app pulls "
            "from the control API (put that on a Unix socket with api.listen: unix:/path)",
        )
    if app.format is AppFormat.CLOUDEVENTS:
        raise Invalid(
            "app.format",
            "cloudevents shapes requests to the app; with app.mode: pull the app reads the "
            "sidecar's own JSON records from GET /v1/records",
        )


def _check_circuit_breaker(config: Config) -> None:
    ratio = config.errors.dlq.circuit_breaker_ratio
    if ratio >= 1.0:
        raise Invalid(
            DLQ_PREFIX + "circuit.breaker.ratio",
            f"must be below 1 (it trips when more than this share is dead-lettered, and more than "
            f"all of them never is), got {ratio}",
        )


def _check_api_listeners(api: ApiConfig) -> None:
    control = api.address
    if control[0] == "tcp" and not is_loopback_host(control[1]):
        # The control API changes record state (acks) and reveals it (status): never on a pod IP.
        raise Invalid(
            "api.listen",
            f"{control[1]!r} is not a loopback address: the control API listens on loopback or a "
            "Unix socket only; serve /healthz, /readyz and /metrics beyond this host with "
            "api.observability.listen",
        )
    observability = api.observability_address
    if observability is None:
        return
    if observability[0] == "unix" and control[0] == "unix" and observability[1] == control[1]:
        raise Invalid("api.observability.listen", "must not be the control API's socket")
    if observability[0] == "tcp" and control[0] == "tcp" and observability[2] == control[2] != 0:
        raise Invalid(
            "api.observability.listen", f"must not use the control API's port {control[2]}"
        )


def _check_api_limits(api: ApiConfig) -> None:
    """The listeners' per-phase deadlines fit in the whole-request one; a peer's cap in the
    listener's."""
    for key, value in (
        ("api.header.timeout.ms", api.header_timeout_ms),
        ("api.body.timeout.ms", api.body_timeout_ms),
    ):
        if value > api.request_timeout_ms:
            raise Invalid(
                key,
                f"must not exceed api.request.timeout.ms ({api.request_timeout_ms}), the whole "
                f"request's deadline, got {value}",
            )
    if api.max_connections_per_peer > api.max_connections:
        raise Invalid(
            "api.max.connections.per.peer",
            f"must not exceed api.max.connections ({api.max_connections}), "
            f"got {api.max_connections_per_peer}",
        )


def _check_dlq_topic(config: Config) -> None:
    dlq = config.errors.dlq
    if not dlq.enabled:
        return
    path = DLQ_PREFIX + "topic.name"
    sources = set(config.source.topics)
    for topic in config.source.topics:
        name = dlq.topic_name.replace("{topic}", topic)
        shown = repr(name) if name == dlq.topic_name else f"{name!r} (for source topic {topic!r})"
        if name.startswith("__"):
            raise Invalid(path, f"{shown} must not start with '__' (reserved for Kafka internals)")
        if dlq.topic_name_prefix and not name.startswith(dlq.topic_name_prefix):
            raise Invalid(
                path,
                f"{shown} must start with {dlq.topic_name_prefix!r} ({DLQ_PREFIX}topic.name.prefix)",
            )
        if name in sources:
            raise Invalid(path, f"{shown} is a source topic; a DLQ must not feed its own source")
        problem = topic_name_error(name)
        if problem:
            if "{" in name or "}" in name:
                problem += " (only '{topic}' is substituted)"
            raise Invalid(path, f"{shown} is not a valid topic name: {problem}")


def _check_cloudevents_source(config: Config) -> None:
    if config.app.format is not AppFormat.CLOUDEVENTS:
        return
    for name in config.app.headers:
        if name.lower().startswith("ce-"):
            # A static ce-* header would repeat or contradict the event's own attribute.
            raise Invalid(
                f"app.headers.{name}",
                "with app.format: cloudevents the ce-* headers are the event's attributes; set "
                "app.cloudevents.source / app.cloudevents.type, or ce_* headers on the records",
            )
    template = config.cloudevents_source
    for topic in config.source.topics:
        source = template.replace("{topic}", topic)
        bad = sorted({ch for ch in source if ch not in _URI_CHARS})
        if bad:
            shown = ", ".join(repr(ch) for ch in bad[:5])
            hint = " (only '{cluster}' and '{topic}' are substituted)" if "{" in bad else ""
            raise Invalid(
                "app.cloudevents.source",
                f"{source!r} is not a URI-reference: it holds {shown}{hint}",
            )
