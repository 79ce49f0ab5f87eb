"""Answers a buggy or hostile app can give, end to end: the sidecar keeps running and the DLQ stays ours.

Real broker, a real app over TCP, the sidecar as a subprocess. Before the fixes, one `POST /v1/acks`
with a lone surrogate in a DLQ header name stopped the whole process (UnicodeEncodeError out of the
engine's nursery), and an app's `__dlq.replay.count` header reset the replay loop guard.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from sidecar.http.server import Response
from tests.harness import (
    Delivery,
    RecordingApp,
    Sidecar,
    running_sidecar,
    wait_until,
)
from tests.kafkatools import Broker, Rec

REPLAY_COUNT = "__dlq.replay.count"


def _json(obj: object) -> Response:
    # json.dumps writes a lone surrogate as the ASCII escape '\ud800': valid JSON text.
    return Response(200, (("Content-Type", "application/json"),), json.dumps(obj).encode())


def _policy(d: Delivery) -> Response:
    if d.value == b"bad-name":
        return _json({"ack": "reject", "dlq": {"headers": {"\ud800": "v"}}})
    if d.value == b"bad-value":
        return _json({"ack": "reject", "dlq": {"headers": {"x-a": "\udfff"}}})
    return Response(202)  # deferred: answered through the ack API below


@asynccontextmanager
async def _running(
    broker: Broker, unique: str, tmp_path: Path, app: RecordingApp
) -> AsyncIterator[tuple[str, Sidecar]]:
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        extra={
            "delivery.count.limit": 2,
            "errors.deadletterqueue.copy.record.enable": True,
        },
    ) as rig:
        yield rig.topic, rig.sc


async def test_hostile_dlq_headers_neither_crash_the_sidecar_nor_set_ours(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    app = RecordingApp(policy=_policy)

    def ids(value: bytes) -> list[str]:
        return [d.delivery_id for d in app.deliveries if d.value == value]

    async with _running(broker, unique, tmp_path, app) as (topic, sc):
        replayed = Rec(key=b"r", value=b"replayed", headers=((REPLAY_COUNT, b"1"),))
        others = [Rec(key=v, value=v) for v in (b"surrogate", b"bad-name", b"bad-value")]
        await trio.to_thread.run_sync(broker.produce, topic, [replayed, *others])
        await wait_until(
            lambda: ids(b"replayed") and ids(b"surrogate"), 30, "the deferred deliveries"
        )

        # A lone surrogate in a DLQ header name or value through the ack API: a 400, not a crash.
        for headers in ({"\ud800": "v"}, {"x-a": "\ud800"}):
            item = {"id": ids(b"surrogate")[0], "ack": "reject", "dlq": {"headers": headers}}
            code, raw = await sc.post_raw("/v1/acks", json.dumps({"acks": [item]}).encode())
            assert code == 400, raw
            assert b"lone surrogate" in raw, raw
        code, _ = await sc.get("/healthz")
        assert code == 200 and sc.proc.returncode is None, sc.log_text()[-3000:]

        # The app may add headers to its DLQ record, never set ours.
        forged = {REPLAY_COUNT: "0", "__DLQ.errors.topic": "elsewhere", "x-app": "kept"}
        code, body = await sc.post_json(
            "/v1/acks",
            [
                {"id": ids(b"replayed")[0], "ack": "reject", "dlq": {"headers": forged}},
                {"id": ids(b"surrogate")[0], "ack": "accept"},
            ],
        )
        assert code == 200 and [x["result"] for x in body["results"]] == ["ok", "ok"], body

        # The app's own answers with a lone surrogate are malformed: released up to the limit (2),
        # then archived, and the sidecar is still running.
        await wait_until(
            lambda: len(ids(b"bad-name")) >= 2 and len(ids(b"bad-value")) >= 2,
            30,
            "the malformed answers redelivered",
        )
        dlq = await trio.to_thread.run_sync(
            lambda: broker.read_topic(f"dlq.{topic}", 3, timeout_s=30)
        )
        assert sc.proc.returncode is None, sc.log_text()[-3000:]
        # The counters move once the broker's confirmation is back, which a reader can beat.
        expected = {"rejected": 1, "delivery_count_exceeded": 2}
        with trio.fail_after(20):
            while (await sc.status())["counters"]["archived"] != expected:
                await trio.sleep(0.1)
        assert await sc.stop() == 0, sc.log_text()[-3000:]

    by_value = {rec.value: rec for rec in dlq}
    assert set(by_value) == {b"replayed", b"bad-name", b"bad-value"}, by_value
    headers = by_value[b"replayed"].headers
    assert [v for n, v in headers if n == REPLAY_COUNT] == [b"1"], headers
    assert [v for n, v in headers if n == "__dlq.errors.topic"] == [topic.encode()], headers
    assert ("x-app", b"kept") in headers
    assert all(n.lower() != "__dlq.errors.topic" or n == "__dlq.errors.topic" for n, _ in headers)
    for value in (b"bad-name", b"bad-value"):
        classes = [
            v for n, v in by_value[value].headers if n == "__dlq.errors.exception.class.name"
        ]
        assert classes == [b"sidecar.MalformedAnswer"], by_value[value].headers
    assert [d.delivery_count for d in app.deliveries if d.value == b"bad-name"] == [1, 2]
    log = sc.log_text()
    assert "Traceback" not in log and "UnicodeEncodeError" not in log
    assert log.count("tried to set the sidecar's own") == 1, log[-3000:]
