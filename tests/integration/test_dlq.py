"""DLQ records exactly as KIP-1191 defines them, and failure handling that never loses or loops (real broker)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from sidecar.http.server import Response
from tests.harness import (
    Delivery,
    RecordingApp,
    by_value,
    by_value_records,
    restartable_member,
    running_sidecar,
    write_config,
)
from tests.harness import wait_until_thread as _wait_thread
from tests.kafkatools import Broker, Rec


async def _in_thread(fn, *args):  # type: ignore[no-untyped-def]
    return await trio.to_thread.run_sync(fn, *args)


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "headers-only"])
async def test_dlq_holds_exactly_rejected_and_released_to_limit(
    broker: Broker, unique: str, tmp_path: Path, copy: bool
) -> None:
    n = 3000 if copy else 600
    limit = 3
    recs = by_value_records(n)
    app = RecordingApp(policy=by_value)
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        partitions=3,
        path="/",
        extra={
            "delivery.count.limit": limit,
            "errors.deadletterqueue.copy.record.enable": copy,
            "errors.retry.delay.initial.ms": 10,
            "errors.retry.delay.max.ms": 20,
        },
        produce_first=recs,
    ) as rig:
        topic, group, dlq, sc = rig.topic, rig.group, rig.dlq_topic, rig.sc
        expected_dlq = sum(1 for i in range(n) if i % 3 != 0)
        await _wait_thread(
            lambda: broker.count_records(dlq) >= expected_dlq,
            180,
            f"{expected_dlq} DLQ records",
        )
        ends = broker.end_offsets(topic, [0, 1, 2])
        await _wait_thread(
            lambda: all(
                broker.committed(group, topic, [0, 1, 2])[p][0] == ends[p] for p in range(3)
            ),
            60,
            "commits at the end",
        )
        st = await sc.status()
        assert await sc.stop() == 0

    dlq_recs = broker.read_topic(dlq, expected_dlq, timeout_s=60)
    assert len(dlq_recs) == expected_dlq  # exactly once each
    assert broker.count_committed_records(dlq) == expected_dlq
    seen_offsets: set[tuple[int, int]] = set()
    by_seq = {int(dict(r.headers)["seq"] or b"-1"): r for r in recs}  # type: ignore[arg-type]
    for d in dlq_recs:
        h = d.headers_by_name()
        src_p = int(h["__dlq.errors.partition"][0] or b"")
        src_o = int(h["__dlq.errors.offset"][0] or b"")
        assert (src_p, src_o) not in seen_offsets
        seen_offsets.add((src_p, src_o))
        assert h["__dlq.errors.topic"] == [
            topic.encode()
        ]  # the spoofed original header was overwritten
        assert h["__dlq.errors.group"] == [group.encode()]
        # One partition in the DLQ topic: everything goes to partition 0 (source partition mod 1).
        assert d.partition == 0
        seq_val = d.value if copy else None
        if copy:
            seq = int(h["seq"][0] or b"")
            orig = by_seq[seq]
            assert d.key == orig.key
            assert d.value == orig.value
            assert h["bin"] == [b"\xff\x00"]
            assert h["rep"] == [b"a", b"b"]
            kind = (orig.value or b"").split(b":")[0]
        else:
            assert d.key is None and d.value is None and "seq" not in h
            kind = (
                b"reject"
                if h["__dlq.errors.message"] == [b"Offset rejected by client."]
                else b"release"
            )
        del seq_val
        if kind == b"reject":
            assert h["__dlq.errors.message"] == [b"Offset rejected by client."]
            assert h["__dlq.errors.delivery.count"] == [b"1"]
            assert h["__dlq.errors.exception.class.name"] == [b"com.example.Invalid"]
            assert h["__dlq.errors.exception.message"] == [f"bad order {src_o}".encode()]
            assert h["__dlq.errors.exception.stacktrace"] == [b"at line 1"]
        else:
            assert kind == b"release"
            assert h["__dlq.errors.message"] == [b"Offset delivery count exceeded the threshold."]
            assert h["__dlq.errors.delivery.count"] == [str(limit).encode()]
            assert h["__dlq.errors.exception.class.name"] == [b"com.example.Flaky"]

    # The app saw: accepted records once, rejected once, released exactly `limit` times; none accepted twice.
    counts: dict[tuple[int, int], int] = {}
    for dv in app.deliveries:
        counts[(dv.partition, dv.offset)] = counts.get((dv.partition, dv.offset), 0) + 1
    kinds_by_coord = {
        (dv.partition, dv.offset): (dv.value or b"").split(b":")[0] for dv in app.deliveries
    }
    assert len(counts) == n
    for coord, c in counts.items():
        kind = kinds_by_coord[coord]
        assert c == {b"accept": 1, b"reject": 1, b"release": limit}[kind], (coord, kind, c)
        assert (coord in seen_offsets) == (kind != b"accept")
    assert st["counters"]["dlq_written"] == expected_dlq


async def test_topic_placeholder_and_partition_rule(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    a = broker.create_topic(f"a-{unique}", partitions=3)
    b = broker.create_topic(f"b-{unique}", partitions=3)
    group = f"g-{unique}"
    app = RecordingApp(policy=lambda d: Response(400))  # 400 = reject
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topics=[a, b],
        group=group,
        path="/",
        extra={
            "errors.deadletterqueue.topic.name": "dlq.{topic}",
            "errors.deadletterqueue.topic.partitions": 2,
        },
        start=False,
    ) as rig:
        for t in (a, b):
            await _in_thread(
                broker.produce,
                t,
                [
                    Rec(key=None, value=f"{t}-{p}".encode(), partition=p)
                    for p in range(3)
                    for _ in range(4)
                ],
            )
        async with rig.sidecar():
            await _wait_thread(
                lambda: (
                    broker.count_records(f"dlq.{a}") >= 12
                    and broker.count_records(f"dlq.{b}") >= 12
                ),
                60,
                "DLQ records",
            )
    # Auto-created with the topic config Kafka 4.4 checks before a share group may write to it.
    from confluent_kafka.admin import ConfigResource

    for t in (a, b):
        res = ConfigResource(ConfigResource.Type.TOPIC, f"dlq.{t}")
        configs = broker.admin.describe_configs([res])[res].result(timeout=15)
        assert configs["errors.deadletterqueue.group.enable"].value == "true"
    for t in (a, b):
        got = broker.read_topic(f"dlq.{t}", 12)
        assert len(got) == 12
        for r in got:
            h = r.headers_by_name()
            assert h["__dlq.errors.topic"] == [t.encode()]
            src_p = int(h["__dlq.errors.partition"][0] or b"")
            assert r.partition == src_p % 2  # source partition modulo the DLQ partition count
            assert h["__dlq.errors.exception.class.name"] == [b"sidecar.HttpStatus400"]


async def test_record_too_large_for_dlq_is_written_headers_only(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    dlq = broker.create_topic(f"dlq.{topic}", partitions=1, config={"max.message.bytes": "2048"})
    group = f"g-{unique}"
    app = RecordingApp(policy=lambda d: Response(422))
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        extra={
            "errors.deadletterqueue.copy.record.enable": True,
            "errors.deadletterqueue.auto.create.enable": False,
        },
        start=False,
    ) as rig:
        big = os.urandom(20000)
        await _in_thread(
            broker.produce, topic, [Rec(key=b"k", value=big), Rec(key=b"k2", value=b"small")]
        )
        async with rig.sidecar() as sc:
            await _wait_thread(lambda: broker.count_records(dlq) >= 2, 60, "2 DLQ records")
            await _wait_thread(
                lambda: broker.committed(group, topic, [0])[0][0] == 2, 60, "commit past both"
            )
            assert await sc.stop() == 0
    got = sorted(
        broker.read_topic(dlq, 2),
        key=lambda r: int(r.headers_by_name()["__dlq.errors.offset"][0] or b""),
    )
    big_h = got[0].headers_by_name()
    assert got[0].value is None and got[0].key is None
    assert b"too large" in (big_h["__dlq.errors.copy.dropped"][0] or b"")
    assert big_h["__dlq.errors.offset"] == [b"0"]
    assert got[1].value == b"small" and "__dlq.errors.copy.dropped" not in got[1].headers_by_name()


async def test_dlq_deleted_at_runtime_stops_sidecar_without_committing(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    dlq = broker.create_topic(f"dlq.{topic}", partitions=1)
    group = f"g-{unique}"
    app = RecordingApp(policy=lambda d: Response(200) if d.value == b"ok" else Response(400))
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        extra={"errors.deadletterqueue.auto.create.enable": False},
        produce_first=[Rec(key=None, value=b"ok"), Rec(key=None, value=b"ok")],
        start=False,
    ) as rig:
        async with rig.sidecar() as sc:
            await _wait_thread(
                lambda: broker.committed(group, topic, [0])[0][0] == 2, 60, "first two committed"
            )
            await _in_thread(broker.delete_topic, dlq)
            await _wait_thread(lambda: not broker.topic_exists(dlq), 30, "DLQ topic gone")
            await _in_thread(
                broker.produce, topic, [Rec(key=None, value=b"poison"), Rec(key=None, value=b"ok")]
            )
            code = await sc.wait_exit(90)
            assert code == 1
            assert "does not exist" in sc.log_text()
        assert (
            broker.committed(group, topic, [0])[0][0] == 2
        )  # not past the unwritten record at offset 2

        broker.create_topic(dlq, partitions=1)
        async with rig.sidecar() as sc2:
            await _wait_thread(
                lambda: broker.count_records(dlq) >= 1,
                60,
                "the record reaches the DLQ after restart",
            )
            await _wait_thread(
                lambda: broker.committed(group, topic, [0])[0][0] == 4, 60, "commit past it"
            )
            assert await sc2.stop() == 0
    got = broker.read_topic(dlq, 1)
    assert got[0].headers_by_name()["__dlq.errors.offset"] == [b"2"]


async def test_tolerance_none_stops_at_first_archived_record(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    group = f"g-{unique}"
    app = RecordingApp(policy=lambda d: Response(200) if d.value != b"poison" else Response(400))
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        extra={"errors.tolerance": "none"},
        app_extra={"max.in.flight": 1},
        start=False,
    ) as rig:
        await _in_thread(
            broker.produce, topic, [Rec(key=None, value=v) for v in (b"a", b"b", b"poison", b"c")]
        )
        # It exits by design, possibly before its API was ever polled.
        async with rig.sidecar(wait_api=False) as sc:
            assert await sc.wait_exit(60) == 1
            assert "errors.tolerance is none" in sc.log_text()
    committed = broker.committed(group, topic, [0])[0][0]
    assert committed <= 2  # never past the archived record at offset 2
    assert not broker.topic_exists(f"dlq.{topic}") or broker.count_records(f"dlq.{topic}") == 0


async def test_poison_that_kills_the_sidecar_reaches_the_dlq(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """The app kills the sidecar (SIGKILL) whenever it sees the poison record: no crash loop."""
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    group = f"g-{unique}"
    limit = 3
    current: dict[str, int] = {}

    def policy(d: Delivery) -> Response:
        if d.value == b"kill":
            os.kill(current["pid"], signal.SIGKILL)
        return Response(200)

    app = RecordingApp(policy=policy)
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        extra={"delivery.count.limit": limit},
        app_extra={"max.in.flight": 1},
        kafka_extra=restartable_member(unique),
        start=False,
    ) as rig:
        await _in_thread(
            broker.produce, topic, [Rec(key=None, value=v) for v in (b"a", b"kill", b"b")]
        )
        restarts = 0
        dlq = f"dlq.{topic}"

        def done() -> bool:
            return broker.count_records(dlq) >= 1 and broker.committed(group, topic, [0])[0][0] == 3

        for _ in range(limit + 3):
            # The pid is known before the sidecar can deliver anything (no wait for its API first).
            async with rig.sidecar(wait_api=False) as sc:
                current["pid"] = sc.proc.pid
                finished = False
                with trio.move_on_after(90):
                    while sc.proc.returncode is None:
                        if await _in_thread(done):
                            finished = True
                            break
                        await trio.sleep(0.2)
                if finished:
                    assert await sc.stop() == 0
                    break
                assert sc.proc.returncode == -signal.SIGKILL, sc.log_text()[-2000:]
                restarts += 1
        else:
            raise AssertionError("the poison record kept killing the sidecar")
    kills = [d for d in app.deliveries if d.value == b"kill"]
    # Bounded: limit + 1 deaths (docs/guarantees.md). The first happens in normal delivery and charges no one;
    # every later one with the poison record isolated, alone in flight and counted before it left.
    assert [d.delivery_count for d in kills] == [1, *range(1, limit + 1)]
    assert restarts == limit + 1
    got = broker.read_topic(f"dlq.{topic}", 1)
    assert len(got) == 1, [(g.headers, g.timestamp_ms) for g in got]
    h = got[0].headers_by_name()
    assert h["__dlq.errors.offset"] == [b"1"]
    assert h["__dlq.errors.message"] == [b"Offset delivery count exceeded the threshold."]
    assert h["__dlq.errors.delivery.count"] == [str(limit).encode()]
    assert [d.value for d in app.deliveries if d.value != b"kill"].count(b"b") >= 1


def test_forbidden_dlq_names_are_config_errors(tmp_path: Path) -> None:
    import subprocess
    import sys

    for name, why in (("__x", "__"), ("wrong.{topic}", "prefix"), ("dlq.src", "source")):
        cfg = write_config(
            tmp_path / "bad.yaml",
            bootstrap="127.0.0.1:1",
            group="g",
            topics=["dlq.src"] if why == "source" else ["src"],
            app_url="http://127.0.0.1:1/",
            extra={
                "errors.deadletterqueue.topic.name": name,
                "errors.deadletterqueue.topic.name.prefix": "" if why != "prefix" else "dlq.",
            },
        )
        res = subprocess.run(
            [sys.executable, "-m", "sidecar", "run", "-c", str(cfg)],
            capture_output=True,
            check=False,
            text=True,
            timeout=30,
        )
        assert res.returncode == 2, (name, res.stderr)
        assert "errors.deadletterqueue.topic.name" in res.stderr, res.stderr
