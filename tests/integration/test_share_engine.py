"""The share-group engine (`engine: share`) against the real Kafka 4.4 broker with share groups enabled.

The sidecar runs as a subprocess (tests/harness.py). Share groups start slowly (the broker assigns
share partitions on an interval), so the waits here are generous.

The last section tests the start-up check functions directly: a broker without share groups cannot be
made from the shared test broker, so `check_broker_configs` and `read_share_settings` get the
configuration a pre-share-groups broker would describe (a stand-in admin object for the latter).
"""

from __future__ import annotations

import re
import signal
import uuid
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from sidecar.config import load_config
from sidecar.http.server import Response, json_response
from sidecar.kafka.share import (
    ShareGroupLimitUnsafe,
    ShareGroupsUnavailable,
    check_broker_configs,
    read_share_settings,
    refusal_from_error,
    share_consumer_properties,
)
from tests.harness import (
    Delivery,
    RecordingApp,
    Sidecar,
    by_value,
    by_value_records,
    running_sidecar,
    wait_until,
    write_config,
)
from tests.harness import wait_until_thread as _wait_thread
from tests.kafkatools import Broker, Rec

SHARE = {"engine": "share", "ordering": "none"}


def _produce_in_small_batches(broker: Broker, topic: str, n: int, per_batch: int = 4) -> None:
    """Values v0..v{n-1}, a few per producer batch.

    A share partition hands out whole record batches: one 500-record producer batch goes to a single
    consumer however small its max.poll.records. Small batches are what a live stream looks like.
    """
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(n):
        producer.produce(topic, value=f"v{i}".encode())
        if i % per_batch == per_batch - 1:
            producer.flush(30)
    assert producer.flush(30) == 0


# librdkafka's cgrp debug line for each share assignment a consumer gets (librdkafka 2.16).
# librdkafka's debug line, as the sidecar logs it ("CGRPOP [rdkafka#consumer-1] [thrd:main]: ...").
_SHARE_ASSIGNMENT = re.compile(
    r"\[([^\]|]+)\] \[thrd:main\]: Share assignment served: (\d+) partition"
)


def _share_assigned(sc: Sidecar) -> bool:
    """One of the sidecar's share consumers holds a partition now (its latest assignment is not empty);
    needs `debug: cgrp` in the sidecar's kafka properties."""
    latest: dict[str, int] = {}
    for consumer, n in _SHARE_ASSIGNMENT.findall(sc.log_text()):
        latest[consumer] = int(n)
    return any(n > 0 for n in latest.values())


# ------------------------------------------------------------------------------- the DLQ scenario


@pytest.mark.parametrize(
    ("copy", "journal"),
    [(True, True), (False, True), (False, False)],
    ids=["copy", "headers-only", "headers-only-no-journal"],
)
async def test_share_dlq_holds_exactly_rejected_and_released_to_limit(
    broker: Broker, unique: str, tmp_path: Path, copy: bool, journal: bool
) -> None:
    """test_dlq's scenario with engine: share: rejected and released-to-limit records in the DLQ once
    each; with and without the journal of deaths (without it, the engine itself remembers which
    records it released, so that one coming back is no suspect)."""
    n = 900 if copy else 300
    limit = 3
    recs = by_value_records(n)
    app = RecordingApp(policy=by_value)
    expected_dlq = sum(1 for i in range(n) if i % 3 != 0)
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        partitions=3,
        path="/",
        extra={
            **SHARE,
            "delivery.count.limit": limit,
            "errors.deadletterqueue.copy.record.enable": copy,
            **({} if journal else {"share.journal.path": None}),
        },
        # Produced before the group exists: share.auto.offset.reset=earliest (set by the sidecar
        # from auto.offset.reset) is what makes the group read them.
        produce_first=recs,
    ) as rig:
        topic, group, dlq, sc = rig.topic, rig.group, rig.dlq_topic, rig.sc
        await _wait_thread(
            lambda: broker.count_records(dlq) >= expected_dlq, 180, "the DLQ records"
        )
        await wait_until(
            lambda: (
                sum(1 for d in app.deliveries if d.value and d.value.startswith(b"accept"))
                >= n // 3
            ),
            60,
            "every accept record",
        )
        await trio.sleep(2)  # anything redelivered by mistake would show up here
        st = await sc.status()
        assert await sc.stop() == 0, sc.log_text()[-3000:]
        # Every release came from this process, which saw its outcome: a released record that
        # comes back is no suspect, so no isolation pass ran (one runs only after a death).
        assert "isolation:" not in sc.log_text(), sc.log_text()[-3000:]

    assert (
        await trio.to_thread.run_sync(broker.group_config, group, "share.auto.offset.reset")
        == "earliest"
    )
    assert st["engine"] == "share"
    assert st["share"]["delivery_count_limit"] == limit
    dlq_recs = await trio.to_thread.run_sync(broker.read_topic, dlq, expected_dlq, 60)
    assert len(dlq_recs) == expected_dlq
    assert await trio.to_thread.run_sync(broker.count_committed_records, dlq) == expected_dlq
    by_seq = {i: r for i, r in enumerate(recs)}
    seen_coords: set[tuple[int, int]] = set()
    for d in dlq_recs:
        h = d.headers_by_name()
        coord = (
            int(h["__dlq.errors.partition"][0] or b""),
            int(h["__dlq.errors.offset"][0] or b""),
        )
        assert coord not in seen_coords, f"{coord} dead-lettered twice"
        seen_coords.add(coord)
        assert h["__dlq.errors.topic"] == [topic.encode()]
        assert h["__dlq.errors.group"] == [group.encode()]
        assert d.partition == 0
        if copy:
            orig = by_seq[int(h["seq"][0] or b"")]
            assert (d.key, d.value) == (orig.key, orig.value)
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
        if kind == b"reject":
            assert h["__dlq.errors.message"] == [b"Offset rejected by client."]
            assert h["__dlq.errors.delivery.count"] == [b"1"]
            assert h["__dlq.errors.exception.class.name"] == [b"com.example.Invalid"]
            assert h["__dlq.errors.exception.message"] == [f"bad order {coord[1]}".encode()]
            assert h["__dlq.errors.exception.stacktrace"] == [b"at line 1"]
        else:
            assert kind == b"release"
            assert h["__dlq.errors.message"] == [b"Offset delivery count exceeded the threshold."]
            assert h["__dlq.errors.delivery.count"] == [str(limit).encode()]
            assert h["__dlq.errors.exception.class.name"] == [b"com.example.Flaky"]

    counts = Counter((dv.partition, dv.offset) for dv in app.deliveries)
    kind_of = {(dv.partition, dv.offset): (dv.value or b"").split(b":")[0] for dv in app.deliveries}
    assert len(counts) == n
    for coord, c in counts.items():
        kind = kind_of[coord]
        assert c == {b"accept": 1, b"reject": 1, b"release": limit}[kind], (coord, kind, c)
        assert (coord in seen_coords) == (kind != b"accept")
    # The broker's delivery count is what the app saw: 1, 2, ... up to the limit for a released record.
    for coord in [c for c, k in kind_of.items() if k == b"release"][:20]:
        assert sorted(
            d.delivery_count for d in app.deliveries if (d.partition, d.offset) == coord
        ) == [
            1,
            2,
            3,
        ]
    assert st["counters"]["dlq_written"] == expected_dlq


# ------------------------------------------------------------------------------- scale-out


async def test_three_sidecars_share_one_partition(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """Share groups' point: consumers beyond the partition count all get records; none lost or accepted twice.

    The three are one group on one host with the default journal (`share.journal.path: auto`, one
    file per group under $XDG_STATE_HOME): one of them holds it, the other two find it locked, say
    so once each and run without a journal (the broker's counts)."""
    n = 400
    topic = broker.create_topic(f"one-{unique}", partitions=1)
    group = f"g-{unique}"
    app = RecordingApp()
    # Slow enough that one sidecar alone would need seconds: the backlog has to be shared.
    app.delay_s = 0.05
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        # Small polls, so one consumer does not take the whole backlog in one batch; cgrp
        # debug logs each share assignment (what tells the test that all three joined).
        kafka_extra={"max.poll.records": 20, "debug": "cgrp"},
        extra={**SHARE, "logging": {"level": "info", "format": "json"}},
        start=False,
    ) as rig:
        cfgs = [
            rig.config(
                f"sidecar{i}.yaml",
                app_extra={"headers": {"x-sidecar": str(i)}, "max.in.flight": 8},
            )
            for i in range(3)
        ]
        async with rig.sidecar(cfgs[0]) as a, rig.sidecar(cfgs[1]) as b, rig.sidecar(cfgs[2]) as c:
            # All three hold the partition before the records arrive.
            await wait_until(
                lambda: all(_share_assigned(sc) for sc in (a, b, c)),
                90,
                "a share assignment in each sidecar",
                poll_s=0.5,
            )
            await trio.to_thread.run_sync(_produce_in_small_batches, broker, topic, n)
            await wait_until(lambda: len(app.seen()) >= n, 120, "every record delivered")
            await trio.sleep(2)
            journals = [(await sc.status())["share"]["journal"] for sc in (a, b, c)]
            for sc in (a, b, c):
                assert await sc.stop() == 0, sc.log_text()[-3000:]
            locked_out = [
                sc.log_text().count("in use by another sidecar on this host") for sc in (a, b, c)
            ]

    assert sorted(journals) == [False, False, True], journals
    assert sorted(locked_out) == [0, 1, 1], locked_out
    assert [j for j, n_locked in zip(journals, locked_out, strict=True) if n_locked] == [
        False,
        False,
    ]

    by_sidecar = Counter(dict(d.raw_headers).get("x-sidecar") for d in app.deliveries)
    assert set(by_sidecar) == {"0", "1", "2"}, by_sidecar
    assert all(v > 0 for v in by_sidecar.values()), by_sidecar
    offsets = Counter(d.offset for d in app.deliveries)
    assert set(offsets) == set(range(n))  # nothing lost
    assert max(offsets.values()) == 1, [o for o, k in offsets.items() if k > 1][:10]  # none twice


async def test_killed_sidecar_records_come_back_with_a_higher_count(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """A sidecar killed (SIGKILL) holding acquired records: the broker gives them to the other one.

    Without a journal (`share.journal.path: null`): the counts are the broker's. With one, a sidecar
    restarted on the same host gives them out again at the count they had (tests/reliability)."""
    topic = broker.create_topic(f"kill-{unique}", partitions=1)
    group = f"g-{unique}"
    # The broker's minimum lock: the records come back when it expires.
    await trio.to_thread.run_sync(
        broker.set_group_config, group, {"share.record.lock.duration.ms": "15000"}
    )
    holding = trio.Event()

    def hold_first(d: Delivery) -> Response:
        if dict(d.raw_headers).get("x-sidecar") == "a":
            holding.set()
            return Response(202)  # deferred, never acked: the records stay acquired by sidecar a
        return Response(200)

    app = RecordingApp(policy=hold_first)
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        kafka_extra={"max.poll.records": 10},
        extra={**SHARE, "share.journal.path": None},
        start=False,
    ) as rig:
        cfg_a, cfg_b = (
            rig.config(f"{name}.yaml", app_extra={"headers": {"x-sidecar": name}})
            for name in ("a", "b")
        )
        async with rig.sidecar(cfg_a) as a:
            await trio.to_thread.run_sync(
                broker.produce, topic, [Rec(key=None, value=f"v{i}".encode()) for i in range(10)]
            )
            with trio.fail_after(60):
                await holding.wait()
            held = {d.offset for d in app.deliveries if dict(d.raw_headers)["x-sidecar"] == "a"}
            a.proc.send_signal(signal.SIGKILL)
            await a.wait_exit()
        async with rig.sidecar(cfg_b) as b:
            await wait_until(
                lambda: (
                    {d.offset for d in app.deliveries if dict(d.raw_headers)["x-sidecar"] == "b"}
                    >= set(range(10))
                ),
                90,
                "sidecar b to get every record",
            )
            assert await b.stop() == 0
    counts_b = {
        d.offset: d.delivery_count
        for d in app.deliveries
        if dict(d.raw_headers)["x-sidecar"] == "b"
    }
    assert held
    for offset in held:
        assert counts_b[offset] >= 2, (offset, counts_b)


# ------------------------------------------------------------------------------- refusals


async def test_group_that_cannot_be_a_share_group_is_a_clear_start_up_error(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """The broker refuses a share group whose id is a consumer group: exit 1, engine: consumer suggested."""
    topic = broker.create_topic(f"ref-{unique}", partitions=1)
    group = f"g-{unique}"

    def make_consumer_group() -> None:
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
        try:
            c.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        finally:
            c.close()

    await trio.to_thread.run_sync(broker.produce, topic, [Rec(key=None, value=b"x")])
    await trio.to_thread.run_sync(make_consumer_group)
    app = RecordingApp()
    # It exits by design, possibly before its API was ever polled.
    async with running_sidecar(
        broker, tmp_path, app, topic=topic, group=group, path="/", extra=SHARE, wait="none"
    ) as rig:
        sc = rig.sc
        assert await sc.wait_exit(60) == 1
        text = sc.log_text()
    assert "share groups are not available" in text, text[-3000:]
    assert "engine: consumer" in text
    assert "GROUP_ID_NOT_FOUND" in text
    assert app.deliveries == []


async def test_ordering_warning_and_lock_warning_at_start_up(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"warn-{unique}", partitions=1)
    group = f"g-{unique}"
    await trio.to_thread.run_sync(
        broker.set_group_config, group, {"share.record.lock.duration.ms": "15000"}
    )
    app = RecordingApp()
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        extra={"engine": "share", "ordering": "key", "share.record.lock.duration.ms": 60000},
        app_extra={"timeout.ms": 20000},
        produce_first=[Rec(key=b"k", value=b"x")],
    ) as rig:
        sc = rig.sc
        with trio.move_on_after(60):
            await wait_until(lambda: len(app.deliveries) >= 1, 60, "the record")
        assert app.deliveries, (await sc.status(), sc.log_text()[-3000:])
        code, ready = await sc.get("/readyz")
        assert code == 200, ready
        # What a share client knows: subscribed, and records came (it sees no assignment).
        assert ready["checks"]["subscribed"] is True and "assigned" not in ready["checks"], ready
        assert ready["share"] == {"records_received": True}, ready
        assert await sc.stop() == 0
        text = sc.log_text()
    assert "ordering: key does not apply to engine: share" in text
    assert (
        "app.timeout.ms (20000) is not shorter than the share group's record lock (15000 ms, group config)"
        in text
    )


async def test_deferred_answers_through_the_ack_api(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """202 then /v1/acks within the batch's lifetime; a second answer for the same id is `already`."""
    topic = broker.create_topic(f"def-{unique}", partitions=1)
    group = f"g-{unique}"
    app = RecordingApp(policy=lambda d: Response(202))
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        extra={**SHARE, "delivery.count.limit": 2},
        produce_first=[Rec(key=None, value=f"v{i}".encode()) for i in range(3)],
    ) as rig:
        sc = rig.sc
        await wait_until(lambda: len(app.deliveries) >= 3, 60, "three deliveries")
        ids = {d.offset: d.delivery_id for d in app.deliveries}
        code, body = await sc.post_json(
            "/v1/acks",
            {
                "acks": [
                    {"id": ids[0], "ack": "accept"},
                    {"id": ids[1], "ack": "reject", "error": {"class": "E", "message": "m"}},
                    {"id": ids[2], "ack": "release"},
                    {"id": "nonsense", "ack": "accept"},
                ]
            },
        )
        assert code == 200, body
        results = {r["id"]: r["result"] for r in body["results"]}
        assert results == {ids[0]: "ok", ids[1]: "ok", ids[2]: "ok", "nonsense": "unknown"}
        # Offset 2 comes back (delivery 2 of 2); answer it late-but-valid with a release: DLQ.
        await wait_until(
            lambda: any(d.offset == 2 and d.delivery_count == 2 for d in app.deliveries),
            30,
            "the redelivery",
        )
        second = next(d for d in app.deliveries if d.offset == 2 and d.delivery_count == 2)
        code, body = await sc.post_json("/v1/acks", {"acks": [{"id": ids[0], "ack": "accept"}]})
        assert body["results"][0]["result"] == "already"
        code, body = await sc.post_json(
            "/v1/acks", {"acks": [{"id": second.delivery_id, "ack": "release"}]}
        )
        assert body["results"][0]["result"] == "ok"
        dlq = f"dlq.{topic}"
        await _wait_thread(lambda: broker.count_records(dlq) >= 2, 60, "two DLQ records")
        await trio.sleep(1)
        assert await sc.stop() == 0
    dlq_recs = await trio.to_thread.run_sync(broker.read_topic, f"dlq.{topic}", 2, 30)
    causes = sorted(
        (
            r.headers_by_name()["__dlq.errors.offset"][0],
            r.headers_by_name()["__dlq.errors.message"][0],
        )
        for r in dlq_recs
    )
    assert causes == [
        (b"1", b"Offset rejected by client."),
        (b"2", b"Offset delivery count exceeded the threshold."),
    ]
    assert [d.offset for d in app.deliveries].count(0) == 1


# ------------------------------------------------------------------------------- check functions


def test_broker_without_share_group_settings_is_refused() -> None:
    # What a Kafka 3.x broker describes: group settings, none of them group.share.*.
    with pytest.raises(ShareGroupsUnavailable, match="predates share groups"):
        check_broker_configs({"group.consumer.session.timeout.ms": "45000", "log.dirs": "/x"})
    check_broker_configs({"group.share.record.lock.duration.ms": "30000"})


def test_refusal_errors_name_the_broker_answer() -> None:
    reason = refusal_from_error(KafkaError(KafkaError.GROUP_ID_NOT_FOUND, "no such group"))
    assert reason is not None and "GROUP_ID_NOT_FOUND" in reason
    assert refusal_from_error(KafkaError(KafkaError.UNSUPPORTED_VERSION)) is not None
    assert refusal_from_error(KafkaError(KafkaError._TRANSPORT)) is None


def test_share_consumer_properties_drop_what_a_share_consumer_refuses() -> None:
    props = share_consumer_properties(
        {
            "bootstrap.servers": "b:9092",
            "group.id": "g",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    assert props == {
        "bootstrap.servers": "b:9092",
        "group.id": "g",
        "max.poll.records": 500,
        "share.acknowledgement.mode": "explicit",
    }


class _Entry:
    def __init__(self, value: str) -> None:
        self.value = value


class _OldBrokerAdmin:
    """Describes what a broker before share groups would: no group configs, no group.share.* settings."""

    def __init__(
        self, broker_configs: dict[str, str], group_configs: dict[str, str] | None
    ) -> None:
        self.broker_configs = broker_configs
        self.group_configs = group_configs
        self.altered: list[str] = []

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        class _Md:
            brokers = {1: object()}

        return _Md()

    def describe_configs(
        self, resources: list[ConfigResource], **kwargs: Any
    ) -> dict[ConfigResource, Future[Any]]:
        res = resources[0]
        fut: Future[Any] = Future()
        if res.restype == ResourceType.BROKER:
            fut.set_result({k: _Entry(v) for k, v in self.broker_configs.items()})
        elif self.group_configs is None:
            from confluent_kafka import KafkaException

            fut.set_exception(
                KafkaException(KafkaError(KafkaError.INVALID_REQUEST, "unknown resource type"))
            )
        else:
            fut.set_result({k: _Entry(v) for k, v in self.group_configs.items()})
        return {res: fut}

    def incremental_alter_configs(
        self, resources: list[ConfigResource], **kwargs: Any
    ) -> dict[ConfigResource, Future[Any]]:
        res = resources[0]
        self.altered.append(res.name)
        fut: Future[Any] = Future()
        fut.set_result(None)
        return {res: fut}


def _config(tmp_path: Path, **extra: Any) -> Any:
    path = write_config(
        tmp_path / "c.yaml",
        bootstrap="127.0.0.1:1",
        group="g",
        topics=["t"],
        app_url="http://127.0.0.1:1/",
        extra={**SHARE, **extra},
    )
    return load_config(path)


def test_read_share_settings_refuses_an_old_broker(tmp_path: Path) -> None:
    admin = _OldBrokerAdmin({"group.consumer.session.timeout.ms": "45000"}, None)
    with pytest.raises(ShareGroupsUnavailable):
        read_share_settings(admin, "g", _config(tmp_path))


def test_read_share_settings_sources(tmp_path: Path) -> None:
    broker_cfg = {
        "group.share.delivery.count.limit": "7",
        "group.share.record.lock.duration.ms": "20000",
    }
    # The group's own settings win over the broker defaults; the limit the app sees is the sidecar's,
    # below the group's (by at least its four share consumers: see test_share_limits.py).
    admin = _OldBrokerAdmin(
        broker_cfg, {"share.delivery.count.limit": "8", "share.record.lock.duration.ms": "16000"}
    )
    s = read_share_settings(admin, "g", _config(tmp_path, **{"delivery.count.limit": 3}))
    assert s.delivery_count_limit == 3
    assert (s.group_delivery_count_limit, s.group_delivery_count_limit_source) == (
        8,
        "group config",
    )
    assert (s.lock_duration_ms, s.lock_duration_source) == (16000, "group config")
    assert admin.altered == ["g"]  # share.auto.offset.reset=earliest, from auto.offset.reset
    # Group config not readable: the lock falls back to the broker default, but the limit cannot.
    admin = _OldBrokerAdmin(broker_cfg, None)
    with pytest.raises(ShareGroupLimitUnsafe, match="cannot read the share group 'g'"):
        read_share_settings(admin, "g", _config(tmp_path, **{"delivery.count.limit": 3}))


def test_real_broker_group_settings(broker: Broker) -> None:
    """On the real broker: the group's configured limit and lock are what the engine uses."""
    group = f"g-settings-{uuid.uuid4().hex[:8]}"
    broker.set_group_config(
        group, {"share.delivery.count.limit": "8", "share.record.lock.duration.ms": "20000"}
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    cfg = load_config(
        write_config(
            Path(f"/tmp/{group}.yaml"),
            bootstrap=broker.bootstrap,
            group=group,
            topics=["t"],
            app_url="http://127.0.0.1:1/",
            extra={**SHARE, "delivery.count.limit": 3},
        )
    )
    s = read_share_settings(admin, group, cfg)
    assert (s.group_delivery_count_limit, s.group_delivery_count_limit_source) == (
        8,
        "group config",
    )
    assert s.delivery_count_limit == 3  # the sidecar's, below the group's
    assert (s.lock_duration_ms, s.lock_duration_source) == (20000, "group config")
    assert broker.group_config(group, "share.auto.offset.reset") == "earliest"


# ------------------------------------------------------------------------------- app down


async def test_app_down_keeps_acquired_records_until_it_is_back(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """Connection refused is not an attempt: acquired records wait (within the lock) and go out once."""
    topic = broker.create_topic(f"down-{unique}", partitions=1)
    group = f"g-{unique}"
    app = RecordingApp()
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        serve=False,  # nothing listens at the app's port yet
        extra={**SHARE, "delivery.count.limit": 2},
        app_extra={"connect.backoff.initial.ms": 100, "connect.backoff.max.ms": 300},
        produce_first=[Rec(key=None, value=f"v{i}".encode()) for i in range(20)],
    ) as rig:
        sc = rig.sc
        with trio.fail_after(60):
            while (await sc.status())["counters"]["not_attempted"] == 0:
                await trio.sleep(0.2)
        await trio.sleep(3)  # many connection attempts: more than the delivery count limit
        code, ready = await sc.get("/readyz")
        assert code == 503 and ready["checks"]["app_reachable"] is False, ready
        st = await sc.status()
        assert st["counters"]["attempts"] == 0, st["counters"]
        assert st["counters"]["dlq_written"] == 0
        assert st["paused_partitions"], "intake is not paused while the app is down"
        async with rig.serve_app():
            await wait_until(lambda: len(app.deliveries) >= 20, 60, "20 deliveries")
            await trio.sleep(1)
            st = await sc.status()
            assert await sc.stop() == 0
    assert sorted(d.offset for d in app.deliveries) == list(range(20))
    assert all(d.delivery_count == 1 for d in app.deliveries)
    assert st["counters"]["attempts"] == 20
    assert st["counters"]["archived"] == {}


async def test_batch_mode_app(broker: Broker, unique: str, tmp_path: Path) -> None:
    """app.mode: batch with engine: share: one result per record id; a reject ends in the DLQ."""
    import base64
    import json

    topic = broker.create_topic(f"batch-{unique}", partitions=1)
    group = f"g-{unique}"
    seen: list[tuple[int, bytes]] = []

    async def handler(request: Any) -> Response:
        body = json.loads(request.body)
        results = []
        for rec in body["records"]:
            value = base64.b64decode(rec["value"])
            seen.append((rec["offset"], value))
            ack = "reject" if value == b"bad" else "accept"
            results.append({"id": rec["id"], "ack": ack})
        return json_response({"results": results})

    async with running_sidecar(
        broker,
        tmp_path,
        handler,
        topic=topic,
        group=group,
        path="/batch",
        extra=SHARE,
        app_extra={"mode": "batch", "batch.max.records": 10},
        start=False,
    ) as rig:
        values = [b"bad" if i % 10 == 3 else f"v{i}".encode() for i in range(50)]
        await trio.to_thread.run_sync(
            broker.produce, topic, [Rec(key=None, value=v) for v in values]
        )
        async with rig.sidecar() as sc:
            dlq = f"dlq.{topic}"
            await _wait_thread(lambda: broker.count_records(dlq) >= 5, 60, "five DLQ records")
            await wait_until(lambda: len(seen) >= 50, 60, "every record")
            await trio.sleep(1)
            assert await sc.stop() == 0
    assert sorted(o for o, _ in seen) == list(range(50))
    dlq_recs = await trio.to_thread.run_sync(broker.read_topic, f"dlq.{topic}", 5, 30)
    assert sorted(int(r.headers_by_name()["__dlq.errors.offset"][0] or b"") for r in dlq_recs) == [
        3,
        13,
        23,
        33,
        43,
    ]


async def test_sigterm_with_unanswered_records_releases_them(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """Draining stops at shutdown.drain.timeout.ms: unanswered records are released, exit 0, next one gets them."""
    topic = broker.create_topic(f"term-{unique}", partitions=1)
    group = f"g-{unique}"
    app = RecordingApp(policy=lambda d: Response(202) if d.delivery_count == 1 else Response(200))
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        extra={**SHARE, "shutdown.drain.timeout.ms": 1000},
        produce_first=[Rec(key=None, value=f"v{i}".encode()) for i in range(5)],
        start=False,
    ) as rig:
        async with rig.sidecar() as sc:
            await wait_until(lambda: len(app.deliveries) >= 5, 60, "five deliveries")
            code, metrics = await sc.get("/metrics")
            assert code == 200 and "dlq_sidecar_in_flight_records 5.0" in metrics, metrics
            started = trio.current_time()
            assert await sc.stop(timeout_s=20) == 0, sc.log_text()[-3000:]
            stop_s = trio.current_time() - started
        async with rig.sidecar() as sc:
            await wait_until(lambda: len(app.deliveries) >= 10, 60, "the redeliveries")
            assert await sc.stop() == 0
    assert stop_s < 10, stop_s
    counts = sorted(d.delivery_count for d in app.deliveries)
    assert counts[:5] == [1] * 5
    # Released at the stop, and charged again by the broker once for each of the other three share
    # consumers whose fetch was waiting when they closed (see docs/engines.md, "What a death
    # charges"): 2 to 5, measured 2, 3 and 4.
    assert all(2 <= c <= 5 for c in counts[5:]), counts
