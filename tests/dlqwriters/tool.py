"""What the tests of the other DLQ writers check with: the `dlq` commands in-process, and the replayed records.

`run_dlq` runs `dlq-sidecar dlq ...` against the test broker and returns (exit code, stdout, stderr);
`records_after` reads what a replay appended to a source topic; `assert_restored` checks the replayed
records against the originals byte for byte (key, value, headers in order, partition) plus the markers.
"""

from __future__ import annotations

import argparse
import io
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from sidecar.ops.dlq.command import add_dlq_parser, cmd_dlq
from sidecar.ops.dlq.entries import H_REPLAY_COUNT, H_REPLAY_FROM, H_REPLAY_NAME
from tests.kafkatools import Broker, Rec

SEQ = "seq"  # every original carries a unique `seq` header, so a replayed record finds its original


def run_dlq(broker: Broker, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="dlq-sidecar")
    add_dlq_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["dlq", argv[0], "--bootstrap", broker.bootstrap, *argv[1:]])
    out, err = io.StringIO(), io.StringIO()
    rc = cmd_dlq(args, out, err)
    return rc, out.getvalue(), err.getvalue()


def inspect_json(broker: Broker, topic: str, *filters: str) -> list[dict[str, Any]]:
    rc, out, err = run_dlq(broker, "inspect", "--topic", topic, "--json", *filters)
    assert rc == 0, err
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def text_of(field: Mapping[str, Any] | None) -> str | None:
    return None if field is None else str(field["text"])


def header_text(row: Mapping[str, Any], name: str) -> str | None:
    values = [h["value"] for h in row["headers"] if h["name"] == name]
    return text_of(values[-1]) if values else None


def seq_of(headers: Sequence[tuple[str, bytes | None]]) -> int:
    values = [v for n, v in headers if n == SEQ]
    assert len(values) == 1 and values[0] is not None, headers
    return int(values[0])


def end_offsets(broker: Broker, topic: str, partitions: int) -> dict[int, int]:
    return broker.end_offsets(topic, list(range(partitions)))


def records_after(
    broker: Broker, topic: str, starts: Mapping[int, int], count: int, timeout_s: float = 60.0
) -> list[Rec]:
    """The records at or after `starts` (partition -> offset) in `topic`: what a replay appended."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"after-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    out: list[Rec] = []
    try:
        consumer.assign([TopicPartition(topic, p, o) for p, o in starts.items()])
        deadline = time.monotonic() + timeout_s
        while len(out) < count and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                assert msg.error() is None, msg.error()
                out.append(
                    Rec(
                        key=msg.key(),
                        value=msg.value(),
                        headers=tuple(msg.headers() or ()),
                        partition=msg.partition(),
                        offset=msg.offset(),
                    )
                )
    finally:
        consumer.close()
    return out


def assert_restored(
    replayed: Sequence[Rec], originals: Mapping[int, Rec], name: str, dlq_topic: str
) -> None:
    """Each replayed record is its original byte for byte (key, value, headers in order and repeated,
    partition) plus the three replay markers, and no original is replayed twice."""
    seen: set[int] = set()
    for rec in replayed:
        restored = tuple((n, v) for n, v in rec.headers if not n.startswith("__dlq.replay."))
        seq = seq_of(restored)
        assert seq not in seen, f"seq {seq} replayed twice"
        seen.add(seq)
        orig = originals[seq]
        assert (rec.key, rec.value, restored, rec.partition) == (
            orig.key,
            orig.value,
            orig.headers,
            orig.partition,
        ), (rec, orig)
        assert rec.header(H_REPLAY_NAME) == name
        assert rec.header(H_REPLAY_COUNT) == "1"
        assert (rec.header(H_REPLAY_FROM) or "").startswith(f"{dlq_topic}/")
