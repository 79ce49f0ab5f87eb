"""The daemon's answers end to end: how each app answer ends, ordering modes, deferred acks, bytes, app outages.

Real broker, real app servers (TCP or a Unix socket), the sidecar as a subprocess (`python -m sidecar run`).
Each test checks what the app saw, the sidecar's own counters (`/v1/status`), the DLQ topic and the group's
committed offsets.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import trio

from sidecar.core.record import is_delivery_id
from sidecar.http.server import Response
from tests.harness import (
    FAST,
    Delivery,
    RecordingApp,
    Rig,
    counts_by_value,
    json_answer,
    produce,
    running_sidecar,
    short_tmp,
    wait_assigned,
    wait_committed_at_end,
    wait_status,
    wait_until,
)
from tests.kafkatools import Broker, Rec
from tests.promtext import prometheus_values

# FAST, json_answer, produce, counts_by_value and the waits live in tests/harness.py now; they stay
# importable from here (tests/integration/test_daemon_restart.py imports them).
__all__ = [
    "FAST",
    "Rig",
    "counts_by_value",
    "header",
    "json_answer",
    "produce",
    "rig",
    "short_tmp",
    "wait_assigned",
    "wait_committed_at_end",
    "wait_status",
]

header = Rec.header


def rig(
    broker: Broker,
    unique: str,
    tmp_path: Path,
    app: RecordingApp,
    *,
    partitions: int = 1,
    extra: dict[str, Any] | None = None,
    app_extra: dict[str, Any] | None = None,
) -> Any:
    """A topic, an app over TCP and a sidecar in front of it, assigned and ready."""
    return running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        partitions=partitions,
        extra={**FAST, **(extra or {})},
        app_extra=app_extra,
        wait="assigned",
    )


# --------------------------------------------------------------------------------------------- answers


async def test_accept_release_then_accept_and_reject_each_end_as_they_should(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    def policy(d: Delivery) -> Response:
        assert d.value is not None
        kind = d.value.split(b"-")[0]
        if kind == b"rel":
            if d.delivery_count < 3:
                return json_answer({"ack": "release"})
            return json_answer({"ack": "accept"})
        if kind == b"rej":
            return json_answer(
                {
                    "ack": "reject",
                    "error": {"class": "app.BadOrder", "message": f"bad {d.value.decode()}"},
                },
                status=200,
            )
        return Response(200)

    app = RecordingApp(policy=policy)
    kinds = ["acc", "rel", "rej"]
    recs = [
        Rec(key=f"k{i}".encode(), value=f"{kinds[i % 3]}-{i}".encode(), partition=i % 2)
        for i in range(30)
    ]
    async with rig(
        broker, unique, tmp_path, app, partitions=2, extra={"delivery.count.limit": 5}
    ) as r:
        await r.produce(recs)
        st = await wait_status(
            r.sc,
            lambda s: (
                s["counters"]["delivered"].get("accept", 0) == 20
                and s["counters"]["dlq_written"] == 10
            ),
            60,
            "20 accepts and 10 DLQ records",
        )
        await r.committed_at_end()
        dlq = await r.read_dlq(10)
        await trio.sleep(0.3)  # anything more would show up in the app or the counters
        st = await r.sc.status()
        assert await r.sc.stop() == 0

    c = st["counters"]
    assert c["delivered"] == {"accept": 20, "release": 20, "reject": 10}, c
    assert c["attempts"] == len(app.deliveries) == 10 + 30 + 10
    assert c["archived"] == {"rejected": 10}
    assert c["not_attempted"] == 0
    counts = counts_by_value(app.deliveries)
    for i in range(30):
        value = f"{kinds[i % 3]}-{i}".encode()
        assert counts[value] == ([1, 2, 3] if kinds[i % 3] == "rel" else [1]), (
            value,
            counts[value],
        )

    assert len(dlq) == 10
    by_offset = {
        (
            int(header(d, "__dlq.errors.partition") or -1),
            int(header(d, "__dlq.errors.offset") or -1),
        ): d
        for d in dlq
    }
    for i in range(2, 30, 3):
        d = by_offset[(i % 2, i // 2)]
        assert header(d, "__dlq.errors.topic") == r.topic
        assert header(d, "__dlq.errors.group") == r.group
        assert header(d, "__dlq.errors.exception.class.name") == "app.BadOrder"
        assert header(d, "__dlq.errors.exception.message") == f"bad rej-{i}"
        assert header(d, "__dlq.errors.message") == "Offset rejected by client."
        assert header(d, "__dlq.errors.delivery.count") == "1"
        # copy.record.enable defaults to false (KIP-1191): headers only.
        assert d.key is None and d.value is None


async def test_key_ordering_with_concurrent_keys_and_releases(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    # 8 keys x 12 records on one partition; every 5th record is released once, so a release must
    # hold back the later records of its own key (and only those).
    def policy(d: Delivery) -> Response:
        if d.offset % 5 == 0 and d.delivery_count == 1:
            return json_answer({"ack": "release"})
        return Response(200)

    app = RecordingApp(policy=policy, delay_s=0.01)
    recs = [Rec(key=f"key{i % 8}".encode(), value=f"v{i}".encode()) for i in range(96)]
    async with rig(broker, unique, tmp_path, app, extra={"ordering": "key"}) as r:
        await r.produce(recs)
        await wait_status(
            r.sc,
            lambda s: s["counters"]["delivered"].get("accept", 0) == 96,
            60,
            "96 accepts",
        )
        await r.committed_at_end()
        assert await r.sc.stop() == 0

    assert not app.key_overlap, "two records of one key were in flight at once"
    assert app.max_concurrency > 1, "different keys never ran concurrently"
    per_key: dict[bytes | None, list[int]] = defaultdict(list)
    for d in app.deliveries:
        per_key[d.key].append(d.offset)
    for key, offsets in per_key.items():
        # Offset order per key; a released record is retried before the key moves on.
        assert offsets == sorted(offsets), (key, offsets)
    released = {d.offset for d in app.deliveries if d.delivery_count == 2}
    assert released == {o for o in range(96) if o % 5 == 0}


async def test_partition_ordering_runs_one_at_a_time_per_partition(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    in_flight: dict[int, int] = defaultdict(int)
    peak: dict[int, int] = defaultdict(int)

    async def policy(d: Delivery) -> Response:
        in_flight[d.partition] += 1
        peak[d.partition] = max(peak[d.partition], in_flight[d.partition])
        try:
            await trio.sleep(0.01)
        finally:
            in_flight[d.partition] -= 1
        return Response(200)

    app = RecordingApp(policy=policy)
    # Distinct keys: key ordering alone would let them all run at once.
    recs = [Rec(key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % 2) for i in range(40)]
    async with rig(
        broker, unique, tmp_path, app, partitions=2, extra={"ordering": "partition"}
    ) as r:
        await r.produce(recs)
        await wait_until(lambda: len(app.deliveries) >= 40, 60, "40 deliveries")
        await r.committed_at_end()
        assert await r.sc.stop() == 0

    assert dict(peak) == {0: 1, 1: 1}, peak
    assert app.max_concurrency == 2, "the two partitions never ran concurrently"
    for p in (0, 1):
        offsets = [d.offset for d in app.deliveries if d.partition == p]
        assert offsets == list(range(20))


async def test_no_ordering_lets_one_key_run_concurrently(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    app = RecordingApp(delay_s=0.05)
    recs = [Rec(key=b"same", value=f"v{i}".encode()) for i in range(40)]
    async with rig(broker, unique, tmp_path, app, extra={"ordering": "none"}) as r:
        await r.produce(recs)
        await wait_until(lambda: len(app.deliveries) >= 40, 60, "40 deliveries")
        await r.committed_at_end()
        assert await r.sc.stop() == 0
    assert app.key_overlap, "ordering none still serialised one key"
    assert app.max_concurrency > 1
    assert sorted(d.offset for d in app.deliveries) == list(range(40))


# --------------------------------------------------------------------------------------------- deferred


async def test_delivery_ids_cannot_be_guessed_and_acks_reveal_nothing(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """Issue 20: ids were `topic/partition/offset/epoch.seq`, and `/v1/acks` told an id of a seq
    already issued (`expired`) from one not yet issued (`unknown`), so a few probes found live ids.
    Now every attempt gets 128 random bits, and an id that is not live is `expired` if it has our
    shape and `unknown` if not: the same answer for a spent id and a guessed one. An id answered
    before (which only its holder knows) is `already`.
    """
    app = RecordingApp(policy=lambda _d: Response(202))
    async with rig(broker, unique, tmp_path, app) as r:
        await r.produce([Rec(key=f"k{i}".encode(), value=f"v{i}".encode()) for i in range(3)])
        await wait_until(lambda: len(app.deliveries) >= 1, 15, "the first delivery")
        first = app.deliveries[0]
        code, body = await r.sc.post_json("/v1/acks", [{"id": first.delivery_id, "ack": "accept"}])
        assert [x["result"] for x in body["results"]] == ["ok"], body
        await wait_until(lambda: len(app.deliveries) >= 3, 15, "three deliveries")
        ids = [d.delivery_id for d in app.deliveries]
        assert len(set(ids)) == 3
        for delivery_id in ids:
            assert is_delivery_id(delivery_id), delivery_id
            assert r.topic not in delivery_id and "/" not in delivery_id
        # Guesses in the old grammars, next to the live ones, and a well-formed id never issued.
        guesses = [
            f"{r.topic}/0/{first.offset + 1}/1.1",
            f"{r.topic}/0/{first.offset + 1}/1.999",
            f"{r.topic}/0/{first.offset + 1}.1.1",
            "A" * len(first.delivery_id),
            first.delivery_id,  # spent
        ]
        code, body = await r.sc.post_json("/v1/acks", [{"id": g, "ack": "accept"} for g in guesses])
        assert code == 200, body
        assert [set(x) for x in body["results"]] == [{"id", "result"}] * len(guesses)
        assert [x["result"] for x in body["results"]] == [
            "unknown",
            "unknown",
            "unknown",
            "expired",
            "already",  # answered: a second answer is ignored and says so
        ], body
        # Nothing was applied: the live records are still waiting for their answers.
        code, body = await r.sc.post_json("/v1/acks", [{"id": i, "ack": "accept"} for i in ids[1:]])
        assert [x["result"] for x in body["results"]] == ["ok", "ok"], body
        await r.committed_at_end()
        assert await r.sc.stop() == 0


async def test_deferred_answers_through_the_ack_api(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    app = RecordingApp(policy=lambda _d: Response(202))
    names = ["accept", "reject", "release", "renew", "late"]
    lock_ms = 5000

    def ids(name: str) -> list[str]:
        return [d.delivery_id for d in app.deliveries if d.value == name.encode()]

    async with rig(
        broker,
        unique,
        tmp_path,
        app,
        extra={"share.record.lock.duration.ms": lock_ms},
        app_extra={"timeout.ms": 1000},
    ) as r:
        sc = r.sc
        await r.produce([Rec(key=n.encode(), value=n.encode()) for n in names])
        await wait_until(lambda: len(app.deliveries) >= 5, 60, "5 first deliveries")
        first_seen = trio.current_time()
        assert all(d.delivery_count == 1 for d in app.deliveries)

        code, body = await sc.post_json(
            "/v1/acks",
            {
                "acks": [
                    {"id": ids("accept")[0], "ack": "accept"},
                    {
                        "id": ids("reject")[0],
                        "ack": "reject",
                        "error": {"class": "app.Poison", "message": "cannot parse"},
                    },
                    {"id": ids("release")[0], "ack": "release"},
                    {"id": "no-such-delivery", "ack": "accept"},
                ]
            },
        )
        assert code == 200, body
        results = [x["result"] for x in body["results"]]
        assert results == ["ok", "ok", "ok", "unknown"], body

        # Malformed bodies are the caller's error, and change nothing.
        code, raw = await sc.post_raw("/v1/acks", b"{not json")
        assert code == 400, raw
        code, _ = await sc.post_json("/v1/acks", {"acks": [{"id": ids("late")[0], "ack": "maybe"}]})
        assert code == 400
        code, _ = await sc.post_json("/v1/acks", {"acks": [{"ack": "accept"}]})
        assert code == 400

        # The released record comes back with delivery count 2; accept it through the API.
        await wait_until(lambda: len(ids("release")) == 2, 30, "the released record again")
        code, body = await sc.post_json("/v1/acks", [{"id": ids("release")[1], "ack": "accept"}])
        assert [x["result"] for x in body["results"]] == ["ok"]

        # Renew late in the first lock; past the first deadline the renewed record still holds its
        # lock while the unanswered one lost it.
        await trio.sleep_until(first_seen + lock_ms / 1000 * 0.5)
        code, body = await sc.post_json("/v1/acks", [{"id": ids("renew")[0], "ack": "renew"}])
        assert [x["result"] for x in body["results"]] == ["ok"], body
        await trio.sleep_until(first_seen + lock_ms / 1000 + 0.5)
        code, body = await sc.post_json("/v1/acks", [{"id": ids("renew")[0], "ack": "accept"}])
        assert [x["result"] for x in body["results"]] == ["ok"], body
        await wait_until(lambda: len(ids("late")) == 2, 30, "the expired record again")
        code, body = await sc.post_json("/v1/acks", [{"id": ids("late")[0], "ack": "accept"}])
        assert [x["result"] for x in body["results"]] == ["expired"], body
        code, body = await sc.post_json("/v1/acks", [{"id": ids("late")[1], "ack": "accept"}])
        assert [x["result"] for x in body["results"]] == ["ok"], body
        # An answered id is spent: a second answer says `already`.
        code, body = await sc.post_json("/v1/acks", [{"id": ids("accept")[0], "ack": "accept"}])
        assert [x["result"] for x in body["results"]] == ["already"], body

        await r.committed_at_end()
        dlq = await r.read_dlq(1)
        st = await sc.status()
        code, metrics = await sc.get("/metrics")
        assert code == 200
        assert await sc.stop() == 0

    counts = counts_by_value(app.deliveries)
    assert counts == {
        b"accept": [1],
        b"reject": [1],
        b"release": [1, 2],
        b"renew": [1],
        b"late": [1, 2],
    }, counts
    # Each final answer through /v1/acks (not the renew, not the expired ones) is timed from its
    # `deferred` answer: six; the renewed record's came after its first lock (5 s) had passed.
    m = prometheus_values(metrics)
    assert m["dlq_sidecar_app_ack_delay_seconds_count"] == 6, metrics
    assert m['dlq_sidecar_app_ack_delay_seconds_bucket{le="5.0"}'] == 5, metrics
    assert m["dlq_sidecar_app_ack_delay_seconds_sum"] >= lock_ms / 1000
    c = st["counters"]
    assert c["delivered"].get("accept") == 4
    assert c["delivered"].get("reject") == 1
    assert c["delivered"].get("release") == 1
    assert c["delivered"].get("lock_expired") == 1
    assert c["archived"] == {"rejected": 1}
    assert len(dlq) == 1
    assert header(dlq[0], "__dlq.errors.exception.class.name") == "app.Poison"
    assert header(dlq[0], "__dlq.errors.exception.message") == "cannot parse"
    assert header(dlq[0], "__dlq.errors.offset") == "1"


# --------------------------------------------------------------------------------------------- bytes


async def test_records_reach_a_unix_socket_app_byte_exact(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    recs = [
        Rec(key=None, value=None),
        Rec(key=b"", value=b""),
        Rec(key=b"\x00\xff\xfe binary\r\n", value=b"\xff\xfe\x00\x80 not utf-8"),
        Rec(key=b" padded ", value=b"x"),
        Rec(key="ключ".encode(), value="значение".encode()),
        Rec(
            key=b"plain",
            value=b"{}",
            headers=(
                ("rep", b"one"),
                ("rep", b"\xff\x00two"),
                ("empty", b""),
                ("null", None),
                ("r\xe9p=%", b"a=b%c d"),
                ("rep", b"three"),
            ),
        ),
        Rec(key=b"big", value=bytes(range(256)) * 1000),
    ]
    app = RecordingApp()
    async with running_sidecar(
        broker, tmp_path, app, unique=unique, transport="unix", extra=FAST, produce_first=recs
    ) as r:
        topic, sc = r.topic, r.sc
        await wait_until(lambda: len(app.deliveries) >= len(recs), 60, "every record")
        await wait_committed_at_end(broker, r.group, topic, 1)
        assert await sc.stop() == 0

    got = sorted(app.deliveries, key=lambda d: d.offset)
    assert [d.offset for d in got] == list(range(len(recs)))
    for rec, d in zip(recs, got, strict=True):
        assert d.key == rec.key, (d.offset, d.key, rec.key)
        assert d.value == rec.value, d.offset
        assert d.headers == list(rec.headers), (d.offset, d.headers)
        assert d.topic == topic and d.partition == 0 and d.delivery_count == 1
    names = [[n for n, _ in d.raw_headers] for d in got]
    # Null key: no Kafka-Key at all; empty key: present and empty.
    assert "kafka-key" not in names[0]
    assert "kafka-key" in names[1]
    assert "kafka-value-null" in names[0] and "kafka-value-null" not in names[1]


# --------------------------------------------------------------------------------------------- app down


async def test_app_down_is_not_an_attempt_and_delivery_resumes_when_it_starts(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    app = RecordingApp()
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        serve=False,  # nothing listens at the app's port yet
        extra={**FAST, "delivery.count.limit": 2},
        app_extra={"connect.backoff.initial.ms": 100, "connect.backoff.max.ms": 300},
        produce_first=[Rec(key=f"k{i}".encode(), value=b"v") for i in range(20)],
    ) as r:
        topic, group, sc = r.topic, r.group, r.sc
        await sc.wait_assigned(1)
        st = await wait_status(
            sc, lambda s: s["counters"]["not_attempted"] > 0, 60, "a not-attempted delivery"
        )
        await trio.sleep(3)  # many connection backoffs: more than the delivery count limit
        code, ready = await sc.get("/readyz")
        assert code == 503, ready
        assert ready["checks"]["app_reachable"] is False
        st = await sc.status()
        c = st["counters"]
        assert c["attempts"] == 0, c
        assert c["not_attempted"] > 0
        assert c["archived"] == {} and c["dlq_written"] == 0
        assert st["app_reachable"] is False
        assert st["paused_partitions"], "intake is not paused while the app is down"

        async with r.serve_app():
            await wait_until(lambda: len(app.deliveries) >= 20, 60, "20 deliveries")
            await wait_committed_at_end(broker, group, topic, 1)
            code, ready = await sc.get("/readyz")
            assert code == 200, ready
            st = await sc.status()
            assert await sc.stop() == 0
    assert sorted(d.offset for d in app.deliveries) == list(range(20))
    assert all(d.delivery_count == 1 for d in app.deliveries)
    assert st["counters"]["attempts"] == 20
    assert st["counters"]["archived"] == {}
    dlq = f"dlq.{topic}"
    assert not broker.topic_exists(dlq) or broker.count_records(dlq) == 0


# --------------------------------------------------------------------------------------------- malformed


async def test_malformed_answers_are_never_accepts_and_end_in_the_dlq(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    async def policy(d: Delivery) -> Response:
        kind = d.value
        if kind == b"badjson":
            return Response(200, (("Content-Type", "application/json"),), b'{"ack": "accept"')
        if kind == b"unknownack":
            return json_answer({"ack": "maybe"})
        if (
            kind == b"gone"
        ):  # (a 404 page would be a missing route: no attempt, see test_app_route_missing)
            return Response(410, (("Content-Type", "text/plain"),), b"gone")
        if kind == b"boom":
            return Response(500, (("Content-Type", "text/plain"),), b"internal error")
        if kind == b"slow":
            await trio.sleep(1.5)
            return Response(200)
        return Response(200)

    app = RecordingApp(policy=policy)
    kinds = {
        b"badjson": "sidecar.MalformedAnswer",
        b"unknownack": "sidecar.MalformedAnswer",
        b"gone": "sidecar.HttpStatus410",
        b"boom": "sidecar.HttpStatus500",
        b"slow": "sidecar.AppTimeout",
    }
    order = [*kinds, b"fine"]
    async with rig(
        broker,
        unique,
        tmp_path,
        app,
        extra={"delivery.count.limit": 2},
        app_extra={"timeout.ms": 400},
    ) as r:
        await r.produce([Rec(key=k, value=k) for k in order])
        dlq = await r.read_dlq(5)
        await r.committed_at_end()
        st = await r.sc.status()
        assert await r.sc.stop() == 0

    counts = counts_by_value(app.deliveries)
    for kind in kinds:
        assert counts[kind] == [1, 2], (kind, counts[kind])
    assert counts[b"fine"] == [1]
    c = st["counters"]
    assert c["delivered"].get("accept") == 1, c  # only "fine"
    assert c["delivered"].get("release") == 10, c
    assert c["archived"] == {"delivery_count_exceeded": 5}
    assert len(dlq) == 5
    by_offset = {int(header(d, "__dlq.errors.offset") or -1): d for d in dlq}
    for offset, kind in enumerate(order[:5]):
        d = by_offset[offset]
        assert header(d, "__dlq.errors.exception.class.name") == kinds[kind], kind
        assert header(d, "__dlq.errors.message") == "Offset delivery count exceeded the threshold."
        assert header(d, "__dlq.errors.delivery.count") == "2"
        assert header(d, "__dlq.errors.topic") == r.topic


# --------------------------------------------------------------------------------------------- idle CPU


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_a_due_retry_with_no_room_to_acquire_does_not_spin(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """A released record's retry time comes while the only in-flight place is held (a deferred
    answer): the scheduler must wait for room, not wake over and over (it once burnt a core)."""

    def policy(d: Delivery) -> Response:
        if d.value == b"rel" and d.delivery_count == 1:
            return json_answer({"ack": "release", "retry_after_ms": 100})
        if d.value == b"defer":
            return Response(202)
        return Response(200)

    app = RecordingApp(policy=policy)
    async with rig(broker, unique, tmp_path, app, extra={"max.in.flight.records": 1}) as r:
        await r.produce([Rec(key=b"r", value=b"rel"), Rec(key=b"d", value=b"defer")])
        await wait_until(lambda: any(d.value == b"defer" for d in app.deliveries), 60, "defer")
        pid = r.sc.proc.pid
        await trio.sleep(0.5)  # the retry time has come; no room until the deferred answer
        before = _cpu_s(pid)
        await trio.sleep(3.0)
        used = _cpu_s(pid) - before
        assert [d.value for d in app.deliveries].count(b"rel") == 1
        # Idle, the sidecar wakes a few times a second (polls, commits): well under a tenth of a core.
        assert used < 0.6, f"the sidecar used {used:.2f} CPU s in 3 s while it had nothing to do"
        deferred = next(d for d in app.deliveries if d.value == b"defer")
        code, body = await r.sc.post_json(
            "/v1/acks", [{"id": deferred.delivery_id, "ack": "accept"}]
        )
        assert code == 200, body
        await wait_until(
            lambda: [d.value for d in app.deliveries].count(b"rel") == 2, 60, "the retry"
        )
