"""`dlq inspect` / `dlq replay` on a dead-letter topic written by Spring Kafka's DeadLetterPublishingRecoverer.

One program runs for the module: tests/dlqwriters/java/dlqwriters/SpringDlqApp.java, compiled with javac
against spring-kafka 4.1.2 (fetched by `make tools`): a KafkaMessageListenerContainer whose listener fails
on any value that is not `n:INTEGER`, a DefaultErrorHandler without retries and Spring's own
DeadLetterPublishingRecoverer, which writes TOPIC-dlt with `kafka_dlt-*` headers: partition a 4-byte
big-endian int, offset and timestamp 8-byte longs. The records are inspected and replayed to the source
topic, where the running listener fails on them again and Spring copies the replay markers, so the loop
guard refuses a second pass.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sidecar.ops.dlq.formats import SP_OFFSET, SP_PARTITION, SP_TIMESTAMP
from tests.dlqwriters import java_process, log_says, wait_for
from tests.dlqwriters.tool import (
    SEQ,
    assert_restored,
    end_offsets,
    header_text,
    inspect_json,
    records_after,
    run_dlq,
    seq_of,
)
from tests.kafkatools import Broker, Rec

PARTITIONS = 2
LISTENER_FAILED = "org.springframework.kafka.listener.ListenerExecutionFailedException"


def _originals() -> list[Rec]:
    out = []
    for i in range(20):
        value = f"n:{i}".encode() if i % 2 == 0 else f"oops {i}".encode()
        out.append(
            Rec(
                key=None if i % 7 == 3 else f"k{i}".encode(),
                value=value,
                headers=(
                    (SEQ, str(i).encode()),
                    ("bin", b"\xff\x00"),
                    ("rep", b"a"),
                    ("rep", b"b"),
                ),
                partition=(i // 2) % PARTITIONS,
            )
        )
    return out


FAILING = 10


@dataclass
class SpringDlt:
    source: str
    dlt: str
    group: str
    originals: dict[int, Rec]


@pytest.fixture(scope="module")
def spring_dlt(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpringDlt]:
    tag = uuid.uuid4().hex[:8]
    source = broker.create_topic(f"spring-src-{tag}", partitions=PARTITIONS)
    dlt = broker.create_topic(
        f"{source}-dlt", partitions=PARTITIONS
    )  # Spring's default destination
    group = f"spring-group-{tag}"
    originals = _originals()
    broker.produce(source, originals)
    by_seq = {seq_of(r.headers): r for r in broker.read_topic(source, len(originals))}
    work = tmp_path_factory.mktemp("spring")
    log = work / "spring.log"
    with java_process(
        "spring",
        "dlqwriters.SpringDlqApp",
        [broker.bootstrap, group, source],
        log,
        ready=log_says(log, "SPRING RUNNING"),
    ) as proc:
        wait_for(
            lambda: broker.count_records(dlt) >= FAILING,
            90,
            f"{FAILING} records in Spring's dead-letter topic",
            proc,
            log,
        )
        yield SpringDlt(source, dlt, group, by_seq)


def test_inspect_decodes_springs_binary_headers(broker: Broker, spring_dlt: SpringDlt) -> None:
    s = spring_dlt
    rows = inspect_json(broker, s.dlt)
    assert len(rows) == FAILING
    for row in rows:
        orig = s.originals[int(header_text(row, SEQ) or "-1")]
        raw = {h["name"]: h["value"] for h in row["headers"]}
        # The binary encodings, as the writer wrote them.
        assert raw[SP_PARTITION]["size"] == 4 and raw[SP_OFFSET]["size"] == 8
        assert raw[SP_TIMESTAMP]["size"] == 8
        assert row["format"] == "spring"
        assert (row["source_topic"], row["source_partition"], row["source_offset"]) == (
            s.source,
            orig.partition,
            orig.offset,
        )
        assert row["group"] == s.group
        assert row["exception_class"] == LISTENER_FAILED
        assert row["cause_class"] == "java.lang.IllegalArgumentException"
        assert "not n:INTEGER" in row["exception_message"]
        assert orig.timestamp_ms is not None
        assert row["source_timestamp_ms"] == orig.timestamp_ms
        assert row["headers_only"] is False
    # --exception-class matches the root cause too; --format selects the writer.
    assert len(inspect_json(broker, s.dlt, "--exception-class", LISTENER_FAILED)) == FAILING
    by_cause = inspect_json(
        broker,
        s.dlt,
        "--exception-class",
        "java.lang.IllegalArgumentException",
        "--format",
        "spring",
    )
    assert len(by_cause) == FAILING
    assert inspect_json(broker, s.dlt, "--format", "dlq") == []
    rc, out, _err = run_dlq(broker, "inspect", "--topic", s.dlt)
    assert rc == 0 and "Spring Kafka DeadLetterPublishingRecoverer" in out


def test_replay_restores_the_originals_and_springs_second_failure_is_not_replayed(
    broker: Broker, spring_dlt: SpringDlt
) -> None:
    s = spring_dlt
    name = f"fix-{uuid.uuid4().hex[:6]}"
    before = end_offsets(broker, s.source, PARTITIONS)
    rc, out, err = run_dlq(broker, "replay", "--from", s.dlt, "--name", name, "--dry-run")
    assert rc == 0 and out.count(f"would replay {s.dlt}/") == FAILING, out + err
    assert end_offsets(broker, s.source, PARTITIONS) == before

    rc, out, err = run_dlq(broker, "replay", "--from", s.dlt, "--name", name, "--rate", "50")
    assert rc == 0, out + err
    assert f"replayed to {s.source}: {FAILING}" in out
    replayed = records_after(broker, s.source, before, FAILING)
    assert len(replayed) == FAILING
    assert_restored(replayed, s.originals, name, s.dlt)

    wait_for(
        lambda: broker.count_records(s.dlt) >= 2 * FAILING,
        60,
        "the replayed records back in Spring's dead-letter topic",
    )
    again = [r for r in inspect_json(broker, s.dlt) if r["replay_count"] == 1]
    assert len(again) == FAILING
    # Spring's headers describe the new failure: the replayed record's own topic and offset.
    assert {r["source_offset"] for r in again} == {rec.offset for rec in replayed}

    rc, out, err = run_dlq(broker, "replay", "--from", s.dlt, "--name", name)
    assert rc == 0, out + err
    assert f"replayed 1 times already (--max-replays 1): {FAILING}" in out
    assert end_offsets(broker, s.source, PARTITIONS) == {
        p: before[p] + FAILING // PARTITIONS for p in range(PARTITIONS)
    }
