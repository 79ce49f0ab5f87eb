"""Retry tiers on the real broker (consumer engine): a long release goes to a tier topic, its source offset
is committed, and it comes back to the app as the original, not before it is due, its count going on.

The tiers are 1, 2 and 3 s (the mechanism is the one of 1 min ... 1 d). Each test states what it measures;
`SLACK_S` is the lateness allowed past a record's due time (the due time is written in the tier record's
`__dlq.retry.due` header, read back here from the tier topics).
"""

from __future__ import annotations

import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import trio
from confluent_kafka import KafkaException

from sidecar.core.commitstate import decode
from sidecar.core.tiers import H_COUNT, H_DUE, H_OFFSET, H_TIERS, H_TOPIC, TIERS_HEADER
from sidecar.http.server import Response
from tests.harness import (
    FAST,
    Delivery,
    RecordingApp,
    counts_by_value,
    json_answer,
    restartable_member,
    running_sidecar,
    wait_committed_at_end,
    wait_until,
    wait_until_thread,
)
from tests.kafkatools import Broker, Rec

TIERS = ["1s", "2s", "3s"]
# A due record is delivered within this much of its due time (the scheduler wakes for it; the fetch
# after the resume of its tier partition comes first).
SLACK_S = 1.0


def tier_settings(**extra: Any) -> dict[str, Any]:
    return {
        **FAST,
        "errors.retry.tiers": TIERS,
        "errors.retry.tier.threshold.ms": 500,
        "delivery.count.limit": 4,
        **extra,
    }


class TieredApp:
    """Releases `retry-*` records with a Retry-After that picks tier 1s, 2s, 3s for counts 1, 2, 3
    (count 4 is the limit: its release goes to the DLQ); accepts the rest. Records wall times."""

    def __init__(self, *, accept_at: int | None = None) -> None:
        self.accept_at = accept_at
        self.wall: dict[tuple[int, int], float] = {}  # (offset, count) -> wall time received
        self.app = RecordingApp(policy=self.policy)

    def policy(self, d: Delivery) -> Response:
        self.wall[(d.offset, d.delivery_count)] = time.time()
        if not (d.value or b"").startswith(b"retry"):
            return Response(200)
        if self.accept_at is not None and d.delivery_count >= self.accept_at:
            return Response(200)
        if d.delivery_count < 4:
            return json_answer(
                {
                    "ack": "release",
                    "retry_after_ms": 1000 * d.delivery_count,
                    "error": {"class": "com.example.Busy", "message": f"try {d.delivery_count}"},
                }
            )
        return json_answer({"ack": "release"})


def read_tier(broker: Broker, topic: str, expected: int) -> list[Rec]:
    return broker.read_topic(topic, expected, timeout_s=30)


async def test_counts_go_on_across_tiers_due_times_hold_and_the_dlq_names_the_source(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    retries = [
        Rec(key=f"k{i}".encode(), value=f"retry-{i}".encode(), headers=(("h", b"v"),))
        for i in range(3)
    ]
    clean = [Rec(key=f"c{i}".encode(), value=f"ok-{i}".encode()) for i in range(20)]
    tiered = TieredApp()
    async with running_sidecar(
        broker,
        tmp_path,
        tiered.app,
        unique=unique,
        extra=tier_settings(),
        produce_first=retries + clean,
    ) as rig:
        topic, group = rig.topic, rig.group
        tier_topics = [f"dlq.{topic}.retry.{t}" for t in TIERS]
        # The source partition's commit moves past the released records while they wait in a tier.
        await wait_committed_at_end(broker, group, topic, 1, timeout_s=30)
        assert all(tiered.wall.get((i, 2)) is None for i in range(3)), "delivered again too soon"
        # While they wait: /v1/status counts them per tier.
        waiting = await rig.sc.wait_status(
            lambda st: sum((r["waiting"] or 0) for r in st["retry_tiers"].values()) >= 1,
            10,
            "records waiting in a tier",
        )
        assert set(waiting["retry_tiers"]) == set(TIERS)
        dlq = await rig.read_dlq(3, timeout_s=40)
        stat = await rig.sc.wait_status(
            lambda st: all(r["waiting"] == 0 for r in st["retry_tiers"].values()),
            10,
            "every tier done",
        )
        _code, metrics = await rig.sc.get("/metrics")
        log_text = rig.sc.log_text()
    # Records waiting in a tier partition are its normal state, not a capacity problem.
    assert "nears offset.metadata.max.bytes" not in log_text, log_text[-3000:]
    assert len(dlq) == 3
    counts: dict[bytes | None, list[int]] = defaultdict(list)
    for d in tiered.app.deliveries:
        counts[d.value].append(d.delivery_count)
        # Delivered as the original: its topic, partition, offset, key and headers.
        assert d.topic == topic and d.partition == 0
        if (d.value or b"").startswith(b"retry"):
            i = int((d.value or b"")[6:])
            assert (d.offset, d.key) == (i, f"k{i}".encode())
            assert ("h", b"v") in d.headers and not any(n.startswith("__dlq") for n, _ in d.headers)
    for i in range(3):
        assert counts[f"retry-{i}".encode()] == [1, 2, 3, 4]  # continuous across the tiers
    for rec in clean:
        assert counts[rec.value] == [1]
    # The DLQ record names the original source and the tiers it went through.
    for rec in dlq:
        assert rec.header("__dlq.errors.topic") == topic
        assert rec.header("__dlq.errors.delivery.count") == "4"
        assert rec.header(TIERS_HEADER) == "1s,2s,3s"
        assert rec.header("__dlq.errors.exception.class.name") == "com.example.Busy"
    assert sorted(int(r.header("__dlq.errors.offset") or -1) for r in dlq) == [0, 1, 2]
    # Due times: never early, late by at most SLACK_S.
    late: list[float] = []
    for tier, name in enumerate(tier_topics):
        for rec in await trio.to_thread.run_sync(read_tier, broker, name, 3):
            assert rec.header(H_TOPIC) == topic
            count = int(rec.header(H_COUNT) or 0)
            assert count == tier + 1
            assert rec.header(H_TIERS) == ",".join(TIERS[: tier + 1])
            due = int(rec.header(H_DUE) or 0) / 1000
            got = tiered.wall[(int(rec.header(H_OFFSET) or -1), count + 1)]
            assert got >= due, f"delivered {due - got:.3f}s before its due time"
            late.append(got - due)
    assert len(late) == 9
    assert max(late) <= SLACK_S, late
    print(f"lateness past due: max {max(late):.3f}s, mean {sum(late) / len(late):.3f}s")
    assert stat["counters"]["tiers"]["written"] == {"1s": 3, "2s": 3, "3s": 3}
    assert stat["counters"]["tiers"]["delivered"] == {"1s": 3, "2s": 3, "3s": 3}
    for t in TIERS:
        assert f'dlq_sidecar_tier_written_total{{tier="{t}"}} 3.0' in metrics
        assert f'dlq_sidecar_tier_waiting{{tier="{t}"}} 0.0' in metrics


async def test_kill_9_with_records_in_every_tier_then_restart_delivers_each_once_more(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """Record i is released at count 1 into tier i (1s, 2s, 3s); the sidecar is killed once all three
    wait in their tiers (source committed), then restarted: each comes once more, at count 2."""
    recs = [Rec(key=f"k{i}".encode(), value=f"wait-{i}".encode()) for i in range(3)]
    seen: dict[bytes | None, list[int]] = defaultdict(list)

    def policy(d: Delivery) -> Response:
        seen[d.value].append(d.delivery_count)
        if d.delivery_count == 1:
            i = int((d.value or b"0")[5:])
            return json_answer({"ack": "release", "retry_after_ms": 1000 * (i + 1)})
        return Response(200)

    app = RecordingApp(policy=policy)
    kafka = restartable_member(unique)
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        extra=tier_settings(),
        kafka_extra=kafka,
        produce_first=recs,
    ) as rig:
        topic, group = rig.topic, rig.group
        await wait_committed_at_end(broker, group, topic, 1, timeout_s=30)
        assert await rig.sc.stop(signal.SIGKILL) == -signal.SIGKILL
    # Killed with every record waiting in a tier (none delivered twice yet).
    assert dict(seen) == {r.value: [1] for r in recs}, dict(seen)
    ends = {t: broker.end_offsets(f"dlq.{topic}.retry.{t}", [0])[0] for t in TIERS}
    assert ends == {"1s": 1, "2s": 1, "3s": 1}
    app2 = RecordingApp(policy=policy)
    async with running_sidecar(
        broker,
        tmp_path,
        app2,
        topic=topic,
        group=group,
        config_name="again.yaml",
        extra=tier_settings(),
        kafka_extra=kafka,
    ):
        await wait_until(lambda: len(app2.deliveries) >= 3, 40, "the three tier records delivered")
        await trio.sleep(1.5)  # room for a double delivery to show
    assert dict(seen) == {r.value: [1, 2] for r in recs}, dict(seen)
    assert all((d.topic, d.offset) == (topic, int((d.value or b"")[5:])) for d in app2.deliveries)


async def test_kill_9_while_30_records_wait_in_a_5s_tier_isolates_only_the_record_in_flight(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """Thirty records are released into a 5 s tier (tiers 5s, 30s) and a 31st is at the app when
    the sidecar is killed (SIGKILL), with the tier partition's state committed. After the restart
    only the 31st is isolated (it may have killed the sidecar); the thirty were never handed out
    before the death: no isolation pass on the tier partition, each delivered once at count 2 when
    due, in normal delivery. Prints each tier record's lateness past its due time."""
    n = 30
    tiers = ["5s", "30s"]
    recs = [Rec(key=f"k{i}".encode(), value=f"tier-{i}".encode()) for i in range(n)]
    recs.append(Rec(key=b"hold", value=b"hold"))
    at_app = trio.Event()
    let_go = trio.Event()
    wall: dict[tuple[bytes | None, int], float] = {}

    async def policy(d: Delivery) -> Response:
        wall.setdefault((d.value, d.delivery_count), time.time())
        if d.value == b"hold":
            if not at_app.is_set():
                at_app.set()
                await let_go.wait()  # at the app when the sidecar dies: never answered
            return Response(200)
        if d.delivery_count == 1:
            return json_answer({"ack": "release", "retry_after_ms": 5000})
        return Response(200)

    app = RecordingApp(policy=policy)
    kafka = restartable_member(unique)
    settings = tier_settings(**{"errors.retry.tiers": tiers})
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        extra=settings,
        kafka_extra=kafka,
        produce_first=recs,
    ) as rig:
        topic, group = rig.topic, rig.group
        tier_topic = f"dlq.{topic}.retry.5s"
        with trio.fail_after(30):
            await at_app.wait()

        def tier_state_committed() -> bool:
            # The source offset past the thirty (the held one next), the thirty in the tier topic,
            # and the tier partition's state committed with the records it took so far (their
            # counts). It may have taken only the first of them: a tier partition pauses once it
            # holds records not yet due, so the rest may be fetched only when they fall due.
            if broker.committed(group, topic, [0])[0][0] != n:
                return False
            if broker.end_offsets(tier_topic, [0])[0] != n:
                return False
            _offset, metadata = broker.committed(group, tier_topic, [0])[0]
            state = decode(metadata) if metadata else None
            return state is not None and state.count(0) == 1

        await wait_until_thread(tier_state_committed, 30, "the source and tier states committed")
        assert await rig.sc.stop(signal.SIGKILL) == -signal.SIGKILL
        killed_at = time.time()
        let_go.set()
    assert all(wall.get((r.value, 2)) is None for r in recs[:n]), "due before the kill: too slow"
    app2 = RecordingApp(policy=policy)
    async with running_sidecar(
        broker,
        tmp_path,
        app2,
        topic=topic,
        group=group,
        config_name="again.yaml",
        extra=settings,
        kafka_extra=kafka,
    ) as rig2:
        await wait_until(
            lambda: all((r.value, 2) in wall for r in recs[:n]) and len(app2.deliveries) >= n + 1,
            60,
            "the tier records and the held one delivered again",
        )
        status = await rig2.sc.wait_status(
            lambda st: not st["isolation_active"], 30, "the isolation pass over"
        )
        log_text = rig2.sc.log_text()
    due = {
        rec.value: int(rec.header(H_DUE) or 0) / 1000
        for rec in await trio.to_thread.run_sync(read_tier, broker, tier_topic, n)
    }
    late = sorted(wall[(r.value, 2)] - due[r.value] for r in recs[:n])
    arrivals = sorted(wall[(r.value, 2)] for r in recs[:n])
    print(
        f"\nkilled {min(due.values()) - killed_at:.2f}s before the first due time; lateness past "
        f"due: min {late[0]:.3f}s, median {late[n // 2]:.3f}s, max {late[-1]:.3f}s; the {n} "
        f"arrived within {arrivals[-1] - arrivals[0]:.3f}s; suspects {status['suspects_total']}, "
        f"isolated {status['isolated_total']}"
    )
    print("\n".join(line for line in log_text.splitlines() if "isolation pass" in line))
    counts = counts_by_value(app2.deliveries)
    assert counts == {**{r.value: [2] for r in recs[:n]}, b"hold": [1]}, counts
    assert late[0] >= 0, f"delivered {-late[0]:.3f}s before its due time"
    # Only the record at the app when the sidecar died was a suspect.
    assert (status["suspects_total"], status["isolated_total"]) == (1, 1), status
    assert f"isolation pass on {topic}[0]: 1 suspects" in log_text, log_text[-3000:]
    assert f"isolation pass on {tier_topic}" not in log_text, log_text[-3000:]


async def test_transactional_dlq_writes_the_tier_record_and_the_commit_together(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    tiered = TieredApp(accept_at=3)
    recs = [Rec(key=f"k{i}".encode(), value=f"retry-{i}".encode()) for i in range(3)]
    async with running_sidecar(
        broker,
        tmp_path,
        tiered.app,
        unique=unique,
        extra=tier_settings(**{"errors.deadletterqueue.transactional.enable": True}),
        produce_first=recs,
    ) as rig:
        await wait_until(lambda: len(tiered.app.deliveries) >= 9, 30, "three rounds")
        await wait_committed_at_end(broker, rig.group, rig.topic, 1, timeout_s=30)
        stat = await rig.sc.status()
        # Each tier record is in a committed transaction (a reader at read_committed sees it).
        for t in TIERS[:2]:
            got = await trio.to_thread.run_sync(
                broker.read_committed_to_end, f"dlq.{rig.topic}.retry.{t}"
            )
            assert sorted(int(r.header(H_OFFSET) or -1) for r in got) == [0, 1, 2]
    counts = defaultdict(list)
    for d in tiered.app.deliveries:
        counts[d.value].append(d.delivery_count)
    assert {v: c for v, c in counts.items()} == {r.value: [1, 2, 3] for r in recs}
    assert stat["counters"]["tiers"]["written"] == {"1s": 3, "2s": 3}


async def test_a_copy_of_a_tier_record_is_not_delivered_twice(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """At least once: a tier write whose source commit was lost is written again, with the same
    original and count. Two such copies (made here by hand) are delivered once; another group's
    tier record in the same topic is not delivered."""
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    due = str(int(time.time() * 1000)).encode()
    tier_rec = Rec(
        key=b"k",
        value=b"copy",
        headers=(
            (H_TOPIC, topic.encode()),
            ("__dlq.retry.partition", b"0"),
            (H_OFFSET, b"7"),
            (H_COUNT, b"2"),
            (H_DUE, due),
            (H_TIERS, b"1s"),
            ("__dlq.retry.group", f"g-{unique}".encode()),
        ),
    )
    # Another group's retry of the same source topic in the same tier topic: not ours.
    foreign = Rec(
        key=b"k",
        value=b"theirs",
        headers=(*tier_rec.headers[:-1], ("__dlq.retry.group", b"another-group")),
    )
    tier_topic = f"dlq.{topic}.retry.1s"
    await trio.to_thread.run_sync(lambda: broker.create_topic(tier_topic))
    await trio.to_thread.run_sync(broker.produce, tier_topic, [tier_rec, foreign, tier_rec])
    app = RecordingApp()
    async with running_sidecar(
        broker, tmp_path, app, topic=topic, group=f"g-{unique}", extra=tier_settings()
    ) as rig:
        await wait_committed_at_end(broker, rig.group, tier_topic, 1, timeout_s=30)
        stat = await rig.sc.status()
    assert [(d.topic, d.offset, d.delivery_count) for d in app.deliveries] == [(topic, 7, 3)]
    assert stat["counters"]["tiers"]["duplicates"] == 1
    assert stat["counters"]["tiers"]["other_group"] == 1


async def test_a_tier_topic_that_cannot_be_written_stops_the_sidecar_without_committing(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """The 1s tier topic takes records of at most 1000 bytes (max.message.bytes); a 4000-byte record
    released to it stops the sidecar, its source offset not committed; restarted with the limit
    raised, the record goes through the tier and is delivered at count 2."""
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    tier_topic = f"dlq.{topic}.retry.1s"
    await trio.to_thread.run_sync(
        lambda: broker.create_topic(tier_topic, config={"max.message.bytes": "1000"})
    )
    big = Rec(key=b"big", value=b"retry-" + b"x" * 4000)
    small = Rec(key=b"small", value=b"ok")
    tiered = TieredApp(accept_at=2)
    async with running_sidecar(
        broker,
        tmp_path,
        tiered.app,
        topic=topic,
        group=f"g-{unique}",
        extra=tier_settings(),
        produce_first=[big, small],
    ) as rig:
        code = await rig.sc.wait_exit(30)
        log = rig.sc.log_text()
    assert code not in (0, None)
    assert "retry tier" in log and tier_topic in log
    committed = await trio.to_thread.run_sync(broker.committed, rig.group, topic, [0])
    assert committed[0][0] in (None, -1001, 0), committed  # not past the record
    # Raised limit: nothing was dropped, the record comes back through its tier.
    await trio.to_thread.run_sync(
        lambda: broker.admin.incremental_alter_configs(
            [_topic_config(tier_topic, "max.message.bytes", "1048588")]
        )[_topic_resource(tier_topic)].result(30)
    )
    async with running_sidecar(
        broker,
        tmp_path,
        tiered.app,
        topic=topic,
        group=rig.group,
        config_name="again.yaml",
        extra=tier_settings(),
    ) as rig2:
        await wait_until(
            lambda: (0, 2) in tiered.wall, 30, "the large record delivered from its tier"
        )
        await wait_committed_at_end(broker, rig2.group, topic, 1, timeout_s=30)


def _topic_resource(topic: str) -> Any:
    from confluent_kafka.admin import ConfigResource, ResourceType

    return ConfigResource(ResourceType.TOPIC, topic)


def _topic_config(topic: str, name: str, value: str) -> Any:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    resource = _topic_resource(topic)
    resource.add_incremental_config(
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    )
    return resource


async def test_share_engine_writes_long_releases_to_a_tier_accepts_them_and_reads_them_back(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """engine: share: a long release goes to its tier and is ACCEPTed on the share group (the broker
    never redelivers it); the tier reader (consumer group `<group>.tiers`) delivers it as the original
    when due, its count going on (1s tier, then 2s, then the DLQ at the limit, naming the source)."""
    recs = [Rec(key=f"k{i}".encode(), value=f"retry-{i}".encode()) for i in range(2)]
    recs += [Rec(key=b"c", value=b"ok")]
    tiered = TieredApp()
    async with running_sidecar(
        broker,
        tmp_path,
        tiered.app,
        unique=unique,
        extra=tier_settings(**{"engine": "share", "ordering": "none", "delivery.count.limit": 3}),
        produce_first=recs,
    ) as rig:
        await wait_until(
            lambda: sum(1 for d in tiered.app.deliveries if d.delivery_count == 3) >= 2,
            30,
            "both records at count 3",
        )
        dlq = await rig.read_dlq(2, timeout_s=30)
        stat = await rig.sc.status()
        topic, group = rig.topic, rig.group
        tier_recs = await trio.to_thread.run_sync(read_tier, broker, f"dlq.{topic}.retry.1s", 2)
        await trio.sleep(1.0)  # a broker redelivery by mistake would show here
    counts: dict[bytes | None, list[int]] = defaultdict(list)
    for d in tiered.app.deliveries:
        counts[d.value].append(d.delivery_count)
        assert (d.topic, d.partition) == (topic, 0)
    assert counts[b"retry-0"] == [1, 2, 3] and counts[b"retry-1"] == [1, 2, 3], dict(counts)
    assert counts[b"ok"] == [1]
    assert {d.offset for d in tiered.app.deliveries if d.value == b"retry-1"} == {1}
    assert all(r.header("__dlq.retry.group") == group for r in tier_recs)
    for rec in dlq:
        assert rec.header("__dlq.errors.topic") == topic
        assert rec.header(TIERS_HEADER) == "1s,2s"
    assert stat["counters"]["tiers"]["written"] == {"1s": 2, "2s": 2}
    assert set(stat["retry_tiers"]) == set(TIERS)
    late = [
        tiered.wall[(int(r.header(H_OFFSET) or -1), 2)] - int(r.header(H_DUE) or 0) / 1000
        for r in tier_recs
    ]
    assert all(0 <= x <= SLACK_S for x in late), late


async def test_share_engine_kill_9_with_records_in_every_tier_then_restart(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """engine: share: record i released at count 1 into tier i and ACCEPTed on the share group; the
    sidecar is killed once all three wait in their tiers and the ACCEPTs reached the broker, then
    restarted: each comes once more from its tier, at count 2 (the share group never redelivers)."""
    recs = [Rec(key=f"k{i}".encode(), value=f"wait-{i}".encode()) for i in range(3)]
    seen: dict[bytes | None, list[int]] = defaultdict(list)

    def policy(d: Delivery) -> Response:
        seen[d.value].append(d.delivery_count)
        if d.delivery_count == 1:
            i = int((d.value or b"0")[5:])
            return json_answer({"ack": "release", "retry_after_ms": 1000 * (i + 1)})
        return Response(200)

    settings = tier_settings(**{"engine": "share", "ordering": "none"})
    kafka = restartable_member(unique)  # the tier reader's; the share consumers drop these
    app = RecordingApp(policy=policy)
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        extra=settings,
        kafka_extra=kafka,
        produce_first=recs,
    ) as rig:
        topic, group = rig.topic, rig.group

        def waiting_in_tiers() -> bool:
            try:
                ends = [broker.end_offsets(f"dlq.{topic}.retry.{t}", [0])[0] for t in TIERS]
            except KafkaException:  # not created yet
                return False
            return ends == [1, 1, 1]

        with trio.fail_after(30):
            while not await trio.to_thread.run_sync(waiting_in_tiers):
                await trio.sleep(0.05)
        await rig.sc.wait_status(
            lambda st: st["counters"]["commits"] >= 1 and st["in_flight"] == 0,
            5,
            "the ACCEPTs acknowledged",
        )
        assert await rig.sc.stop(signal.SIGKILL) == -signal.SIGKILL
    assert dict(seen) == {r.value: [1] for r in recs}, dict(seen)
    app2 = RecordingApp(policy=policy)
    async with running_sidecar(
        broker,
        tmp_path,
        app2,
        topic=topic,
        group=group,
        config_name="again.yaml",
        extra=settings,
        kafka_extra=kafka,
    ):
        await wait_until(lambda: len(app2.deliveries) >= 3, 40, "the three tier records delivered")
        await trio.sleep(1.5)  # room for a double delivery to show
    assert dict(seen) == {r.value: [1, 2] for r in recs}, dict(seen)
    assert all((d.topic, d.offset) == (topic, int((d.value or b"")[5:])) for d in app2.deliveries)
