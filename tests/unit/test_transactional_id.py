"""The default transactional.id of the transactional DLQ mode: stable per instance, unique per sidecar."""

from __future__ import annotations

from typing import Any

from sidecar.config import parse_config
from sidecar.kafka.dlq import default_transactional_id


def _config(kafka: dict[str, Any] | None = None, listen: str = "127.0.0.1:8787") -> Any:
    return parse_config(
        {
            "kafka": {"bootstrap.servers": "b:9092", "group.id": "orders", **(kafka or {})},
            "source": {"topics": ["src"]},
            "app": {"url": "http://127.0.0.1:8080/"},
            "api": {"listen": listen},
            "errors.deadletterqueue.topic.name": "dlq.src",
            "errors.deadletterqueue.transactional.enable": True,
        },
        env={},
    )


def test_two_sidecars_on_one_host_get_different_ids_and_each_keeps_its_own() -> None:
    a = default_transactional_id(_config(listen="127.0.0.1:8787"))
    b = default_transactional_id(_config(listen="127.0.0.1:8788"))
    assert a != b
    assert a == default_transactional_id(_config(listen="127.0.0.1:8787"))  # stable across restarts
    assert a.startswith("dlq-sidecar.orders.")


def test_static_membership_and_an_explicit_id_name_the_instance() -> None:
    assert (
        default_transactional_id(_config({"group.instance.id": "pod-3"}))
        == "dlq-sidecar.orders.pod-3"
    )
    assert default_transactional_id(_config({"transactional.id": "mine"})) == "mine"


def test_the_pipeline_builds_the_dlq_writer_with_its_transactional_id() -> None:
    """The writer is built transactional (nothing sets its id later); the share engine's is plain."""
    from sidecar.engines.dlq_step import dlq_writer_for

    config = _config({"transactional.id": "mine"})
    assert dlq_writer_for(config).transactional_id == "mine"
    plain = parse_config(
        {
            "kafka": {"bootstrap.servers": "b:9092", "group.id": "orders"},
            "source": {"topics": ["src"]},
            "app": {"url": "http://127.0.0.1:8080/"},
            "errors.deadletterqueue.topic.name": "dlq.src",
        },
        env={},
    )
    assert dlq_writer_for(plain).transactional_id is None
