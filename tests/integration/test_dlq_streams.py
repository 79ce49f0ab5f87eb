"""`dlq inspect` / `dlq replay` on the DLQ of a real Kafka Streams application (KIP-1034, Kafka 4.4.0).

One application runs for the module: tests/dlqwriters/java/dlqwriters/StreamsDlqApp.java, compiled with
javac against the kafka-streams artifact (fetched by `make tools`), with
`errors.dead.letter.queue.topic.name` and Kafka's own handlers: a value that is not a 4-byte Integer fails
to deserialize (LogAndContinueExceptionHandler), a negative one fails in the processor
(LogAndContinueProcessingExceptionHandler), and a 0 arms a punctuator that fails once, which gives a DLQ
record with no source (null topic, partition and offset -1, no key or value). The DLQ records are
inspected and replayed to the source topic, where the running application dead-letters them again with
the replay markers copied, so the loop guard refuses a second pass.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sidecar.ops.dlq.entries import encode_bytes
from sidecar.ops.dlq.formats import S_EXCEPTION, S_MESSAGE, S_OFFSET, S_PARTITION, S_TOPIC
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
PUNCTUATOR = "java.lang.IllegalStateException"


def _originals() -> list[Rec]:
    out = []
    for i in range(1, 25):
        kind = ("good", "notint", "negative")[i % 3]
        value = {
            "good": struct.pack(">i", i),
            "notint": f"not an int {i}".encode(),
            "negative": struct.pack(">i", -i),
        }[kind]
        out.append(
            Rec(
                key=None if i % 7 == 4 else f"k{i}".encode(),
                value=value,
                headers=(
                    (SEQ, str(i).encode()),
                    ("bin", b"\xff\x00"),
                    ("rep", b"a"),
                    ("rep", b"b"),
                ),
                partition=i % PARTITIONS,
            )
        )
    # A 0 arms the punctuator (and passes): its failure is a DLQ record with no input record behind it.
    out.append(Rec(key=b"zero", value=struct.pack(">i", 0), headers=((SEQ, b"0"),), partition=0))
    return out


FAILING = 16  # 8 that do not deserialize, 8 negative
EXPECTED_DLQ = FAILING + 1  # and the punctuator's


@dataclass
class StreamsDlq:
    source: str
    output: str
    dlq: str
    originals: dict[int, Rec]


@pytest.fixture(scope="module")
def streams_dlq(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StreamsDlq]:
    tag = uuid.uuid4().hex[:8]
    source = broker.create_topic(f"streams-src-{tag}", partitions=PARTITIONS)
    output = broker.create_topic(f"streams-out-{tag}", partitions=PARTITIONS)
    dlq = broker.create_topic(f"dlq.streams-{tag}", partitions=PARTITIONS)  # Streams creates none
    originals = _originals()
    broker.produce(source, originals)
    by_seq = {seq_of(r.headers): r for r in broker.read_topic(source, len(originals))}
    work = tmp_path_factory.mktemp("streams")
    log = work / "streams.log"
    with java_process(
        "streams",
        "dlqwriters.StreamsDlqApp",
        [broker.bootstrap, f"dlq-streams-app-{tag}", source, output, dlq, str(work / "state")],
        log,
        ready=log_says(log, "STREAMS RUNNING"),
    ) as proc:
        wait_for(
            lambda: broker.count_records(dlq) >= EXPECTED_DLQ,
            90,
            f"{EXPECTED_DLQ} records in the Streams DLQ",
            proc,
            log,
        )
        yield StreamsDlq(source, output, dlq, by_seq)


def test_inspect_decodes_the_streams_dlq_and_names_the_punctuators_record(
    broker: Broker, streams_dlq: StreamsDlq
) -> None:
    s = streams_dlq
    rows = inspect_json(broker, s.dlq)
    assert len(rows) == EXPECTED_DLQ
    assert {r["format"] for r in rows} == {"streams"}
    punctuated = [r for r in rows if r["source_topic"] is None]
    assert len(punctuated) == 1
    p = punctuated[0]
    assert (p["exception_class"], p["exception_message"]) == (
        PUNCTUATOR,
        "punctuator failed on purpose",
    )
    assert (p["source_partition"], p["source_offset"], p["key"], p["value"]) == (
        None,
        None,
        None,
        None,
    )
    assert p["headers_only"] is True and header_text(p, S_PARTITION) == "-1"
    for row in rows:
        if row is p:
            continue
        orig = s.originals[int(header_text(row, SEQ) or "-1")]
        assert (row["source_topic"], row["source_partition"], row["source_offset"]) == (
            s.source,
            orig.partition,
            orig.offset,
        )
        # Kafka 4.4.0's Streams writes the raw input bytes, and the input's headers before its own.
        names = [h["name"] for h in row["headers"]]
        assert names == [
            SEQ,
            "bin",
            "rep",
            "rep",
            S_EXCEPTION,
            S_MESSAGE,
            "__streams.errors.stacktrace",
            S_TOPIC,
            S_PARTITION,
            S_OFFSET,
        ]
        value = orig.value or b""
        if len(value) == 4:
            assert row["exception_class"] == "java.lang.IllegalArgumentException"
            assert row["exception_message"] == f"negative value {struct.unpack('>i', value)[0]}"
        else:
            assert row["exception_class"] == "org.apache.kafka.common.errors.SerializationException"
        assert row["value"] == encode_bytes(value)
    # The good ones went through.
    assert broker.count_records(s.output) == 9  # 8 positive and the 0

    rc, out, _err = run_dlq(broker, "inspect", "--topic", s.dlq, "--exception-class", PUNCTUATOR)
    assert rc == 0 and "(none named)" in out and "1 matching of 17" in out


def test_replay_restores_the_inputs_says_the_punctuators_record_needs_to_and_guards_the_loop(
    broker: Broker, streams_dlq: StreamsDlq
) -> None:
    s = streams_dlq
    name = f"fix-{uuid.uuid4().hex[:6]}"
    before = end_offsets(broker, s.source, PARTITIONS)

    # Without --to the punctuator's record cannot go anywhere: the run says so and stops its partition.
    rc, out, err = run_dlq(broker, "replay", "--from", s.dlq, "--name", name, "--dry-run")
    assert rc == 1, out + err
    assert "names no source topic: replay it with --to TOPIC" in out
    assert end_offsets(broker, s.source, PARTITIONS) == before

    rc, out, err = run_dlq(
        broker, "replay", "--from", s.dlq, "--name", name, "--skip-unrecoverable"
    )
    assert rc == 0, out + err
    assert f"replayed to {s.source}: {FAILING}" in out
    assert "unrecoverable, skipped: 1" in out
    replayed = records_after(broker, s.source, before, FAILING)
    assert len(replayed) == FAILING
    assert_restored(replayed, s.originals, name, s.dlq)

    # The application fails on them again; Streams copies the markers into the new DLQ records.
    wait_for(
        lambda: broker.count_records(s.dlq) >= EXPECTED_DLQ + FAILING,
        60,
        "the replayed records back in the Streams DLQ",
    )
    again = [r for r in inspect_json(broker, s.dlq) if r["replay_count"] == 1]
    assert len(again) == FAILING

    rc, out, err = run_dlq(
        broker, "replay", "--from", s.dlq, "--name", name, "--skip-unrecoverable"
    )
    assert rc == 0, out + err
    assert f"replayed 1 times already (--max-replays 1): {FAILING}" in out
    assert end_offsets(broker, s.source, PARTITIONS) == {
        p: before[p] + FAILING // PARTITIONS for p in range(PARTITIONS)
    }


def test_a_streams_record_without_a_source_goes_only_where_to_says(broker: Broker) -> None:
    """A custom handler's record for a punctuator's failure, built as Kafka Streams' ExceptionHandlerUtils
    builds it (null topic, "-1" partition and offset) but with a value: replayed only with --to."""
    tag = uuid.uuid4().hex[:8]
    dlq = broker.create_topic(f"dlq.streams-nosrc-{tag}")
    target = broker.create_topic(f"streams-target-{tag}")
    headers = (
        ("trace", b"t-1"),
        (S_EXCEPTION, b"java.lang.IllegalStateException"),
        (S_MESSAGE, b"punctuator failed"),
        (S_TOPIC, None),
        (S_PARTITION, b"-1"),
        (S_OFFSET, b"-1"),
    )
    broker.produce(dlq, [Rec(key=b"k", value=b"state snapshot", headers=headers)])
    name = f"nosrc-{tag}"
    rc, out, _err = run_dlq(broker, "replay", "--from", dlq, "--name", name)
    assert rc == 1 and "names no source topic: replay it with --to TOPIC" in out
    rc, out, err = run_dlq(broker, "replay", "--from", dlq, "--name", name + "-to", "--to", target)
    assert rc == 0, out + err
    [rec] = broker.read_topic(target, 1)
    assert (rec.key, rec.value, rec.headers[0]) == (b"k", b"state snapshot", ("trace", b"t-1"))
    assert not any(n.startswith("__streams.") for n, _ in rec.headers)
