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
