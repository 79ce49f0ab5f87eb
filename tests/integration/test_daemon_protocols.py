"""Group protocols (classic cooperative-sticky and KIP-848 `group.protocol=consumer`) and archived-record logging."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from sidecar.http.server import Response
from tests.harness import (
    RecordingApp,
    running_sidecar,
)
from tests.harness import wait_until_thread as _wait_thread
from tests.kafkatools import Broker, Rec


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
async def test_two_sidecars_share_partitions_with_either_group_protocol(
    broker: Broker, unique: str, tmp_path: Path, protocol: str
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=4)
    group = f"g-{unique}"
    app = RecordingApp()
    kafka_extra = {"group.protocol": protocol}
    if protocol == "classic":
        kafka_extra["session.timeout.ms"] = 6000
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        kafka_extra=kafka_extra,
        start=False,
    ) as rig:
        cfgs = [rig.config(f"sidecar-{i}.yaml") for i in range(2)]
        await trio.to_thread.run_sync(
            broker.produce,
            topic,
            [Rec(key=f"k{i}".encode(), value=b"v", partition=i % 4) for i in range(400)],
        )
        async with rig.sidecar(cfgs[0]) as a, rig.sidecar(cfgs[1]) as b:
            # Both members end up with partitions (an incremental rebalance either way).
            with trio.fail_after(60):
                while True:
                    sa, sb = await a.status(), await b.status()
                    if sa["partitions"] and sb["partitions"]:
                        break
                    await trio.sleep(0.2)
            await trio.to_thread.run_sync(
                broker.produce,
                topic,
                [Rec(key=f"m{i}".encode(), value=b"w", partition=i % 4) for i in range(400)],
            )
            # One leaves; the other takes its partitions over and finishes everything.
            assert await b.stop() == 0
            ends = broker.end_offsets(topic, [0, 1, 2, 3])
            await _wait_thread(
                lambda: all(
                    broker.committed(group, topic, [0, 1, 2, 3])[p][0] == ends[p] for p in range(4)
                ),
                90,
                "all partitions committed to the end",
            )
            # b's graceful leave commits what it finished, so the end offsets can be committed
            # before the rebalance hands its partitions to a: wait for the take-over itself.
            await a.wait_assigned(4, timeout_s=60)
            st = await a.status()
            assert len(st["partitions"]) == 4
            assert await a.stop() == 0
    assert len(app.seen()) == 800  # nothing lost
    assert not app.key_overlap


@pytest.mark.parametrize("include", [False, True])
async def test_archived_records_are_logged_without_payload_unless_asked(
    broker: Broker, unique: str, tmp_path: Path, include: bool
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    app = RecordingApp(policy=lambda d: Response(422))
    secret = b"card=4111-1111-1111-1111"
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        path="/",
        extra={"errors.log.enable": True, "errors.log.include.messages": include},
        produce_first=[Rec(key=b"order-9", value=secret)],
    ) as rig:
        sc = rig.sc
        await _wait_thread(
            lambda: (
                broker.topic_exists(f"dlq.{topic}") and broker.count_records(f"dlq.{topic}") == 1
            ),
            60,
            "the DLQ record",
        )
        assert await sc.stop() == 0
        lines = [json.loads(ln) for ln in sc.log_text().splitlines() if ln.startswith("{")]
    archived = [ln for ln in lines if ln.get("msg") == "record archived"]
    assert len(archived) == 1
    line = archived[0]
    assert line["topic"] == topic and line["offset"] == 0 and line["reason"] == "rejected"
    assert line["exception_class"] == "sidecar.HttpStatus422"
    text = json.dumps(lines)
    if include:
        assert line["value"] == secret.decode() and line["key"] == "order-9"
    else:
        assert "value" not in line and "key" not in line
        assert "4111" not in text  # the payload appears nowhere in the log
