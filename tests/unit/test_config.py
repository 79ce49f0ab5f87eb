"""Configuration: the example file, defaults, every validation rule (with its exact key path),
environment substitution, YAML strictness and secret masking."""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.config import (
    AppConfig,
    AppMode,
    Config,
    ConfigError,
    DeadLetterQueueConfig,
    DeliveryConfig,
    Engine,
    ErrorsConfig,
    ErrorsTolerance,
    LogFormat,
    LogLevel,
    Ordering,
    StatusAck,
    TracingExporter,
    dump_config,
    is_loopback_host,
    load_config,
    parse_config,
    parse_listen,
    topic_name_error,
)
from sidecar.config.masking import is_secret_kafka_property
from sidecar.core.wire import format_single_request
from tests.unit.test_wire import ParsedRequest, make_record

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.yaml"

MINIMAL: dict[str, Any] = {
    "kafka": {"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"},
    "source": {"topics": ["orders"]},
    "app": {"url": "http://127.0.0.1:8080/records"},
}
DELETE = object()
_DLQ_PREFIX_KEY = "errors.deadletterqueue.topic.name.prefix"


def patched(patch: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A deep copy of MINIMAL with `patch` merged in; DELETE removes a key."""
    out = copy.deepcopy(MINIMAL if base is None else base)
    for key, value in patch.items():
        if value is DELETE:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = patched(value, out[key])
        else:
            out[key] = value
    return out


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def load_dict(tmp_path: Path, data: dict[str, Any], env: dict[str, str] | None = None) -> Config:
    """Round-trip through a real YAML file so the loader (not only parse_config) is exercised."""
    return load_config(write(tmp_path, yaml.safe_dump(data, sort_keys=False)), env or {})


# ---------------------------------------------------------------------------------------------
# The example file


def test_example_loads_with_demo_values() -> None:
    config = load_config(EXAMPLE, env={})
    assert config.kafka["bootstrap.servers"] == "127.0.0.1:9092"
    assert config.kafka["group.id"] == "dlq-sidecar-demo"
    assert config.group_id == "dlq-sidecar-demo"
    assert config.source.topics == ("orders",)
    assert config.dlq_topic_for("orders") == "dlq.orders"
    assert (config.app.host, config.app.port, config.app.path) == ("127.0.0.1", 8080, "/records")
    assert config.api.address == ("tcp", "127.0.0.1", 8787)


def test_example_bootstrap_comes_from_the_environment() -> None:
    config = load_config(EXAMPLE, env={"KAFKA_BOOTSTRAP": "broker-1:9093,broker-2:9093"})
    assert config.kafka["bootstrap.servers"] == "broker-1:9093,broker-2:9093"


def test_example_sets_every_value_to_its_default() -> None:
    example = load_config(EXAMPLE, env={})
    minimal = parse_config(
        patched({"kafka": dict(example.kafka), "source": {"topics": ["orders"]}}), env={}
    )
    assert example == minimal


def test_example_documents_every_key_with_a_comment() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    schema = dump_config(load_config(EXAMPLE, env={}))
    # Same keys as the effective configuration, section by section (kafka is a pass-through).
    assert set(raw) == set(schema)
    for name, value in schema.items():
        if isinstance(value, dict) and name not in ("kafka", "app"):
            assert set(raw[name]) == set(value), name
    assert set(raw["app"]) == set(schema["app"])

    lines = EXAMPLE.read_text(encoding="utf-8").splitlines()
    documented = set()
    for index, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z_][\w.]*):", line)
        if not match:
            continue
        block = []
        for previous in reversed(lines[:index]):
            if not previous.strip().startswith("#"):
                break
            block.append(previous)
        assert block, f"no comment above {line.strip()!r}"
        comment = " ".join(block)
        if match.group(2) not in ("kafka", "source", "app", "api", "logging", "tracing", "metrics"):
            assert "Default" in comment or "Required" in comment, line
        documented.add(match.group(2))
    assert "errors.deadletterqueue.produce.retries.timeout.ms" in documented


# ---------------------------------------------------------------------------------------------
# Defaults and structure


def test_minimal_config_takes_the_documented_defaults() -> None:
    config = parse_config(MINIMAL, env={})
    assert config.engine is Engine.CONSUMER
    assert config.ordering is Ordering.KEY
    assert config.app.mode is AppMode.SINGLE
    assert config.app.timeout_ms == 10000
    assert config.app.batch_max_records == 100
    assert config.app.max_in_flight == 64
    assert config.app.unix_socket is None
    assert dict(config.app.status_mapping) == {}
    assert config.delivery == DeliveryConfig()
    assert config.delivery.delivery_count_limit == 5
    assert config.delivery.lock_duration_ms == 30000
    assert config.delivery.retry_delay_multiplier == 2.0
    assert config.errors == ErrorsConfig()
    assert config.errors.tolerance is ErrorsTolerance.ALL
    assert config.errors.dlq.topic_name == "dlq.{topic}"
    assert config.errors.dlq.topic_name_prefix == "dlq."
    assert config.errors.dlq.copy_record_enable is False
    assert config.errors.dlq.produce_retries_timeout_ms == 120000
    assert config.offset_metadata_max_bytes == 4096
    assert config.commit_interval_ms == 1000
    assert config.shutdown_drain_timeout_ms == 20000
    assert config.api.listen == "127.0.0.1:8787"
    assert config.logging.level is LogLevel.INFO
    assert config.logging.format is LogFormat.AUTO
    assert config.tracing.exporter is TracingExporter.NONE
    assert config.tracing.service_name == "dlq-sidecar"
    assert config.metrics.enable is True


def test_every_dataclass_is_frozen_and_slotted() -> None:
    config = parse_config(MINIMAL, env={})
    for value in (config, config.app, config.source, config.delivery, config.errors.dlq):
        assert not hasattr(value, "__dict__")
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, dataclasses.fields(value)[0].name, None)
    with pytest.raises(TypeError):
        config.kafka["group.id"] = "other"  # type: ignore[index]
    with pytest.raises(TypeError):
        config.app.headers["X"] = "y"  # type: ignore[index]


def test_all_keys_parse_into_their_fields(tmp_path: Path) -> None:
    config = load_dict(
        tmp_path,
        patched(
            {
                "engine": "share",
                "ordering": "none",
                "app": {
                    "mode": "batch",
                    "batch.max.records": 500,
                    "batch.linger.ms": 0,
                    "timeout.ms": 2000,
                    "max.in.flight": 8,
                    "connect.backoff.initial.ms": 50,
                    "connect.backoff.max.ms": 50,
                    "status.mapping": {"409": "reject", 404: "release", "201": "accept"},
                    "headers": {"X-Tenant": "acme"},
                },
                "share.delivery.count.limit": 3,
                "share.record.lock.duration.ms": 5000,
                "share.partition.max.record.locks": 10,
                "max.in.flight.records": 20,
                "max.buffered.records.per.partition": 30,
                "errors.tolerance": "none",
                "errors.retry.delay.initial.ms": 0,
                "errors.retry.delay.max.ms": 0,
                "errors.retry.delay.multiplier": 3,  # an int is a fine float
                "errors.retry.delay.jitter": 0,
                "errors.deadletterqueue.topic.name": "",
                "errors.deadletterqueue.topic.partitions": -1,
                "errors.deadletterqueue.topic.replication.factor": -1,
                "errors.log.enable": True,
                "offset.metadata.max.bytes": 128,
                "api": {"listen": "[::1]:0", "observability.listen": "0.0.0.0:0"},
                "logging": {"level": "debug", "format": "logfmt"},
                "tracing": {"exporter": "otlp-grpc", "service.name": "orders"},
                "metrics": {"enable": False},
            }
        ),
    )
    assert config.engine is Engine.SHARE and config.ordering is Ordering.NONE
    assert config.app.mode is AppMode.BATCH and config.app.batch_max_records == 500
    assert config.app.status_mapping == {
        409: StatusAck.REJECT,
        404: StatusAck.RELEASE,
        201: StatusAck.ACCEPT,
    }
    assert dict(config.app.headers) == {"X-Tenant": "acme"}
    assert config.delivery == DeliveryConfig(
        delivery_count_limit=3,
        lock_duration_ms=5000,
        partition_max_record_locks=10,
        max_in_flight_records=20,
        max_buffered_records_per_partition=30,
        retry_delay_initial_ms=0,
        retry_delay_max_ms=0,
        retry_delay_multiplier=3.0,
        retry_delay_jitter=0.0,
    )
    assert isinstance(config.delivery.retry_delay_multiplier, float)
    assert config.errors.tolerance is ErrorsTolerance.NONE
    assert config.errors.log_enable is True
    assert config.errors.dlq.topic_partitions == -1
    assert config.errors.dlq.enabled is False
    assert config.dlq_topic_for("orders") is None
    assert config.api.address == ("tcp", "::1", 0)
    assert config.api.observability_address == ("tcp", "0.0.0.0", 0)
    assert config.logging.format is LogFormat.LOGFMT
    assert config.tracing.exporter is TracingExporter.OTLP_GRPC
    assert config.metrics.enable is False


def test_to_dict_round_trips_and_is_json_shaped() -> None:
    config = parse_config(
        patched(
            {
                "kafka": {"sasl.password": "hunter2", "linger.ms": 5, "enable.idempotence": True},
                "app": {"status.mapping": {"409": "reject"}, "headers": {"X-A": "b"}},
                "engine": "share",
            }
        ),
        env={},
    )
    dumped = dump_config(config, mask_secrets=False)
    assert dumped["app"]["status.mapping"] == {"409": "reject"}
    assert dumped["engine"] == "share" and type(dumped["engine"]) is str
    assert parse_config(dumped, env={}) == config
    assert yaml.safe_load(yaml.safe_dump(dumped)) == dumped


def test_to_dict_masks_secrets() -> None:
    config = parse_config(
        patched(
            {
                "kafka": {
                    "sasl.password": "hunter2",
                    "ssl.key.pem": "pem",
                    "ssl.key.location": "/k.pem",
                    "sasl.oauthbearer.client.secret": "s3",
                    "ssl.key.password": "p",
                    "sasl.username": "alice",
                    "linger.ms": 5,
                },
                "app": {"headers": {"Authorization": "Bearer t", "X-Api-Key": "k", "X-A": "b"}},
            }
        ),
        env={},
    )
    dumped = dump_config(config)
    assert dumped["kafka"] == {
        "bootstrap.servers": "127.0.0.1:9092",
        "group.id": "g",
        "sasl.password": "***",
        "ssl.key.pem": "***",
        "ssl.key.location": "***",
        "sasl.oauthbearer.client.secret": "***",
        "ssl.key.password": "***",
        "sasl.username": "alice",
        "linger.ms": 5,
    }
    assert dumped["app"]["headers"] == {"Authorization": "***", "X-Api-Key": "***", "X-A": "b"}
    assert "hunter2" not in repr(dumped)
    # Masking is a view: the config itself keeps the real values.
    assert config.kafka["sasl.password"] == "hunter2"


# ---------------------------------------------------------------------------------------------
# Environment substitution


@pytest.mark.parametrize(
    ("value", "env", "expected"),
    [
        ("${PW}", {"PW": "s3cret"}, "s3cret"),
        ("user:${PW}@x", {"PW": "s3cret"}, "user:s3cret@x"),
        ("${PW:-fallback}", {}, "fallback"),
        ("${PW:-fallback}", {"PW": ""}, "fallback"),  # shell ':-': empty takes the default too
        ("${PW:-}", {}, ""),
        ("${PW}", {"PW": ""}, ""),
        ("${A}${B}", {"A": "1", "B": "2"}, "12"),
        ("${A:-x:y}", {}, "x:y"),
        ("$${PW}", {"PW": "no"}, "${PW}"),
        ("pa$$word $x", {}, "pa$$word $x"),  # only ${ is special
        ("${PW}", {"PW": "${OTHER}"}, "${OTHER}"),  # substituted text is not expanded again
    ],
)
def test_env_substitution_in_strings(value: str, env: dict[str, str], expected: str) -> None:
    config = parse_config(patched({"kafka": {"sasl.password": value}}), env=env)
    assert config.kafka["sasl.password"] == expected


def test_env_substitution_reaches_nested_values(tmp_path: Path) -> None:
    text = """
kafka: {bootstrap.servers: "${BROKERS}", group.id: "${GROUP:-g1}"}
source: {topics: ["${TOPIC}", audit]}
app:
  url: "http://127.0.0.1:${APP_PORT}/r"
  headers: {X-Token-Id: "${TOKEN_ID}"}
  timeout.ms: ${TIMEOUT_MS}
share.record.lock.duration.ms: ${LOCK_MS:-60000}
errors.retry.delay.jitter: ${JITTER}
metrics: {enable: "${METRICS}"}
"""
    env = {
        "BROKERS": "b:9092",
        "TOPIC": "orders",
        "APP_PORT": "9000",
        "TOKEN_ID": "t-1",
        "TIMEOUT_MS": "45000",
        "JITTER": "0.5",
        "METRICS": "False",
    }
    config = load_config(write(tmp_path, text), env)
    assert config.kafka == {"bootstrap.servers": "b:9092", "group.id": "g1"}
    assert config.source.topics == ("orders", "audit")
    assert config.app.port == 9000
    assert config.app.headers["X-Token-Id"] == "t-1"
    # A value that is exactly one reference takes the key's type.
    assert config.app.timeout_ms == 45000
    assert config.delivery.lock_duration_ms == 60000
    assert config.delivery.retry_delay_jitter == 0.5
    assert config.metrics.enable is False


def test_env_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLQ_SIDECAR_TEST_GROUP", "from-os")
    config = parse_config(patched({"kafka": {"group.id": "${DLQ_SIDECAR_TEST_GROUP}"}}))
    assert config.group_id == "from-os"


# ---------------------------------------------------------------------------------------------
# Validation: one table of bad files, each with the exact key path and part of the reason

LONG_TOPIC = "t" * 250
BAD: list[tuple[str, dict[str, Any], dict[str, str], str, str]] = [
    # unknown keys
    ("unknown top-level", {"bogus": 1}, {}, "bogus", "unknown key"),
    ("unknown nested", {"app": {"bogus": 1}}, {}, "app.bogus", "keys allowed at 'app'"),
    ("unknown in api", {"api": {"port": 1}}, {}, "api.port", "unknown key"),
    ("unknown in source", {"source": {"pattern": "x"}}, {}, "source.pattern", "unknown key"),
    ("typo suggestion", {"app": {"timout.ms": 1}}, {}, "app.timout.ms", "'timeout.ms'"),
    ("typo top-level", {"errors.tolerence": "all"}, {}, "errors.tolerence", "'errors.tolerance'"),
    ("nested errors", {"errors": {"tolerance": "all"}}, {}, "errors", "written flat"),
    ("nested share", {"share": {"delivery": 1}}, {}, "share", "written flat"),
    ("section key flat", {"app.timeout.ms": 5}, {}, "app.timeout.ms", "under 'app:'"),
    # required keys
    ("no kafka", {"kafka": DELETE}, {}, "kafka", "required key is missing"),
    ("no source", {"source": DELETE}, {}, "source", "required key is missing"),
    ("no app", {"app": DELETE}, {}, "app", "required key is missing"),
    ("no app.url", {"app": {"url": DELETE, "mode": "single"}}, {}, "app.url", "required"),
    ("no topics", {"source": {"topics": DELETE}}, {}, "source.topics", "required"),
    (
        "no bootstrap",
        {"kafka": {"bootstrap.servers": DELETE}},
        {},
        "kafka.bootstrap.servers",
        "required",
    ),
    ("no group", {"kafka": {"group.id": DELETE}}, {}, "kafka.group.id", "required"),
    ("empty group", {"kafka": {"group.id": " "}}, {}, "kafka.group.id", "non-empty string"),
    ("int group", {"kafka": {"group.id": 7}}, {}, "kafka.group.id", "got an integer"),
    # wrong types
    ("kafka not a map", {"kafka": ["a"]}, {}, "kafka", "expected a mapping, got a list"),
    ("kafka list value", {"kafka": {"x": [1]}}, {}, "kafka.x", "string, integer or boolean"),
    ("kafka null value", {"kafka": {"x": None}}, {}, "kafka.x", "got null"),
    ("app not a map", {"app": "http://x"}, {}, "app", "expected a mapping"),
    ("quoted int", {"app": {"timeout.ms": "100"}}, {}, "app.timeout.ms", "without quotes"),
    ("bool as int", {"share.delivery.count.limit": True}, {}, "share.delivery.count.limit", "bool"),
    ("float as int", {"commit.interval.ms": 1.5}, {}, "commit.interval.ms", "expected an integer"),
    ("null as int", {"app": {"max.in.flight": None}}, {}, "app.max.in.flight", "got null"),
    ("int as bool", {"metrics": {"enable": 1}}, {}, "metrics.enable", "true or false"),
    (
        "string as bool",
        {"errors.log.enable": "true"},
        {},
        "errors.log.enable",
        "true or false, got a string",
    ),
    (
        "quoted float",
        {"errors.retry.delay.jitter": "0.5"},
        {},
        "errors.retry.delay.jitter",
        "expected a number",
    ),
    (
        "bool as float",
        {"errors.retry.delay.multiplier": False},
        {},
        "errors.retry.delay.multiplier",
        "expected a number",
    ),
    ("int as string", {"app": {"url": 8080}}, {}, "app.url", "expected a string"),
    ("topics not a list", {"source": {"topics": "orders"}}, {}, "source.topics", "list"),
    ("topic not a string", {"source": {"topics": ["a", 5]}}, {}, "source.topics[1]", "string"),
    (
        "partial reference into int",
        {"app": {"timeout.ms": "1${X}"}},
        {"X": "0"},
        "app.timeout.ms",
        "expected an integer",
    ),
    (
        "env value not an int",
        {"app": {"timeout.ms": "${X}"}},
        {"X": "ten"},
        "app.timeout.ms",
        "from the environment, got 'ten'",
    ),
    (
        "env value not a bool",
        {"metrics": {"enable": "${X}"}},
        {"X": "yes"},
        "metrics.enable",
        "yes",
    ),
    # ranges
    ("batch 0", {"app": {"batch.max.records": 0}}, {}, "app.batch.max.records", "1..10000, got 0"),
    ("batch big", {"app": {"batch.max.records": 10001}}, {}, "app.batch.max.records", "1..10000"),
    ("linger", {"app": {"batch.linger.ms": -1}}, {}, "app.batch.linger.ms", "0..10000"),
    ("in flight", {"app": {"max.in.flight": 4097}}, {}, "app.max.in.flight", "1..4096"),
    ("timeout 0", {"app": {"timeout.ms": 0}}, {}, "app.timeout.ms", "1..3600000"),
    ("limit", {"share.delivery.count.limit": 101}, {}, "share.delivery.count.limit", "1..100"),
    (
        "lock",
        {"share.record.lock.duration.ms": 999},
        {},
        "share.record.lock.duration.ms",
        "1000..3600000",
    ),
    (
        "locks",
        {"share.partition.max.record.locks": 0},
        {},
        "share.partition.max.record.locks",
        "1..100000",
    ),
    ("journal dir", {"share.journal.path": "/var/lib/x/"}, {}, "share.journal.path", "a file"),
    ("journal type", {"share.journal.path": 7}, {}, "share.journal.path", "expected a string"),
    ("journal empty", {"share.journal.path": ""}, {}, "share.journal.path", "must not be empty"),
    ("jitter", {"errors.retry.delay.jitter": 1.5}, {}, "errors.retry.delay.jitter", "0.0..1.0"),
    (
        "multiplier",
        {"errors.retry.delay.multiplier": 0.5},
        {},
        "errors.retry.delay.multiplier",
        "1.0..100.0",
    ),
    ("metadata", {"offset.metadata.max.bytes": 127}, {}, "offset.metadata.max.bytes", "128.."),
    (
        "partitions",
        {"errors.deadletterqueue.topic.partitions": 0},
        {},
        "errors.deadletterqueue.topic.partitions",
        "1..100000 or -1",
    ),
    (
        "replication",
        {"errors.deadletterqueue.topic.replication.factor": -2},
        {},
        "errors.deadletterqueue.topic.replication.factor",
        "or -1",
    ),
    (
        "status code",
        {"app": {"status.mapping": {"600": "reject"}}},
        {},
        "app.status.mapping.600",
        "100..599",
    ),
    # enums
    ("engine", {"engine": "kafka"}, {}, "engine", "one of consumer, share, got 'kafka'"),
    ("ordering case", {"ordering": "KEY"}, {}, "ordering", "one of key, partition, none"),
    ("mode", {"app": {"mode": "stream"}}, {}, "app.mode", "single, batch"),
    ("tolerance", {"errors.tolerance": "some"}, {}, "errors.tolerance", "all, none"),
    ("level", {"logging": {"level": "warn"}}, {}, "logging.level", "warning"),
    ("format", {"logging": {"format": "xml"}}, {}, "logging.format", "auto, json, logfmt, text"),
    ("exporter", {"tracing": {"exporter": "jaeger"}}, {}, "tracing.exporter", "otlp-http"),
    (
        "status ack",
        {"app": {"status.mapping": {"409": "drop"}}},
        {},
        "app.status.mapping.409",
        "accept, release, reject",
    ),
    (
        "status key",
        {"app": {"status.mapping": {"abc": "reject"}}},
        {},
        "app.status.mapping.abc",
        "status code",
    ),
    # kafka keys the sidecar owns or that belong elsewhere
    (
        "auto commit",
        {"kafka": {"enable.auto.commit": True}},
        {},
        "kafka.enable.auto.commit",
        "commits offsets itself",
    ),
    (
        "offset store",
        {"kafka": {"enable.auto.offset.store": False}},
        {},
        "kafka.enable.auto.offset.store",
        "stores offsets itself",
    ),
    (
        "sidecar key in kafka",
        {"kafka": {"share.delivery.count.limit": 3}},
        {},
        "kafka.share.delivery.count.limit",
        "move it to the top level",
    ),
    # topics
    ("no topics listed", {"source": {"topics": []}}, {}, "source.topics", "at least one"),
    ("duplicate topic", {"source": {"topics": ["a", "a"]}}, {}, "source.topics[1]", "twice"),
    ("topic chars", {"source": {"topics": ["a", "b c"]}}, {}, "source.topics[1]", "ASCII"),
    ("topic dot", {"source": {"topics": ["."]}}, {}, "source.topics[0]", "'.' or '..'"),
    ("topic long", {"source": {"topics": [LONG_TOPIC]}}, {}, "source.topics[0]", "at most 249"),
    ("topic empty", {"source": {"topics": [""]}}, {}, "source.topics[0]", "must not be empty"),
    # app endpoint
    ("https", {"app": {"url": "https://127.0.0.1/r"}}, {}, "app.url", "https is not supported"),
    ("remote app", {"app": {"url": "http://10.0.0.5:80/r"}}, {}, "app.url", "loopback"),
    ("not http", {"app": {"url": "ftp://127.0.0.1/r"}}, {}, "app.url", "http://host:port/path"),
    ("bare path", {"app": {"url": "/records"}}, {}, "app.url", "http://host:port/path"),
    ("userinfo", {"app": {"url": "http://u:p@127.0.0.1/r"}}, {}, "app.url", "user information"),
    ("bad port", {"app": {"url": "http://127.0.0.1:99999/r"}}, {}, "app.url", "invalid port"),
    ("fragment", {"app": {"url": "http://127.0.0.1/r#x"}}, {}, "app.url", "fragment"),
    (
        "socket too long",
        {"app": {"unix_socket": "/" + "s" * 107}},
        {},
        "app.unix_socket",
        "at most 107 bytes",
    ),
    ("socket empty", {"app": {"unix_socket": ""}}, {}, "app.unix_socket", "must not be empty"),
    ("reserved header", {"app": {"headers": {"Host": "x"}}}, {}, "app.headers.Host", "sidecar"),
    ("header name", {"app": {"headers": {"a b": "x"}}}, {}, "app.headers.a b", "header name"),
    ("header value", {"app": {"headers": {"X-A": "a\nb"}}}, {}, "app.headers.X-A", "CR, LF"),
    ("header int", {"app": {"headers": {"X-A": 1}}}, {}, "app.headers.X-A", "expected a string"),
    # local API
    ("api public", {"api": {"listen": "0.0.0.0:8787"}}, {}, "api.listen", "observability.listen"),
    ("api allow", {"api": {"allow.non.loopback": True}}, {}, "api.allow.non.loopback", "unknown"),
    ("api port", {"api": {"listen": "127.0.0.1:70000"}}, {}, "api.listen", "0..65535"),
    ("api v6", {"api": {"listen": "::1:8787"}}, {}, "api.listen", "in brackets"),
    ("api no port", {"api": {"listen": "localhost"}}, {}, "api.listen", "host:port"),
    ("api unix", {"api": {"listen": "unix:"}}, {}, "api.listen", "must not be empty"),
    # cross-key rules
    (
        "timeout = lock",
        {"app": {"timeout.ms": 30000}},
        {},
        "app.timeout.ms",
        "less than share.record.lock.duration.ms (30000), got 30000",
    ),
    (
        "timeout > lock",
        {"app": {"timeout.ms": 2000}, "share.record.lock.duration.ms": 1000},
        {},
        "app.timeout.ms",
        "less than share.record.lock.duration.ms (1000)",
    ),
    (
        "connect backoff",
        {"app": {"connect.backoff.initial.ms": 500, "connect.backoff.max.ms": 100}},
        {},
        "app.connect.backoff.max.ms",
        "at least app.connect.backoff.initial.ms (500)",
    ),
    (
        "retry backoff",
        {"errors.retry.delay.initial.ms": 5000, "errors.retry.delay.max.ms": 10},
        {},
        "errors.retry.delay.max.ms",
        "at least errors.retry.delay.initial.ms (5000)",
    ),
    (
        "transactional share",
        {"engine": "share", "errors.deadletterqueue.transactional.enable": True},
        {},
        "errors.deadletterqueue.transactional.enable",
        "engine: consumer",
    ),
    # DLQ topic name (docs/dlq-records.md)
    (
        "dlq __",
        {
            "errors.deadletterqueue.topic.name": "__x",
            "errors.deadletterqueue.topic.name.prefix": "",
        },
        {},
        "errors.deadletterqueue.topic.name",
        "'__x' must not start with '__'",
    ),
    (
        "dlq __ with prefix",
        {"errors.deadletterqueue.topic.name": "__dlq.{topic}"},
        {},
        "errors.deadletterqueue.topic.name",
        "'__dlq.orders' (for source topic 'orders') must not start with '__'",
    ),
    (
        "dlq prefix",
        {"errors.deadletterqueue.topic.name": "failed.{topic}"},
        {},
        "errors.deadletterqueue.topic.name",
        "'failed.orders' (for source topic 'orders') must start with 'dlq.'",
    ),
    (
        "dlq custom prefix",
        {
            "errors.deadletterqueue.topic.name": "dlq.all",
            "errors.deadletterqueue.topic.name.prefix": "team-a.",
        },
        {},
        "errors.deadletterqueue.topic.name",
        "must start with 'team-a.'",
    ),
    (
        "dlq is source",
        {
            "errors.deadletterqueue.topic.name": "orders",
            "errors.deadletterqueue.topic.name.prefix": "",
        },
        {},
        "errors.deadletterqueue.topic.name",
        "'orders' is a source topic",
    ),
    (
        "dlq is another source",
        {"source": {"topics": ["orders", "dlq.orders"]}},
        {},
        "errors.deadletterqueue.topic.name",
        "'dlq.orders' (for source topic 'orders') is a source topic",
    ),
    (
        "dlq bad placeholder",
        {"errors.deadletterqueue.topic.name": "dlq.{Topic}"},
        {},
        "errors.deadletterqueue.topic.name",
        "only '{topic}' is substituted",
    ),
    (
        "dlq bad chars",
        {"errors.deadletterqueue.topic.name": "dlq.a b"},
        {},
        "errors.deadletterqueue.topic.name",
        "not a valid topic name",
    ),
    (
        "dlq too long",
        {"source": {"topics": ["t" * 247]}},
        {},
        "errors.deadletterqueue.topic.name",
        "at most 249",
    ),
    (
        "dlq null",
        {"errors.deadletterqueue.topic.name": None},
        {},
        "errors.deadletterqueue.topic.name",
        "expected a string",
    ),
    # environment
    (
        "missing env",
        {"kafka": {"sasl.password": "${KAFKA_PASSWORD}"}},
        {},
        "kafka.sasl.password",
        "KAFKA_PASSWORD is not set",
    ),
    (
        "missing env in list",
        {"source": {"topics": ["a", "${T2}"]}},
        {},
        "source.topics[1]",
        "T2 is not set",
    ),
    (
        "missing env for int",
        {"app": {"timeout.ms": "${T}"}},
        {},
        "app.timeout.ms",
        "T is not set",
    ),
    ("malformed env", {"app": {"url": "${1X}"}}, {}, "app.url", "malformed reference"),
    ("unterminated env", {"app": {"url": "http://${HOST"}}, {}, "app.url", "unterminated"),
]


@pytest.mark.parametrize(
    ("patch", "env", "path", "reason"),
    [case[1:] for case in BAD],
    ids=[case[0] for case in BAD],
)
def test_bad_config_names_the_key(
    tmp_path: Path, patch: dict[str, Any], env: dict[str, str], path: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_dict(tmp_path, patched(patch), env)
    error = info.value
    assert error.path == path
    assert reason in error.reason
    assert str(error) == f"{tmp_path / 'config.yaml'}: {path}: {error.reason}"


def test_parse_config_reports_the_same_errors_without_a_file() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(patched({"app": {"timeout.ms": 0}}), env={}, file="values.yaml")
    assert str(info.value) == "values.yaml: app.timeout.ms: must be an integer in 1..3600000, got 0"


# ---------------------------------------------------------------------------------------------
# Whole-file problems (YAML text)

RAW_BAD = [
    ("syntax", "kafka: {bootstrap.servers: x\nsource: [\n", "line 2, column 7", "invalid YAML"),
    ("bad indent", "kafka:\n  a: 1\n b: 2\n", "line 3, column 2", "invalid YAML"),
    ("tab", "kafka:\n\ta: 1\n", "line 2, column 1", "invalid YAML"),
    (
        "duplicate",
        "engine: share\nengine: consumer\n",
        "line 2, column 1",
        "duplicate key 'engine'",
    ),
    (
        "duplicate nested",
        "app:\n  url: http://127.0.0.1/a\n  url: http://127.0.0.1/b\n",
        "line 3, column 3",
        "duplicate key 'url'",
    ),
    ("unsafe tag", "engine: !!python/name:os.system\n", "line 1, column 9", "invalid YAML"),
    ("empty", "", "", "the configuration is empty"),
    ("comments only", "# nothing\n", "", "the configuration is empty"),
    ("list", "- a\n- b\n", "", "expected a mapping, got a list"),
    ("int key", "1: x\n", "1", "keys must be strings"),
]


@pytest.mark.parametrize(
    ("text", "path", "reason"), [case[1:] for case in RAW_BAD], ids=[c[0] for c in RAW_BAD]
)
def test_bad_yaml_text(tmp_path: Path, text: str, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert info.value.path == path
    assert reason in info.value.reason
    if path.startswith("line"):
        line, column = map(int, re.findall(r"\d+", path))
        assert (info.value.line, info.value.column) == (line, column)
        assert str(info.value).startswith(f"{tmp_path / 'config.yaml'}: {path}: invalid YAML: ")


def test_missing_file_and_bad_encoding(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file") as info:
        load_config(tmp_path / "absent.yaml", env={})
    assert info.value.path == ""
    assert str(info.value).startswith(f"{tmp_path / 'absent.yaml'}: cannot read the file: ")
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"engine: caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(bad, env={})


def test_yaml_scalars_follow_the_core_schema(tmp_path: Path) -> None:
    text = """
kafka:
  bootstrap.servers: 127.0.0.1:9092
  group.id: "g"
  sasl.password: 0123
  client.id: no
  client.rack: 1:30
  linger.ms: 5
  enable.idempotence: true
source: {topics: [orders]}
app: {url: "http://127.0.0.1:8080/records"}
"""
    config = load_config(write(tmp_path, text), env={})
    # YAML 1.1 would read these as 83, False and 90.
    assert config.kafka["sasl.password"] == "0123"
    assert config.kafka["client.id"] == "no"
    assert config.kafka["client.rack"] == "1:30"
    assert config.kafka["linger.ms"] == 5
    assert config.kafka["enable.idempotence"] is True


def test_empty_optional_section_means_defaults(tmp_path: Path) -> None:
    text = yaml.safe_dump(MINIMAL) + "api:\nlogging:\n"
    config = load_config(write(tmp_path, text), env={})
    assert config.api.listen == "127.0.0.1:8787"
    assert config.logging.level is LogLevel.INFO


# ---------------------------------------------------------------------------------------------
# Things that are accepted


def test_unix_socket_app_uses_only_the_url_path() -> None:
    config = parse_config(
        patched({"app": {"url": "/records?v=2", "unix_socket": "/run/app.sock"}}), env={}
    )
    assert config.app.unix_socket == "/run/app.sock"
    assert (config.app.host, config.app.port, config.app.path) == ("localhost", 80, "/records?v=2")
    # Over a Unix socket the host is only a Host header, so any name is fine.
    other = parse_config(
        patched({"app": {"url": "http://app/records", "unix_socket": "/run/app.sock"}}), env={}
    )
    assert (other.app.host, other.app.authority, other.app.path) == ("app", "app", "/records")


@pytest.mark.parametrize(
    ("url", "host", "port", "authority", "path"),
    [
        ("http://127.0.0.1:8080/records", "127.0.0.1", 8080, "127.0.0.1:8080", "/records"),
        ("http://localhost/", "localhost", 80, "localhost", "/"),
        ("http://LOCALHOST:9000", "localhost", 9000, "localhost:9000", "/"),
        ("http://[::1]:9000/a/b?x=1", "::1", 9000, "[::1]:9000", "/a/b?x=1"),
        ("http://127.1.2.3:80/r", "127.1.2.3", 80, "127.1.2.3", "/r"),
    ],
)
def test_app_url_parts(url: str, host: str, port: int, authority: str, path: str) -> None:
    app = AppConfig(url=url)
    assert (app.host, app.port, app.authority, app.path) == (host, port, authority, path)


def test_dlq_topic_for_substitutes_each_source_topic() -> None:
    config = parse_config(patched({"source": {"topics": ["orders", "payments"]}}), env={})
    assert config.dlq_topic_for("orders") == "dlq.orders"
    assert config.dlq_topic_for("payments") == "dlq.payments"
    shared = parse_config(patched({"errors.deadletterqueue.topic.name": "dlq.shared"}), env={})
    assert shared.dlq_topic_for("orders") == "dlq.shared"
    free = parse_config(
        patched(
            {
                "errors.deadletterqueue.topic.name": "{topic}-dead",
                "errors.deadletterqueue.topic.name.prefix": "",
            }
        ),
        env={},
    )
    assert free.dlq_topic_for("orders") == "orders-dead"
    assert DeadLetterQueueConfig(topic_name="").topic_for("orders") is None


def test_api_listen_forms() -> None:
    unix = parse_config(patched({"api": {"listen": "unix:/run/sidecar.sock"}}), env={})
    assert unix.api.address == ("unix", "/run/sidecar.sock")
    v6 = parse_config(patched({"api": {"listen": "[::1]:0"}}), env={})
    assert v6.api.address == ("tcp", "::1", 0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:8787", ("tcp", "127.0.0.1", 8787)),
        ("localhost:0", ("tcp", "localhost", 0)),
        ("[::1]:65535", ("tcp", "::1", 65535)),
        ("sidecar.local:80", ("tcp", "sidecar.local", 80)),
        ("unix:/tmp/a.sock", ("unix", "/tmp/a.sock")),
        ("unix:relative.sock", ("unix", "relative.sock")),
    ],
)
def test_parse_listen(value: str, expected: tuple[object, ...]) -> None:
    assert parse_listen(value) == expected


@pytest.mark.parametrize(
    "value",
    ["", "8787", ":8787", "host:", "host:x", "host:-1", "[::1]8787", "[nope]:1", "a b:1", "::1:80"],
)
def test_parse_listen_rejects(value: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(value)


def test_loopback_hosts() -> None:
    assert is_loopback_host("localhost")
    assert is_loopback_host("127.0.0.1")
    assert is_loopback_host("127.255.0.9")
    assert is_loopback_host("::1")
    assert not is_loopback_host("0.0.0.0")
    assert not is_loopback_host("10.0.0.1")
    assert not is_loopback_host("example.com")


def test_topic_name_rules() -> None:
    assert topic_name_error("orders.v1_x-y") is None
    assert topic_name_error("a" * 249) is None
    assert topic_name_error("a" * 250) is not None
    assert topic_name_error("..") is not None
    assert topic_name_error("ordérs") is not None
    assert topic_name_error("") is not None


# ---------------------------------------------------------------------------------------------
# Robustness: whatever the YAML holds, the only failure is a ConfigError naming a key

_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
_KEY_PATHS = [
    (name,) if not isinstance(value, dict) or name == "kafka" else (name, child)
    for name, value in dump_config(parse_config(MINIMAL, env={})).items()
    for child in (value if isinstance(value, dict) and name != "kafka" else [None])
]


@given(
    st.lists(st.tuples(st.sampled_from(_KEY_PATHS), _VALUES), max_size=4),
    st.dictionaries(st.sampled_from(["A", "B"]), st.text("ab1:{}", max_size=5), max_size=2),
)
@settings(max_examples=300, deadline=None)
def test_arbitrary_values_fail_only_with_config_error(
    edits: list[tuple[tuple[str, ...], Any]], env: dict[str, str]
) -> None:
    data = copy.deepcopy(MINIMAL)
    for key_path, value in edits:
        target = data
        for part in key_path[:-1]:
            target = target.setdefault(part, {})
        target[key_path[-1]] = value
    try:
        config = parse_config(data, env=env)
    except ConfigError as error:
        assert error.reason
        # The path names a key that is in the data (or a required one under it), or, for a
        # cross-key rule, the schema key whose default the edit made invalid.
        known = {".".join(part for part in key_path if part) for key_path in _KEY_PATHS}
        assert error.path in known or any(
            error.path == key or error.path.startswith((f"{key}.", f"{key}[")) for key in data
        ), error.path
    else:
        assert parse_config(dump_config(config, mask_secrets=False), env={}) == config


# ---------------------------------------------------------------------------------------------
# Inputs that ended in a traceback, or passed check-config and then failed at the first delivery

_HEAD = 'kafka: {bootstrap.servers: x, group.id: g}\nsource: {topics: [a]}\napp: {url: "http://127.0.0.1:1/"}\n'


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        ("commit.interval.ms: " + "9" * 5000 + "\n", "5000 digits"),
        ("kafka2: " + "-" + "1" * 4301 + "\n", "4301 digits"),
        ("app2:\n  ? " + "5" * 5000 + "\n  : accept\n", "5000 digits"),
        ("x: " + "[" * 5000 + "\n", "nested"),
        ("x: " + "{a: " * 3000 + "\n", "nested"),
        ("x:\n" + "".join("  " * i + "- \n" for i in range(1, 400)), "nested"),
        ("x: !!float abc\n", "!!float"),
        ("x: !!float \n", "!!float"),  # empty: PyYAML itself raised IndexError
        ("x: !!int abc\n", "!!int"),
        ("x: !!int 0x10\n", "!!int"),
        ("x: !!bool maybe\n", "!!bool"),
        ("x: !!timestamp x\n", "timestamp"),
        ("x: !!timestamp 2001-01-01\n", "timestamp"),
        ("x: !!binary aGk=\n", "binary"),
        ("x: !!set {a: null}\n", "set"),
        ("x: !!set [1]\n", "set"),
        ("x: !!omap [1]\n", "omap"),
        ("x: !!map x\n", "mapping"),
        ("x: !!seq x\n", "sequence"),
    ],
)
def test_yaml_that_crashed_the_loader_is_a_config_error(
    tmp_path: Path, tail: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, _HEAD + tail), env={})
    assert info.value.path.startswith("line "), info.value
    assert reason in info.value.reason
    assert info.value.line is not None and info.value.line >= 4


def test_an_integer_just_below_the_limit_still_reaches_the_range_check(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, _HEAD + "commit.interval.ms: " + "9" * 4300 + "\n"), env={})
    assert info.value.path == "commit.interval.ms"
    assert "more than 20 digits" in info.value.reason
    assert len(str(info.value)) < 300


@pytest.mark.parametrize(
    ("patch", "env", "path"),
    [
        ({"commit.interval.ms": "${N}"}, {"N": "9" * 5000}, "commit.interval.ms"),
        (
            {"app": {"status.mapping": {"5" * 5000: "accept"}}},
            {},
            "app.status.mapping." + "5" * 5000,
        ),
        ({"commit.interval.ms": 10**5000}, {}, "commit.interval.ms"),
        ({"errors.retry.delay.jitter": 10**5000}, {}, "errors.retry.delay.jitter"),
        ({"kafka": {"linger.ms": 10**5000}}, {}, "kafka.linger.ms"),
    ],
    ids=["env", "status-key", "int", "float", "kafka"],
)
def test_huge_integers_from_anywhere_are_config_errors(
    patch: dict[str, Any], env: dict[str, str], path: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(patched(patch), env=env)
    assert info.value.path == path
    assert len(info.value.reason) < 200


@pytest.mark.parametrize(
    ("patch", "env", "path"),
    [
        ({"kafka": {"group.id": "g\ud800"}}, {}, "kafka.group.id"),
        ({"kafka": {"client.id": "${X}"}}, {"X": "a\udc80"}, "kafka.client.id"),
        ({"kafka": {"x\ud800": "1"}}, {}, "kafka.x\ud800"),
        ({"tracing": {"service.name": "s\udfff"}}, {}, "tracing.service.name"),
        ({"errors.deadletterqueue.topic.name.prefix": "\ud800"}, {}, _DLQ_PREFIX_KEY),
    ],
    ids=["kafka-value", "env", "kafka-name", "section", "top"],
)
def test_text_without_a_utf8_encoding_is_a_config_error(
    patch: dict[str, Any], env: dict[str, str], path: str
) -> None:
    # YAML's "\ud800" escape and a non-UTF-8 environment variable both give a lone surrogate.
    with pytest.raises(ConfigError) as info:
        parse_config(patched(patch), env=env)
    assert info.value.path == path
    assert "UTF-8" in info.value.reason
    str(info.value).encode("utf-8", "backslashreplace")


def test_a_lone_surrogate_escape_in_the_yaml_file_is_a_config_error(tmp_path: Path) -> None:
    text = _HEAD.replace("group.id: g", 'group.id: "g\\ud800"')
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert info.value.path == "kafka.group.id"


@pytest.mark.parametrize(
    "value", ["caf\u00e9", "a\tb", "a\rb", "a\nb", "a\x00b", "a\x7fb", "a\x1bb", "\u2028", "\ud800"]
)
def test_app_header_values_must_be_visible_ascii(value: str) -> None:
    # Before: only CR, LF and NUL were refused here; the rest failed at the first delivery with
    # an uncaught WireError from the request formatter.
    with pytest.raises(ConfigError) as info:
        parse_config(patched({"app": {"headers": {"X-A": value}}}), env={})
    assert info.value.path == "app.headers.X-A"
    assert value not in str(info.value)  # a header value may be a secret: never echoed


def test_app_header_values_from_the_environment_are_checked_too() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(patched({"app": {"headers": {"X-A": "${V}"}}}), env={"V": "a\tb"})
    assert info.value.path == "app.headers.X-A"


@pytest.mark.parametrize("name", ["X(A)", "X@A", "X\u00e9", 'X"A', "X/A", "X A", "X:A", ""])
def test_app_header_names_must_be_tokens(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(patched({"app": {"headers": {name: "v"}}}), env={})
    assert info.value.path == f"app.headers.{name}"


def test_accepted_app_headers_are_what_the_wire_sends() -> None:
    config = parse_config(
        patched({"app": {"headers": {"X-A": "visible ascii !~ ok", "X-B": "", "x_c.d~": "1"}}}),
        env={},
    )
    format_single_request(
        make_record(), config.app.authority, config.app.path, config.app.headers.items()
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:1/a b",
        "http://127.0.0.1:1/a\tb",
        "http://127.0.0.1:1/a\nb",
        "http://127.0.0.1:1/\u00e4",
        "http://127.0.0.1:1/r?q=\u00e4",
        "http://127.0.0.1:1/a%zz",
        "http://127.0.0.1:1/a%2",
        'http://127.0.0.1:1/a"b',
        "http://127.0.0.1:1/a<b>",
        "http://127.0.0.1:1/a\\b",
        "http://127.0.0.1:1/a{b}",
        "http://127.0.0.1:1/a|b",
        "http://127.0.0.1:1/a^b",
        "http://127.0.0.1:1/a`b",
        "http://127.0.0.1:1/a\x7f",
        " http://127.0.0.1:1/a",
    ],
)
def test_app_url_with_characters_invalid_in_a_request_target_is_refused(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(patched({"app": {"url": url}}), env={})
    assert info.value.path == "app.url"
    assert "request target" in info.value.reason or "visible ASCII" in info.value.reason


@pytest.mark.parametrize("path", ["/a b", "/r?x=\u00e4", "/a%zz", "/a\tb", "/a|b"])
def test_unix_socket_url_path_is_checked_the_same_way(path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(patched({"app": {"url": path, "unix_socket": "/run/app.sock"}}), env={})
    assert info.value.path == "app.url"


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:1/a%20b",
        "http://127.0.0.1:1/r?x=1&y=%C3%A4",
        "http://localhost:1/a:b@c!$&'()*+,;=-._~/",
        "http://127.0.0.1:1/r?a/b?c",
        "http://127.0.0.1:1?x",
    ],
)
def test_valid_request_targets_are_accepted_and_sendable(url: str) -> None:
    config = parse_config(patched({"app": {"url": url}}), env={})
    ParsedRequest(format_single_request(make_record(), config.app.authority, config.app.path))


# ---------------------------------------------------------------------------------------------
# Secret masking goes by the name


def test_masking_covers_oauthbearer_lists_and_url_userinfo() -> None:
    config = parse_config(
        patched(
            {
                "kafka": {
                    "sasl.oauthbearer.config": "principal=alice secret=s1",
                    "sasl.oauthbearer.extensions": "traceId=1,logicalCluster=lkc-s2",
                    "sasl.oauthbearer.token.endpoint.url": "https://client:s3@idp.example/token",
                    "sasl.oauthbearer.method": "oidc",
                    "sasl.oauthbearer.client.id": "client",
                    "sasl.oauthbearer.scope": "kafka",
                    "ssl.keystore.password": "s4",
                    "ssl.key.pem": "s5",
                    "sasl.kerberos.keytab": "/etc/s6.keytab",
                    "session.timeout.ms": 45000,
                    "socket.keepalive.enable": True,
                    "client.id": "c",
                }
            }
        ),
        env={},
    )
    kafka = dump_config(config)["kafka"]
    assert kafka["sasl.oauthbearer.config"] == "***"
    assert kafka["sasl.oauthbearer.extensions"] == "***"
    # Names librdkafka refuses (a config with them does not load) are still masked by their words.
    assert is_secret_kafka_property("Sasl.OAuthBearer.Config")
    assert is_secret_kafka_property("plugin.apikey")
    assert kafka["sasl.oauthbearer.token.endpoint.url"] == "https://***@idp.example/token"
    for name in ("ssl.keystore.password", "ssl.key.pem", "sasl.kerberos.keytab"):
        assert kafka[name] == "***", name
    # Not secrets: still shown, so the effective configuration can be debugged.
    assert kafka["sasl.oauthbearer.method"] == "oidc"
    assert kafka["sasl.oauthbearer.client.id"] == "client"
    assert kafka["sasl.oauthbearer.scope"] == "kafka"
    assert kafka["session.timeout.ms"] == 45000
    assert kafka["socket.keepalive.enable"] is True
    assert kafka["client.id"] == "c"
    shown = repr(dump_config(config))
    for secret in ("s1", "lkc-s2", "s3", "s4", "s5", "s6", "s7", "s8"):
        assert secret not in shown, secret


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("https://user:pass@idp/t", "https://***@idp/t"),
        ("https://user@idp/t", "https://***@idp/t"),
        ("https://user:p@ss@idp/t", "https://***@idp/t"),
        ("https://idp/t", "https://idp/t"),
        ("https://idp/a@b?c=d@e", "https://idp/a@b?c=d@e"),
    ],
)
def test_url_userinfo_is_masked_and_nothing_else(url: str, masked: str) -> None:
    config = parse_config(patched({"kafka": {"sasl.oauthbearer.token.endpoint.url": url}}), env={})
    assert dump_config(config)["kafka"]["sasl.oauthbearer.token.endpoint.url"] == masked
    assert config.kafka["sasl.oauthbearer.token.endpoint.url"] == url


@pytest.mark.parametrize(
    "name",
    [
        "X-Auth",
        "X-Credentials",
        "X-Signature",
        "x-hub-signature-256",
        "Proxy-Authorization",
        "X-MyToken",
        "X-Amz-Security-Token",
        "Cookie",
        "X-Session-Id",
        "X-CSRF",
        "X-Password",
        "X-Jwt",
        "X-Private",
        "X-API-KEY",
    ],
)
def test_credential_like_app_headers_are_masked(name: str) -> None:
    config = parse_config(
        patched({"app": {"headers": {name: "hunter2", "X-Tenant": "acme"}}}), env={}
    )
    headers = dump_config(config)["app"]["headers"]
    assert headers == {name: "***", "X-Tenant": "acme"}
    assert config.app.headers[name] == "hunter2"


@pytest.mark.parametrize(
    ("value", "hint"),
    [
        ("100", "; write numbers without quotes"),
        (" 2.5 ", "; write numbers without quotes"),
        ("5s", "; the unit is in the key's name: write 5000 (milliseconds)"),
        ("2m", "; the unit is in the key's name: write 120000 (milliseconds)"),
        ("five", ""),
    ],
)
def test_a_string_where_a_number_goes_gets_advice_that_fits_it(
    tmp_path: Path, value: str, hint: str
) -> None:
    """ "write numbers without quotes" only for a quoted number: `five` had no quotes to drop, and
    `5s` wants the milliseconds its key names."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(patched({"app": {"timeout.ms": value}})), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    message = str(caught.value)
    assert message.endswith(f"expected an integer, got a string ({value!r}){hint}"), message


def test_source_intake_is_the_queue_signal_unless_the_poll_thread_is_asked_for() -> None:
    from sidecar.config import SourceIntake

    assert parse_config(patched({}), env={}).source.intake is SourceIntake.SIGNAL
    asked = parse_config(patched({"source": {"topics": ["orders"], "intake": "thread"}}), env={})
    assert asked.source.intake is SourceIntake.THREAD
    with pytest.raises(ConfigError) as info:
        parse_config(patched({"source": {"topics": ["orders"], "intake": "fd"}}), env={})
    assert info.value.path == "source.intake"
