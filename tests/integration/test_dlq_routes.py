"""DLQ routes on the real broker with a real HTTP app, both engines: by exception class and by its
cause, by reason and source topic, an app naming an allowed and a forbidden DLQ topic, the routed
topics' partitions, the transactional DLQ, `/v1/status`, and replay from a routed topic."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import trio

from sidecar.http.server import Response
from sidecar.kafka.dlq.record import H_EXC_CAUSE_CLASS, H_ROUTE_REFUSED
from tests.harness import Delivery, RecordingApp, json_answer, running_sidecar
from tests.integration.test_dlqtool import dlq_cli
from tests.integration.test_pull_mode import pull_all, pull_sidecar, wait_pull_api
from tests.kafkatools import Broker, Rec
from tests.pulltools import PullClient, api_listen_of, value_of

KINDS = ("schema", "wrapped", "flaky", "bad", "manual", "forbid", "ok")
PER_KIND = 2  # records of each kind per source topic


def _reject(cls: str, **more: Any) -> Response:
    error: dict[str, Any] = {"class": cls, "message": "no"}
    if "cause" in more:
        error["cause_class"] = more.pop("cause")
    return json_answer({"ack": "reject", "error": error, **more})


def policy(d: Delivery) -> Response:
    kind = (d.value or b"").split(b":")[0].decode()
    if kind == "schema":
        return _reject("app.SchemaError")
    if kind == "wrapped":
        return _reject("app.Wrapper", cause="app.SchemaError")
    if kind == "flaky":
        return json_answer({"ack": "release", "error": {"class": "app.Flaky", "message": "later"}})
    if kind == "bad":
        return _reject("app.Bad")
    if kind == "manual":
        return _reject("app.Bad", dlq={"topic": f"dlq.{d.topic}.manual"})
    if kind == "forbid":
        return _reject("app.Bad", dlq={"topic": "dlq.elsewhere"})
    return Response(200)


def _records(partitions: int) -> list[Rec]:
    n = len(KINDS) * PER_KIND
    return [
        Rec(
            key=f"k{i}".encode(),
            value=f"{KINDS[i % len(KINDS)]}:{i}".encode(),
            partition=i % partitions,
        )
        for i in range(n)
    ]


def _h(rec: Rec, name: str) -> str | None:
    value = rec.headers_by_name().get(name)
    return value[0].decode() if value and value[0] is not None else None


def _kinds(recs: list[Rec]) -> list[str]:
    return sorted((r.value or b"").split(b":")[0].decode() for r in recs)


@pytest.mark.parametrize("engine", ["consumer-txn", "share"])
async def test_routes_choose_the_dlq_topic(
    broker: Broker, unique: str, tmp_path: Path, engine: str
) -> None:
    orders, pay = f"src-{unique}", f"pay-{unique}"
    for t in (orders, pay):
        await trio.to_thread.run_sync(lambda t=t: broker.create_topic(t, partitions=3))
    # A routed topic with 2 partitions: a record's partition is its source partition modulo 2.
    schema_orders = f"dlq.{orders}.schema"
    await trio.to_thread.run_sync(lambda: broker.create_topic(schema_orders, partitions=2))
    engine_keys: dict[str, Any] = (
        {"engine": "share", "ordering": "none"}
        if engine == "share"
        else {"errors.deadletterqueue.transactional.enable": True}
    )
    app = RecordingApp(policy=policy)
    extra = {
        **engine_keys,
        "delivery.count.limit": 2,
        "errors.deadletterqueue.copy.record.enable": True,
        "errors.deadletterqueue.routes": [
            {"exception.class": "app.SchemaError", "topic.name": "dlq.{topic}.schema"},
            {
                "reason": "delivery_count_exceeded",
                "source.topic": pay,
                "topic.name": f"dlq.{pay}.exhausted",
            },
        ],
        # `.unused`: no record names it, so only the start-up creates it.
        "errors.deadletterqueue.routes.app.allowed": ["dlq.{topic}.manual", "dlq.{topic}.unused"],
    }
    expected = {
        schema_orders: ["schema", "schema", "wrapped", "wrapped"],
        f"dlq.{orders}": ["bad", "bad", "flaky", "flaky", "forbid", "forbid"],
        f"dlq.{orders}.manual": ["manual", "manual"],
        f"dlq.{pay}.schema": ["schema", "schema", "wrapped", "wrapped"],
        f"dlq.{pay}.exhausted": ["flaky", "flaky"],
        f"dlq.{pay}": ["bad", "bad", "forbid", "forbid"],
        f"dlq.{pay}.manual": ["manual", "manual"],
    }
    async with running_sidecar(
        broker, tmp_path, app, topics=[orders, pay], group=f"g-{unique}", path="/", extra=extra
    ) as rig:
        await trio.to_thread.run_sync(lambda: broker.produce(orders, _records(3)))
        await trio.to_thread.run_sync(lambda: broker.produce(pay, _records(3)))
        want = {t: len(k) for t, k in expected.items()}
        st = await _wait_written(rig.sc, want)
        # Every topic the config can write to (consumer), or the two named (share), one after
        # the other: only the schema topics hold SchemaError records (their class, or their cause's).
        topics = (
            ["--config", str(rig.config_path)]
            if engine == "consumer-txn"
            else ["--topic", f"dlq.{pay}.schema", "--topic", f"dlq.{pay}"]
        )
        rc, out, err = await dlq_cli(
            broker, "inspect", *topics, "--exception-class", "app.SchemaError"
        )
        assert rc == 0, out + err
        shown = len(set(routes_topics(st))) if engine == "consumer-txn" else 2
        assert out.count("DLQ dlq.") == shown, out
        assert out.count("4 matching of 4 records read") == shown - out.count("0 matching of")
        assert out.count("0 matching of") == shown - (2 if engine == "consumer-txn" else 1), out
        if engine == "consumer-txn":
            await _replay_from_a_routed_topic(rig.sc, broker, orders, schema_orders)
        assert await rig.sc.stop(timeout_s=60) == 0, rig.sc.log_text()[-3000:]

    # Read committed: with the transactional DLQ, a routed topic's records are in committed
    # transactions too.
    got = {t: await trio.to_thread.run_sync(broker.read_committed_to_end, t) for t in expected}
    if engine == "consumer-txn":  # the replayed records came back to the same routed topic
        got[schema_orders] = [r for r in got[schema_orders] if not _h(r, "__dlq.replay.count")]
    assert {t: _kinds(recs) for t, recs in got.items()} == expected
    assert not await trio.to_thread.run_sync(broker.topic_exists, "dlq.elsewhere")
    for t in (orders, pay):
        assert await trio.to_thread.run_sync(broker.topic_exists, f"dlq.{t}.unused")
    for topic, recs in got.items():
        for r in recs:
            kind = _kinds([r])[0]
            source = _h(r, "__dlq.errors.topic")
            assert source in (orders, pay) and topic.startswith(f"dlq.{source}")
            if topic == schema_orders:
                assert r.partition == int(_h(r, "__dlq.errors.partition") or "") % 2
            if kind == "wrapped":
                assert _h(r, "__dlq.errors.exception.class.name") == "app.Wrapper"
                assert _h(r, H_EXC_CAUSE_CLASS) == "app.SchemaError"
            if kind == "flaky":
                assert (
                    _h(r, "__dlq.errors.message") == "Offset delivery count exceeded the threshold."
                )
            assert _h(r, H_ROUTE_REFUSED) == ("dlq.elsewhere" if kind == "forbid" else None)
    routes = st["dlq_routes"]
    assert routes["default"] == "dlq.{topic}"
    assert [r["topic"] for r in routes["rules"]] == ["dlq.{topic}.schema", f"dlq.{pay}.exhausted"]
    assert routes["written_by_dlq_topic"][f"dlq.{pay}.exhausted"] == 2
    assert routes["refused_by_source_topic"] == {orders: 2, pay: 2}
    assert set(expected) <= set(routes["topics"])


async def _wait_written(sc: Any, want: dict[str, int], timeout_s: float = 60) -> dict[str, Any]:
    """The status once at least `want` DLQ records are confirmed in each DLQ topic."""
    deadline = trio.current_time() + timeout_s
    while True:
        st: dict[str, Any] = await sc.status()
        written = st["dlq_routes"]["written_by_dlq_topic"]
        if all(written.get(t, 0) >= n for t, n in want.items()):
            return st
        assert trio.current_time() < deadline, f"DLQ records written {written}, want {want}"
        await trio.sleep(0.2)


def routes_topics(st: dict[str, Any]) -> list[str]:
    return list(st["dlq_routes"]["topics"])


async def _replay_from_a_routed_topic(
    sc: Any, broker: Broker, orders: str, schema_orders: str
) -> None:
    """Replay the routed topic's records to their source, with the sidecar running: the app
    rejects them again, they come back to the same routed topic with the replay history, and a
    second replay of that topic and the default DLQ skips them (the loop guard)."""
    only = ("--source-topic", orders, "--exception-class", "app.SchemaError")
    rc, out, err = await dlq_cli(broker, "replay", "--from", schema_orders, "--name", "r", *only)
    assert rc == 0 and "replayed 4 of 4" in out, out + err
    await _wait_written(sc, {schema_orders: 8})  # rejected again
    end = broker.end_offsets(orders, [0, 1, 2])
    rc, out, err = await dlq_cli(
        broker, "replay", "--from", schema_orders, "--from", f"dlq.{orders}", "--name", "r", *only
    )
    assert rc == 0, out + err
    assert f"replayed 0 of 0 matching records (6 read from dlq.{orders})" in out, out
    assert out.count("skipped, replayed too often: 4") == 1, out
    assert f"replayed 0 of 4 matching records (4 read from {schema_orders})" in out, out
    assert broker.end_offsets(orders, [0, 1, 2]) == end  # nothing sent again


async def test_routed_topic_missing_or_unwritable_stops_without_commit(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """With auto-create off, a routed topic missing at start-up is a start-up error naming it; one
    deleted while the sidecar runs stops it at the record routed there, its offset not committed
    (as an unwritable default DLQ does), while the default DLQ kept working."""
    orders = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    routed = f"dlq.{orders}.schema"
    await trio.to_thread.run_sync(lambda: broker.create_topic(f"dlq.{orders}"))
    extra = {
        "errors.deadletterqueue.auto.create.enable": False,
        "errors.deadletterqueue.produce.retries.timeout.ms": 3000,
        "errors.deadletterqueue.routes": [
            {"exception.class": "app.SchemaError", "topic.name": "dlq.{topic}.schema"}
        ],
    }
    app = RecordingApp(policy=policy)
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=orders,
        group=f"g-{unique}",
        path="/",
        extra=extra,
        wait="none",
    ) as rig:
        assert await rig.sc.wait_exit(30) != 0
        assert routed in rig.sc.log_text() and "do not exist" in rig.sc.log_text()
    await trio.to_thread.run_sync(lambda: broker.create_topic(routed))
    async with running_sidecar(
        broker, tmp_path, app, topic=orders, group=f"g-{unique}", path="/", extra=extra
    ) as rig:
        await trio.to_thread.run_sync(
            lambda: broker.produce(orders, [Rec(None, b"bad:0"), Rec(None, b"ok:1")])
        )
        await _wait_written(rig.sc, {f"dlq.{orders}": 1})
        await trio.to_thread.run_sync(lambda: broker.delete_topic(routed))
        await trio.to_thread.run_sync(
            lambda: broker.produce(orders, [Rec(None, b"schema:2"), Rec(None, b"ok:3")])
        )
        assert await rig.sc.wait_exit(60) != 0
        log = rig.sc.log_text()
        assert f"DLQ topic {routed} does not exist and auto-create is off" in log, log[-3000:]
    committed = await trio.to_thread.run_sync(broker.committed, f"g-{unique}", orders, [0])
    assert committed[0][0] <= 2  # never past the record that could not be dead-lettered
    assert not await trio.to_thread.run_sync(broker.topic_exists, routed)


async def test_pull_mode_acks_name_the_topic_and_the_cause(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """`POST /v1/acks` carries the same `dlq.topic` and `error.cause_class` as a push answer."""
    recs = [
        Rec(None, f"{kind}:{i}".encode()) for i, kind in enumerate(("manual", "forbid", "wrapped"))
    ]
    extra = {
        "errors.deadletterqueue.routes": [
            {"exception.class": "app.SchemaError", "topic.name": "dlq.{topic}.schema"}
        ],
        "errors.deadletterqueue.routes.app.allowed": ["dlq.{topic}.manual"],
    }
    async with pull_sidecar(broker, tmp_path, unique, extra=extra, records=recs) as (sc, topic, _):
        client = PullClient(api_listen_of(sc.config_path))
        with contextlib.closing(client):
            await _pull_and_ack(client, sc, topic)
        want = {f"dlq.{topic}.manual": 1, f"dlq.{topic}": 1, f"dlq.{topic}.schema": 1}
        await _wait_written(sc, want)
        assert await sc.stop() == 0
    read = {t: await trio.to_thread.run_sync(broker.read_committed_to_end, t) for t in want}
    assert {t: len(r) for t, r in read.items()} == want
    assert _h(read[f"dlq.{topic}"][0], H_ROUTE_REFUSED) == f"dlq.{topic}.nope"
    assert _h(read[f"dlq.{topic}.schema"][0], H_EXC_CAUSE_CLASS) == "app.SchemaError"
    assert _h(read[f"dlq.{topic}.manual"][0], "__dlq.errors.offset") == "0"


async def _pull_and_ack(client: PullClient, sc: Any, topic: str) -> None:
    await wait_pull_api(client, sc)
    got = await pull_all(client, 3)
    by_kind = {(value_of(r) or b"").split(b":")[0].decode(): r["id"] for r in got}
    acks = [
        {"id": by_kind["manual"], "ack": "reject", "dlq": {"topic": f"dlq.{topic}.manual"}},
        {"id": by_kind["forbid"], "ack": "reject", "dlq": {"topic": f"dlq.{topic}.nope"}},
        {
            "id": by_kind["wrapped"],
            "ack": "reject",
            "error": {"class": "app.Wrapper", "cause_class": "app.SchemaError"},
        },
    ]
    assert await trio.to_thread.run_sync(client.ack, acks) == ["ok", "ok", "ok"]
