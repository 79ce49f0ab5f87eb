"""The CloudEvents keys: app.format, app.cloudevents.source and app.cloudevents.type."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.config import AppFormat, ConfigError, dump_config, parse_config


def config(bootstrap: str = "broker-0:9092,broker-1:9092", **app: Any) -> dict[str, Any]:
    return {
        "kafka": {"bootstrap.servers": bootstrap, "group.id": "g"},
        "source": {"topics": ["orders", "payments"]},
        "app": {"url": "http://127.0.0.1:8080/events", **app},
    }


def test_defaults_keep_the_raw_format() -> None:
    parsed = parse_config(config())
    assert parsed.app.format is AppFormat.RAW
    assert parsed.app.cloudevents_source == "kafka://{cluster}/{topic}"
    assert parsed.app.cloudevents_type == "dlq-sidecar.kafka.record"


@pytest.mark.parametrize(
    ("bootstrap", "source"),
    [
        ("broker-0:9092,broker-1:9092", "kafka://broker-0:9092/{topic}"),
        ("SASL_SSL://b.example:9093", "kafka://b.example:9093/{topic}"),
        (" [::1]:9092 ", "kafka://[::1]:9092/{topic}"),
    ],
)
def test_the_default_source_names_the_cluster(bootstrap: str, source: str) -> None:
    parsed = parse_config(config(bootstrap, format="cloudevents"))
    assert parsed.app.format is AppFormat.CLOUDEVENTS
    assert parsed.cloudevents_source == source


def test_source_and_type_are_configurable() -> None:
    parsed = parse_config(
        config(
            format="cloudevents",
            **{"cloudevents.source": "/shop/{topic}", "cloudevents.type": "com.shop.{topic}"},
        )
    )
    assert parsed.cloudevents_source == "/shop/{topic}"
    assert parsed.app.cloudevents_type == "com.shop.{topic}"
    assert dump_config(parsed)["app"]["format"] == "cloudevents"
    assert parse_config(dump_config(parsed, mask_secrets=False)) == parsed


@pytest.mark.parametrize(
    ("app", "path", "reason"),
    [
        ({"format": "json"}, "app.format", "must be one of raw, cloudevents"),
        ({"format": True}, "app.format", "expected a string"),
        (
            {"format": "cloudevents", "cloudevents.source": "/a b/{topic}"},
            "app.cloudevents.source",
            "is not a URI-reference",
        ),
        (
            {"format": "cloudevents", "cloudevents.source": "/{stream}"},
            "app.cloudevents.source",
            "only '{cluster}' and '{topic}' are substituted",
        ),
        ({"cloudevents.source": ""}, "app.cloudevents.source", "must not be empty"),
        ({"cloudevents.type": ""}, "app.cloudevents.type", "must not be empty"),
        ({"cloudevents.type": "a\tb"}, "app.cloudevents.type", "no control characters"),
        ({"cloudevents.typo": "x"}, "app.cloudevents.typo", ""),
        (
            {"format": "cloudevents", "headers": {"CE-Source": "/x"}},
            "app.headers.CE-Source",
            "the ce-* headers are the event's attributes",
        ),
    ],
)
def test_bad_values_name_the_key(app: dict[str, Any], path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(config(**app))
    assert f"{path}: " in str(caught.value)
    assert reason in str(caught.value)


def test_the_source_is_only_checked_when_it_is_used() -> None:
    # Raw format: the source is unused and a ce-* header is just a header, not an error.
    parse_config(config(**{"cloudevents.source": "/a b", "headers": {"ce-x": "1"}}))
