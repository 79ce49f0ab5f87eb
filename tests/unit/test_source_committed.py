"""Reading the committed offsets at assignment: retried while the coordinator cannot answer, and a
partition whose offset is unknown is never taken for one with no committed offset."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from sidecar.kafka.source import KafkaSource


class FakeConsumer:
    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.calls = 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.calls += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]


@dataclass
class Tp:
    """A TopicPartition as committed() returns it (its error is settable here)."""

    offset: int
    error: KafkaError | None = None
    topic: str = "t"
    partition: int = 0
    metadata: str = "m"


def test_a_partition_level_error_is_retried_not_taken_for_no_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sidecar.kafka.source.time.sleep", lambda _s: None)
    consumer = FakeConsumer(
        [
            [Tp(-1001, KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT))],
            KafkaException(KafkaError(KafkaError.NOT_COORDINATOR)),
            [Tp(42)],
        ]
    )
    result = KafkaSource._read_committed(consumer, [TopicPartition("t", 0)])  # type: ignore[arg-type]
    assert [(tp.offset, tp.metadata) for tp in result] == [(42, "m")]
    assert consumer.calls == 3


def test_a_non_retriable_error_is_raised_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sidecar.kafka.source.time.sleep", lambda _s: None)
    consumer = FakeConsumer([KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))])
    with pytest.raises(KafkaException):
        KafkaSource._read_committed(consumer, [TopicPartition("t", 0)])  # type: ignore[arg-type]
    assert consumer.calls == 1


def test_retries_stop_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr("sidecar.kafka.source.time.monotonic", lambda: clock[0])

    def sleep(s: float) -> None:
        clock[0] += 5.0

    monkeypatch.setattr("sidecar.kafka.source.time.sleep", sleep)
    consumer = FakeConsumer([KafkaException(KafkaError(KafkaError._TIMED_OUT))] * 20)
    with pytest.raises(KafkaException):
        KafkaSource._read_committed(consumer, [TopicPartition("t", 0)])  # type: ignore[arg-type]
    assert 2 <= consumer.calls <= 7
