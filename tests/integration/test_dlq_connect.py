"""`dlq inspect` / `dlq replay` on the DLQ of a real Kafka Connect worker (KIP-298, context headers of KIP-610).

One standalone worker (Kafka 4.4.0's connect-runtime, fetched by `make tools`) runs for the module, with
the sink connector of tests/dlqwriters/java (RecordingSinkConnector), the JSON converter (schemas off)
that fails on a value that is not JSON (stage VALUE_CONVERTER), `errors.tolerance: all`, a DLQ topic
with `errors.deadletterqueue.context.headers.enable: true`, and a task that reports `{"reject": true}`
values through the ErrantRecordReporter (stage TASK_PUT). Its DLQ records are inspected and replayed to
the source topic, where the still-running worker dead-letters them again: the replay markers survive
Connect's copy, so the second pass is refused by the loop guard.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sidecar.ops.broker import free_port
from tests.dlqwriters import connect_task_running, java_process, wait_for
from tests.dlqwriters.tool import (
    SEQ,
    assert_restored,
    end_offsets,
    header_text,
    inspect_json,
    records_after,
    run_dlq,
    seq_of,
    text_of,
)
from tests.kafkatools import Broker, Rec

PARTITIONS = 2


def _originals() -> list[Rec]:
    out = []
    for i in range(24):
        kind = ("good", "notjson", "reject")[i % 3]
        value = {
            "good": f'{{"n": {i}}}'.encode(),
            "notjson": f"not json {i}".encode(),
            "reject": f'{{"reject": true, "n": {i}}}'.encode(),
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
    return out


@dataclass
class ConnectDlq:
    source: str
    dlq: str
    connector: str
    originals: dict[int, Rec]  # by seq, with partition and offset as read back
    sink_file: Path


@pytest.fixture(scope="module")
def connect_dlq(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectDlq]:
    tag = uuid.uuid4().hex[:8]
    source = broker.create_topic(f"connect-src-{tag}", partitions=PARTITIONS)
    dlq = broker.create_topic(f"dlq.connect-{tag}", partitions=1)
    originals = _originals()
    broker.produce(source, originals)
    by_seq = {seq_of(r.headers): r for r in broker.read_topic(source, len(originals))}
    work = tmp_path_factory.mktemp("connect")
    port = free_port()
    connector = f"recording-sink-{tag}"
    sink_file = work / "sink.out"
    (work / "worker.properties").write_text(
        "\n".join(
            [
                f"bootstrap.servers={broker.bootstrap}",
                "key.converter=org.apache.kafka.connect.storage.StringConverter",
                "value.converter=org.apache.kafka.connect.json.JsonConverter",
                "value.converter.schemas.enable=false",
                # Header values pass as bytes (the default SimpleHeaderConverter parses them).
                "header.converter=org.apache.kafka.connect.converters.ByteArrayConverter",
                f"offset.storage.file.filename={work / 'offsets'}",
                f"listeners=http://127.0.0.1:{port}",
                "plugin.discovery=only_scan",
                "",
            ]
        )
    )
    (work / "connector.properties").write_text(
        "\n".join(
            [
                f"name={connector}",
                "connector.class=dlqwriters.RecordingSinkConnector",
                "tasks.max=1",
                f"topics={source}",
                f"file={sink_file}",
                "errors.tolerance=all",
                f"errors.deadletterqueue.topic.name={dlq}",
                "errors.deadletterqueue.topic.replication.factor=1",
                "errors.deadletterqueue.context.headers.enable=true",
                "",
            ]
        )
    )
    log = work / "connect.log"
    with java_process(
        "connect",
        "org.apache.kafka.connect.cli.ConnectStandalone",
        [str(work / "worker.properties"), str(work / "connector.properties")],
        log,
        ready=connect_task_running(port, connector),
        heap="384m",
    ) as proc:
        failing = sum(1 for r in originals if not (r.value or b"").startswith(b'{"n"'))
        wait_for(
            lambda: broker.count_records(dlq) >= failing,
            90,
            f"{failing} records in Connect's DLQ",
            proc,
            log,
        )
        yield ConnectDlq(source, dlq, connector, by_seq, sink_file)


def test_inspect_decodes_connects_context_headers(broker: Broker, connect_dlq: ConnectDlq) -> None:
    c = connect_dlq
    rows = inspect_json(broker, c.dlq)
    assert len(rows) == 16, [r["source_offset"] for r in rows]
    for row in rows:
        orig = c.originals[int(header_text(row, SEQ) or "-1")]
        assert row["format"] == "connect" and row["writer"] == "Kafka Connect (KIP-298)"
        assert (row["source_topic"], row["source_partition"], row["source_offset"]) == (
            c.source,
            orig.partition,
            orig.offset,
        )
        assert row["group"] == c.connector
        assert (text_of(row["key"]), text_of(row["value"])) == (
            None if orig.key is None else orig.key.decode(),
            (orig.value or b"").decode(),
        )
        assert row["headers_only"] is False and row["replay_count"] == 0
        if (orig.value or b"").startswith(b"not json"):
            assert row["exception_class"] == "org.apache.kafka.connect.errors.DataException"
            assert "stage VALUE_CONVERTER" in row["detail"]
        else:
            assert row["exception_class"] == "java.lang.IllegalArgumentException"
            assert row["exception_message"] == "rejected by the sink: reject=true"
            assert "stage TASK_PUT" in row["detail"]
    # The good records reached the sink: the converter's failures did not stop the task.
    delivered = c.sink_file.read_text().splitlines()
    assert sorted(delivered) == sorted(
        f"{c.source}/{r.partition}/{r.offset}"
        for r in c.originals.values()
        if (r.value or b"").startswith(b'{"n"')
    )

    # The same fields filter, and the table says who wrote each record.
    data = inspect_json(
        broker,
        c.dlq,
        "--format",
        "connect",
        "--exception-class",
        "org.apache.kafka.connect.errors.DataException",
        "--source-partition",
        "1",
    )
    assert len(data) == 4 and {r["source_partition"] for r in data} == {1}
    assert inspect_json(broker, c.dlq, "--format", "spring") == []
    rc, out, _err = run_dlq(broker, "inspect", "--topic", c.dlq, "--limit", "3")
    assert rc == 0 and "│ connect" in out and "Kafka Connect (KIP-298)" in out


def test_replay_restores_the_originals_and_connects_second_failure_is_not_replayed(
    broker: Broker, connect_dlq: ConnectDlq
) -> None:
    c = connect_dlq
    name = f"fix-{uuid.uuid4().hex[:6]}"
    before = end_offsets(broker, c.source, PARTITIONS)

    rc, out, err = run_dlq(broker, "replay", "--from", c.dlq, "--name", name, "--dry-run")
    assert rc == 0, out + err
    assert out.count(f"would replay {c.dlq}/") == 16
    assert "(connect, " in out
    assert end_offsets(broker, c.source, PARTITIONS) == before

    rc, out, err = run_dlq(broker, "replay", "--from", c.dlq, "--name", name)
    assert rc == 0, out + err
    assert f"replayed to {c.source}: 16" in out
    replayed = records_after(broker, c.source, before, 16)
    assert len(replayed) == 16
    assert_restored(replayed, c.originals, name, c.dlq)

    # The worker reads them again and dead-letters them again, markers and all.
    wait_for(lambda: broker.count_records(c.dlq) >= 32, 60, "the replayed records back in the DLQ")
    again = [r for r in inspect_json(broker, c.dlq) if r["replay_count"] == 1]
    assert len(again) == 16 and all(r["format"] == "connect" for r in again)

    rc, out, err = run_dlq(broker, "replay", "--from", c.dlq, "--name", name)
    assert rc == 0, out + err
    assert "replayed 1 times already (--max-replays 1): 16" in out
    assert end_offsets(broker, c.source, PARTITIONS) == {
        p: before[p] + 8 for p in range(PARTITIONS)
    }
