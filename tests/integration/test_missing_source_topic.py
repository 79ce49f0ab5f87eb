"""A source topic that does not exist, on the real broker: named in /readyz, /v1/status and the log,
and no DLQ topic created for it; the topics that do exist are consumed and dead-lettered as usual."""

from __future__ import annotations

from pathlib import Path

import trio

from sidecar.http.server import Response
from tests.harness import Delivery, RecordingApp, json_answer, running_sidecar
from tests.kafkatools import Broker, Rec


def _reject(_d: Delivery) -> Response:
    return json_answer({"ack": "reject"})


async def test_a_missing_source_topic_is_named_and_gets_no_dlq_topic(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    present = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    missing = f"nope-{unique}"
    async with running_sidecar(
        broker,
        tmp_path,
        RecordingApp(policy=_reject),
        unique=unique,
        topics=[present, missing],
        produce_first=[Rec(b"k", b"v")],
    ) as rig:
        sc = rig.sc

        await sc.wait_status(
            lambda st: st["counters"]["dlq_written"] == 1,
            60,
            "the present topic's record in the DLQ",
        )
        code, ready = await sc.get("/readyz")
        assert code == 503, ready
        assert ready["checks"]["source_topics_exist"] is False, ready
        assert f"source topic {missing} does not exist" in ready["reason"], ready
        assert present not in ready["reason"]
        status = await sc.status()
        assert status["missing_topics"] == [missing], status
        warned = [
            line
            for line in sc.log_lines()
            if line["level"] == "warning" and missing in str(line["msg"])
        ]
        assert warned and "no DLQ topic is created" in str(warned[0]["msg"]), sc.log_text()
        assert warned[0]["missing_topics"] == [missing]
    # The topic that exists got its DLQ topic (and the record); the missing one none.
    assert await trio.to_thread.run_sync(broker.topic_exists, f"dlq.{present}")
    assert not await trio.to_thread.run_sync(broker.topic_exists, f"dlq.{missing}")
    assert not await trio.to_thread.run_sync(broker.topic_exists, missing)


async def test_a_misspelt_source_topic_gets_the_clusters_likely_name_and_no_raw_error(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """`paymnets` for `payments`: /readyz and the warning suggest the topic the cluster has, and no
    raw `KafkaError{code=UNKNOWN_TOPIC_OR_PART}` line is logged for it."""
    payments = await trio.to_thread.run_sync(lambda: broker.create_topic(f"payments-{unique}"))
    orders = await trio.to_thread.run_sync(lambda: broker.create_topic(f"orders-{unique}"))
    misspelt = f"paymnets-{unique}"
    app = RecordingApp()
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        topics=[orders, misspelt],
        produce_first=[Rec(b"k", b"v")],  # on orders: delivered once the consumer runs
    ) as rig:
        sc = rig.sc
        await sc.wait_status(lambda st: st["counters"]["attempts"] == 1, 60, "orders' record")
        code, ready = await sc.get("/readyz")
        assert code == 503, ready
        assert f"source topic {misspelt} (did you mean {payments}?) does not exist" in str(
            ready["reason"]
        ), ready
        assert await sc.stop() == 0
    text = sc.log_text()
    assert "KafkaError{" not in text, text[-3000:]
    assert f"did you mean {payments}?" in text
