"""Records with schemas keep their bytes, and the DLQ tools read them: the real broker, the real Schema
Registry, the sidecar process, a real HTTP app, `dlq-sidecar dlq` in process.

A decoded record released to a retry tier, then rejected: the tier record, the DLQ record and the record
replayed from the DLQ all carry the original wire-format bytes, never a re-encoding; the app got JSON on
both attempts. `dlq inspect` shows the DLQ's values decoded with their subject and version, redacts the
fields it is told to (and then hides the raw bytes), filters on a decoded field, and shows a value that does
not decode as bytes with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from sidecar.http.server import Response
from tests.harness import (
    Delivery,
    RecordingApp,
    json_answer,
    running_sidecar,
    wait_until,
    wait_until_thread,
)
from tests.integration.test_dlqtool import _json_lines, dlq_cli
from tests.kafkatools import Broker, Rec
from tests.registry import SchemaRegistry
from tests.schematools import decoded_order, order, registry_client, serializer


async def test_tiers_dlq_and_replay_keep_the_bytes_and_inspect_decodes(
    broker: Broker,
    schema_registry: SchemaRegistry,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The table's columns are as wide as the terminal says (COLUMNS): give the payload room to be read.
    monkeypatch.setenv("COLUMNS", "400")
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    target = await trio.to_thread.run_sync(lambda: broker.create_topic(f"replayed-{unique}"))
    client = registry_client(schema_registry.url)
    try:
        encode = serializer(client, "avro")
        values = [encode(topic, order(n)) for n in range(3)]
    finally:
        client.close()
    not_wire = b"plain text, no schema"
    seen: dict[int, int] = {}

    def policy(d: Delivery) -> Response:
        # First attempt: released past the tier threshold (to the 500 ms tier); then rejected.
        seen[d.offset] = seen.get(d.offset, 0) + 1
        if seen[d.offset] == 1:
            return json_answer({"ack": "release", "retry_after_ms": 400})
        return json_answer({"ack": "reject"})

    app = RecordingApp(policy=policy)
    extra = {
        "schemas": {"registry": {"url": schema_registry.url}, "decode": {topic: ["value"]}},
        "errors.deadletterqueue.copy.record.enable": True,
        "errors.retry.tiers": ["500ms"],
        "errors.retry.tier.threshold.ms": 100,
    }
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        extra=extra,
        produce_first=[*(Rec(b"k", v) for v in values), Rec(b"k", not_wire)],
    ) as rig:
        # The DLQ topic is created by the first DLQ write, after the second attempts' answers.
        await wait_until_thread(
            lambda: broker.topic_exists(rig.dlq_topic) and broker.count_records(rig.dlq_topic) >= 4,
            60,
            "four DLQ records",
        )
        dlq = await rig.read_dlq(4)
        await wait_until(
            lambda: len(app.deliveries) >= 6, 60, "two attempts of each decoded record"
        )
    tier_topic = f"dlq.{topic}.retry.500ms"
    tier = await trio.to_thread.run_sync(lambda: broker.read_topic(tier_topic, 3))
    assert sorted(r.value or b"" for r in tier) == sorted(values)  # the wire-format bytes
    assert sorted(r.value or b"" for r in dlq) == sorted([*values, not_wire])
    # The app got JSON on both attempts (the second read back from the tier, decoded again).
    for d in app.deliveries:
        n = json.loads(d.value or b"")["id"]
        assert json.loads(d.value or b"") == decoded_order("avro", n)
    assert sorted(seen.values()) == [2, 2, 2]

    dlq_topic = rig.dlq_topic
    code, out, err = await dlq_cli(
        broker, "replay", "--from", dlq_topic, "--to", target, "--name", f"r-{unique}"
    )
    assert code == 0, err
    replayed = await trio.to_thread.run_sync(lambda: broker.read_topic(target, 4))
    assert sorted(r.value or b"" for r in replayed) == sorted([*values, not_wire])

    # A dry run shows what it would replay decoded (and redacted), and filters on a decoded field.
    code, out, err = await dlq_cli(
        broker, "replay", "--from", dlq_topic, "--to", target, "--name", f"dry-{unique}",
        "--dry-run", "--registry", schema_registry.url, "--redact", "card",
        "--field", "customer=customer-2",
    )  # fmt: skip
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if line.startswith("would replay ")]
    assert f'; value {topic}-value v1: {{"id":2,"customer":"customer-2","card":"***"}}' in line
    assert "would replay 1 of 1 matching records" in out

    # inspect: decoded, the schema named, `card` redacted (and the raw bytes hidden with it).
    code, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq_topic, "--json", "--registry", schema_registry.url,
        "--redact", "card",
    )  # fmt: skip
    assert code == 0, err
    lines = _json_lines(out)
    decoded = [line for line in lines if "value_decoded" in line]
    assert len(decoded) == 3
    for line in decoded:
        n = line["value_decoded"]["id"]
        assert line["value_decoded"] == {**order(n), "card": "***"}
        assert line["value_schema"]["subject"] == f"{topic}-value"
        assert line["value_schema"]["version"] == 1
        assert line["value"] == {"redacted": True, "size": len(values[n])}
        assert order(n)["card"] not in json.dumps(line)
    (plain,) = [line for line in lines if "value_not_decoded" in line]
    assert plain["value"]["text"] == not_wire.decode()
    assert "sidecar.NotWireFormat" in plain["value_not_decoded"]

    # A filter on a decoded field; on a redacted one, nothing matches but "***".
    code, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq_topic, "--json", "--registry", schema_registry.url,
        "--field", "customer=customer-1",
    )  # fmt: skip
    assert code == 0, err
    (one,) = _json_lines(out)
    assert one["value_decoded"]["id"] == 1
    code, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq_topic, "--json", "--registry", schema_registry.url,
        "--redact", "card", "--field", f"card={order(1)['card']}",
    )  # fmt: skip
    assert code == 0, err
    assert _json_lines(out) == []

    # The table: the decoded value and its schema in the payload column.
    code, out, err = await dlq_cli(
        broker, "inspect", "--topic", dlq_topic, "--registry", schema_registry.url,
    )  # fmt: skip
    assert code == 0, err
    # The payload column (the last), its wrapped lines joined.
    payload = "".join(
        line.split("│")[-2].strip() for line in out.splitlines() if line.count("│") > 2
    )
    assert f'{topic}-valuev1:{{"id":1,"customer":"customer-1"' in payload.replace(" ", "")
    assert "notdecoded:sidecar.NotWireFormat" in payload.replace(" ", "")
