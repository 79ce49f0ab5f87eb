"""What `check-config` says of a valid config: every source topic's DLQ and retry tiers, the routes
and the circuit breaker (it used to leave tiers and routes out)."""

from __future__ import annotations

from pathlib import Path

import yaml

from sidecar.cli import config_summary
from sidecar.config import load_config

CONFIG = {
    "kafka": {"bootstrap.servers": "127.0.0.1:9092", "group.id": "orders-app"},
    "source": {"topics": ["orders", "payments"]},
    "app": {"url": "http://127.0.0.1:8080/records"},
    "errors.retry.tiers": ["1m", "10m"],
    "errors.deadletterqueue.routes": [
        {"exception.class": "com.acme.SchemaError", "topic.name": "dlq.{topic}.schema"},
        {"reason": "delivery_count_exceeded", "topic.name": "dlq.{topic}.exhausted"},
    ],
}


def test_the_summary_names_tiers_routes_and_the_breaker(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(CONFIG), encoding="utf-8")
    text = config_summary(load_config(path, {}))
    assert "orders -> DLQ dlq.orders;" in text
    assert "retry tiers dlq.payments.retry.1m, dlq.payments.retry.10m" in text
    assert "route: exception.class com.acme.SchemaError -> dlq.{topic}.schema" in text
    assert "route: reason delivery_count_exceeded -> dlq.{topic}.exhausted" in text
    assert "circuit breaker: on" in text
    off = {**CONFIG, "errors.deadletterqueue.circuit.breaker.enable": False}
    path.write_text(yaml.safe_dump(off), encoding="utf-8")
    assert "circuit breaker: off" in config_summary(load_config(path, {}))
