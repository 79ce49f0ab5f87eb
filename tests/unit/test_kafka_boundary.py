"""One Kafka boundary: confluent-kafka only under sidecar.kafka, through its public modules, and
librdkafka's errors translated by one function (sidecar.kafka.errors)."""

from __future__ import annotations

import ast
import pathlib

from confluent_kafka import KafkaError, KafkaException

from sidecar.core.errors import KafkaClientError
from sidecar.kafka.errors import KafkaCallError, error_text, kafka_error, translate
from sidecar.kafka.share.errors import ShareGroupsUnavailable, share_error
from sidecar.kafka.source import SourceError

PACKAGE = pathlib.Path(__file__).parents[2] / "sidecar"


def _imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


def test_confluent_kafka_is_imported_under_sidecar_kafka_only_and_by_public_names() -> None:
    outside: list[str] = []
    private: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for module in _imports(path):
            if module != "confluent_kafka" and not module.startswith("confluent_kafka."):
                continue
            if not rel.startswith("sidecar/kafka/"):
                outside.append(f"{rel}: {module}")
            # A private module (admin._config, admin._listoffsets, cimpl) may move in any release;
            # confluent_kafka.admin re-exports what the adapters need.
            if any(part.startswith("_") or part == "cimpl" for part in module.split(".")[1:]):
                private.append(f"{rel}: {module}")
    assert outside == []
    assert private == []


def test_the_public_names_the_adapters_use_exist_in_the_pinned_client() -> None:
    from confluent_kafka import admin

    for name in ("AdminClient", "ConfigResource", "NewTopic", "OffsetSpec"):
        assert hasattr(admin, name), name


def test_translate_keeps_librdkafka_s_text_and_the_what() -> None:
    exc = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))
    error = translate("cannot read dlq", exc, KafkaCallError)
    assert isinstance(error, KafkaClientError)
    assert str(error) == "cannot read dlq: broker down"
    assert error_text(exc, named=True) == "_TRANSPORT: broker down"
    assert kafka_error(exc).code() == KafkaError._TRANSPORT


def test_an_exception_without_a_kafka_error_keeps_its_own_text() -> None:
    exc = KafkaException("odd")
    assert error_text(exc) == "odd"
    assert kafka_error(exc).code() == KafkaError._FAIL
    assert str(translate("x", exc, KafkaCallError)) == "x: odd"


def test_the_share_translation_goes_through_the_same_translator() -> None:
    refused = share_error(KafkaException(KafkaError(KafkaError.GROUP_ID_NOT_FOUND, "no")), "g")
    assert isinstance(refused, ShareGroupsUnavailable)
    other = share_error(KafkaException(KafkaError(KafkaError._TRANSPORT, "down")), "g")
    assert type(other) is SourceError
    assert str(other) == "share consumer error: _TRANSPORT: down"
