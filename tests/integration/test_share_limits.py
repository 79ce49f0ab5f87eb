"""`engine: share` and the delivery-count limits: the sidecar's, and the broker's own (issue 19, item 2).

The broker archives a record, with no DLQ record, when the delivery numbered with the group's
`share.delivery.count.limit` (G) ends without an acknowledgement. The sidecar delivers a record at
most `share.delivery.count.limit` (L) times and dead-letters one acquired after that without sending
it; at start-up it makes sure G >= L + 1 (raising the group config) or refuses to start (exit 1).

Against the real Kafka 4.4 broker with share groups: the killer (a record whose delivery SIGKILLs the
sidecar, restarted after each death), a record already past the limit when acquired, and both
branches of the start-up check. Share groups start slowly and a dead member's records come back
only when their locks expire, so the waits are generous.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import (
    AcknowledgeType,
    KafkaError,
    KafkaException,
    Producer,
    ShareConsumer,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from sidecar.config import load_config
from sidecar.core.share_limits import required_group_limit
from sidecar.http.server import Response
from sidecar.kafka.share import ShareGroupLimitUnsafe, read_share_settings
from tests.harness import (
    Delivery,
    RecordingApp,
    free_port,
    running_app,
    sidecar,
    write_config,
)
from tests.harness import wait_until_thread as _wait_thread
from tests.kafkatools import Broker, Rec

SHARE = {"engine": "share", "ordering": "none"}
CAUSE_DELIVERY_COUNT = b"Offset delivery count exceeded the threshold."


def _headers(rec: Rec) -> dict[str, list[bytes | None]]:
    out: dict[str, list[bytes | None]] = {}
    for k, v in rec.headers:
        out.setdefault(k, []).append(v)
    return out


def _set_group_config(broker: Broker, group: str, configs: dict[str, str]) -> None:
    res = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs.items()
        ],
    )
    broker.admin.incremental_alter_configs([res])[res].result(timeout=15)


def _group_config(broker: Broker, group: str, name: str) -> str | None:
    res = ConfigResource(ResourceType.GROUP, group)
    entry = broker.admin.describe_configs([res])[res].result(timeout=15).get(name)
    return None if entry is None else str(entry.value)


def _config_path(
    tmp_path: Path, name: str, broker: Broker, group: str, topic: str, **kw: Any
) -> Path:
    return write_config(
        tmp_path / f"{name}.yaml",
        bootstrap=broker.bootstrap,
        group=group,
        topics=[topic],
        app_url=kw.pop("app_url", "http://127.0.0.1:1/"),
        **kw,
    )


# ------------------------------------------------------------------------------- the start-up check


def test_required_group_limit_leaves_room_for_a_death() -> None:
    # A death charges a record once per share consumer of the dead sidecar (measured, see below).
    assert required_group_limit(3, 4) == 7
    assert required_group_limit(3, 1) == 4


def test_group_limit_below_what_the_sidecar_needs_is_raised(broker: Broker, tmp_path: Path) -> None:
    """G = L on the real broker: the sidecar sets the group's limit to L + consumers and says so."""
    group = f"g-raise-{uuid.uuid4().hex[:8]}"
    _set_group_config(broker, group, {"share.delivery.count.limit": "3"})
    cfg = load_config(
        _config_path(tmp_path, "c", broker, group, "t", extra={**SHARE, "delivery.count.limit": 3})
    )
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    s = read_share_settings(admin, group, cfg)
    assert s.delivery_count_limit == 3
    assert (s.group_delivery_count_limit, s.group_delivery_count_limit_source) == (
        7,
        "raised by the sidecar from 3",
    )
    assert _group_config(broker, group, "share.delivery.count.limit") == "7"
    assert any(
        "raised the share group" in w and "from 3 (group config) to 7" in w for w in s.warnings
    )
    # Once high enough, it is left alone.
    s = read_share_settings(admin, group, cfg)
    assert (s.group_delivery_count_limit, s.group_delivery_count_limit_source) == (
        7,
        "group config",
    )
    assert not any("raised" in w for w in s.warnings)


async def test_group_limit_that_cannot_be_raised_refuses_to_start(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """L = 8 with four consumers needs G = 12, above the broker's maximum (10): exit 1."""
    topic = broker.create_topic(f"lim-{unique}", partitions=1)
    group = f"g-{unique}"
    await trio.to_thread.run_sync(broker.produce, topic, [Rec(key=None, value=b"x")])
    app = RecordingApp()
    port = free_port()
    async with running_app(app, ("tcp", "127.0.0.1", port)):
        cfg = _config_path(
            tmp_path,
            "sidecar",
            broker,
            group,
            topic,
            app_url=f"http://127.0.0.1:{port}/",
            extra={**SHARE, "delivery.count.limit": 8},
        )
        async with sidecar(cfg, wait_api=False) as sc:
            assert await sc.wait_exit(60) == 1
            text = sc.log_text()
    assert "is 5, below 12: the sidecar's share.delivery.count.limit (8)" in text, text[-3000:]
    assert "group.share.max.delivery.count.limit" in text
    assert "lower the sidecar's share.delivery.count.limit to at most 6" in text
    assert app.deliveries == []
    # Nothing changed on the group.
    assert (
        await trio.to_thread.run_sync(_group_config, broker, group, "share.delivery.count.limit")
        == "5"
    )


class _Entry:
    def __init__(self, value: str, is_default: bool = False) -> None:
        self.value = value
        self.is_default = is_default


class _Admin:
    """The admin calls the start-up check makes, answered from dicts; alters may be refused."""

    def __init__(
        self, group_configs: dict[str, _Entry] | None, *, refuse_alter: bool = False
    ) -> None:
        self.broker_configs = {
            "group.share.delivery.count.limit": "5",
            "group.share.max.delivery.count.limit": "10",
            "group.share.record.lock.duration.ms": "30000",
        }
        self.group_configs = group_configs
        self.refuse_alter = refuse_alter
        self.altered: list[tuple[str, str]] = []

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
            err = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "not authorized")
            fut.set_exception(KafkaException(err))
        else:
            fut.set_result(dict(self.group_configs))
        return {res: fut}

    def incremental_alter_configs(
        self, resources: list[ConfigResource], **kwargs: Any
    ) -> dict[ConfigResource, Future[Any]]:
        res = resources[0]
        fut: Future[Any] = Future()
        entries = [(e.name, str(e.value)) for e in res.incremental_configs]
        if self.refuse_alter and any(n == "share.delivery.count.limit" for n, _ in entries):
            err = KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "AlterConfigs denied")
            fut.set_exception(KafkaException(err))
        else:
            self.altered.extend(entries)
            if self.group_configs is not None:
                for name, value in entries:
                    self.group_configs[name] = _Entry(value)
            fut.set_result(None)
        return {res: fut}


def _load(tmp_path: Path, limit: int, max_in_flight: int = 64) -> Any:
    path = write_config(
        tmp_path / "c.yaml",
        bootstrap="127.0.0.1:1",
        group="g",
        topics=["t"],
        app_url="http://127.0.0.1:1/",
        extra={**SHARE, "delivery.count.limit": limit},
        app_extra={"max.in.flight": max_in_flight},
    )
    return load_config(path)


def test_start_up_check_branches(tmp_path: Path) -> None:
    limit_key = "share.delivery.count.limit"
    # High enough (5 + 4 consumers): nothing altered but share.auto.offset.reset.
    admin = _Admin({limit_key: _Entry("9")})
    s = read_share_settings(admin, "g", _load(tmp_path, 5))
    assert (s.delivery_count_limit, s.group_delivery_count_limit) == (5, 9)
    assert admin.altered == [("share.auto.offset.reset", "earliest")]
    # A fresh group at the broker default with the sidecar's default limit: raised to 9.
    admin = _Admin({limit_key: _Entry("5", is_default=True)})
    s = read_share_settings(admin, "g", _load(tmp_path, 5))
    assert (s.group_delivery_count_limit, s.group_delivery_count_limit_source) == (
        9,
        "raised by the sidecar from 5",
    )
    assert (limit_key, "9") in admin.altered
    assert any("from 5 (broker default) to 9" in w for w in s.warnings)
    # One share consumer (app.max.in.flight: 1): one more than the sidecar's limit is enough.
    admin = _Admin({limit_key: _Entry("4")})
    s = read_share_settings(admin, "g", _load(tmp_path, 3, max_in_flight=1))
    assert s.group_delivery_count_limit == 4
    assert (limit_key, "4") not in admin.altered
    # Too low and the sidecar may not raise it: refused, naming both ways out.
    admin = _Admin({limit_key: _Entry("5")}, refuse_alter=True)
    with pytest.raises(ShareGroupLimitUnsafe) as refused:
        read_share_settings(admin, "g", _load(tmp_path, 3))
    text = str(refused.value)
    assert "'g''s share.delivery.count.limit is 5, below 7" in text
    assert "AlterConfigs denied" in text
    assert "--add-config share.delivery.count.limit=7" in text
    assert "lower the sidecar's share.delivery.count.limit to at most 1" in text
    # Above the broker's maximum: refused without trying.
    admin = _Admin({limit_key: _Entry("5")})
    with pytest.raises(ShareGroupLimitUnsafe, match="allows at most 10"):
        read_share_settings(admin, "g", _load(tmp_path, 7))
    assert (limit_key, "11") not in admin.altered
    # Not readable (no DescribeConfigs on the group): refused.
    with pytest.raises(ShareGroupLimitUnsafe, match="cannot read the share group 'g'"):
        read_share_settings(_Admin(None), "g", _load(tmp_path, 3))


# ------------------------------------------------------------------------------- past the limit


def _acquire_and_release(bootstrap: str, group: str, topic: str, n: int, times: int) -> None:
    """A plain share consumer of `group` acquires each of the n records `times` times, releasing it."""
    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
        }
    )
    acquired: Counter[int] = Counter()
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 120
        while min(acquired[o] for o in range(n)) < times:
            assert time.monotonic() < deadline, f"acquired only {dict(acquired)}"
            for msg in consumer.poll(1.0):
                if msg.error() is not None:
                    continue
                acquired[msg.offset()] += 1
                consumer.acknowledge(msg, AcknowledgeType.RELEASE)
            consumer.commit_sync()
    finally:
        consumer.close()


async def test_record_acquired_past_the_limit_is_dead_lettered_without_a_delivery(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """Records handed out L times elsewhere come to the sidecar at delivery L + 1: DLQ, never the app."""
    limit, n = 2, 3
    topic = broker.create_topic(f"past-{unique}", partitions=1)
    group = f"g-{unique}"
    await trio.to_thread.run_sync(
        _set_group_config, broker, group, {"share.auto.offset.reset": "earliest"}
    )
    await trio.to_thread.run_sync(
        broker.produce, topic, [Rec(key=None, value=f"v{i}".encode()) for i in range(n)]
    )
    await trio.to_thread.run_sync(_acquire_and_release, broker.bootstrap, group, topic, n, limit)
    app = RecordingApp()
    port = free_port()
    dlq = f"dlq.{topic}"
    async with running_app(app, ("tcp", "127.0.0.1", port)):
        cfg = _config_path(
            tmp_path,
            "sidecar",
            broker,
            group,
            topic,
            app_url=f"http://127.0.0.1:{port}/",
            extra={**SHARE, "delivery.count.limit": limit},
        )
        async with sidecar(cfg) as sc:
            await _wait_thread(lambda: broker.count_records(dlq) >= n, 90, "the DLQ records")
            st = await sc.status()
            assert await sc.stop() == 0, sc.log_text()[-3000:]
    assert app.deliveries == []
    assert st["counters"]["attempts"] == 0
    assert st["counters"]["archived"] == {"delivery_count_exceeded": n}
    recs = await trio.to_thread.run_sync(broker.read_topic, dlq, n, 30)
    assert sorted(int(_headers(r)["__dlq.errors.offset"][0] or b"") for r in recs) == [0, 1, 2]
    for r in recs:
        h = _headers(r)
        assert h["__dlq.errors.topic"] == [topic.encode()]
        assert h["__dlq.errors.partition"] == [b"0"]
        assert h["__dlq.errors.group"] == [group.encode()]
        assert h["__dlq.errors.message"] == [CAUSE_DELIVERY_COUNT]
        # The deliveries made before, not the acquisition that was not one.
        assert h["__dlq.errors.delivery.count"] == [str(limit).encode()]
        assert h["__dlq.errors.exception.class.name"] == [b"sidecar.DeliveryCountExhausted"]


# ------------------------------------------------------------------------------- the killer


def _produce_killer_among(broker: Broker, topic: str, n: int, killer: int) -> None:
    """Values v0..v{n-1}, `kill` at index `killer`, four per producer batch (a live stream's shape)."""
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(n):
        producer.produce(topic, value=b"kill" if i == killer else f"v{i}".encode())
        if i % 4 == 3:
            producer.flush(30)
    assert producer.flush(30) == 0


@pytest.mark.parametrize("consumers", [1, 4], ids=["one-consumer", "four-consumers"])
async def test_killer_ends_in_the_dlq_and_nothing_is_archived_without_a_dlq_record(
    broker: Broker, unique: str, tmp_path: Path, consumers: int
) -> None:
    """A record whose delivery SIGKILLs the sidecar, the sidecar restarted after each death, L = 3, G = 5.

    Before: delivered 5 times, then archived by the broker with no DLQ record. Now: delivered at most
    L times, dead-lettered at its next acquisition with a full DLQ record; no record is delivered
    past L, and none is lost. What a death charges is measured here: with one share consumer, +1 on
    every record the sidecar held (exactly L deaths); with four, up to +4 (the dead consumers' share
    fetches still waiting at the broker acquire the records once more each), which is why the
    sidecar raises G to L + 4 = 7 first. Without a journal (`share.journal.path: null`): the broker's
    counts; with one, tests/reliability/test_share_isolation_fast.py.
    """
    limit, group_limit, n = 3, 5, 40
    max_in_flight = 1 if consumers == 1 else 64
    killer = n // 2
    topic = broker.create_topic(f"killer-{unique}", partitions=1)
    group = f"g-{unique}"
    dlq = f"dlq.{topic}"
    # The broker's shortest lock: a dead sidecar's records come back when it expires.
    await trio.to_thread.run_sync(
        _set_group_config,
        broker,
        group,
        {
            "share.delivery.count.limit": str(group_limit),
            "share.record.lock.duration.ms": "15000",
        },
    )
    victim = {"pid": 0}

    def policy(d: Delivery) -> Response:
        if d.value == b"kill" and victim["pid"]:
            os.kill(victim["pid"], signal.SIGKILL)
            victim["pid"] = 0
        return Response(200)

    app = RecordingApp(policy=policy)
    app.delay_s = 0.05  # several records in flight when the killer arrives
    port = free_port()
    deaths = 0

    def killer_in_dlq() -> bool:
        return broker.count_records(dlq) > 0 and any(
            _headers(r)["__dlq.errors.offset"] == [str(killer).encode()]
            for r in broker.read_topic(dlq, broker.count_records(dlq), 10)
        )

    async with running_app(app, ("tcp", "127.0.0.1", port)):
        await trio.to_thread.run_sync(_produce_killer_among, broker, topic, n, killer)
        for incarnation in range(limit + 2):
            cfg = _config_path(
                tmp_path,
                f"sidecar{incarnation}",
                broker,
                group,
                topic,
                app_url=f"http://127.0.0.1:{port}/",
                extra={**SHARE, "delivery.count.limit": limit, "share.journal.path": None},
                app_extra={"max.in.flight": max_in_flight},
            )
            async with sidecar(cfg, wait_api=False) as sc:
                victim["pid"] = sc.proc.pid
                # Either it dies on the killer, or the killer reaches the DLQ.
                with trio.move_on_after(180) as waited:
                    while sc.proc.returncode is None:
                        if await trio.to_thread.run_sync(killer_in_dlq):
                            break
                        await trio.sleep(0.5)
                assert not waited.cancelled_caught, "neither a death nor the killer in the DLQ"
                if sc.proc.returncode is not None:
                    assert sc.proc.returncode == -signal.SIGKILL, sc.log_text()[-3000:]
                    deaths += 1
                    continue

                # Survived: every other record answered by the app or in the DLQ, then a clean stop.
                def done() -> bool:
                    dead = {
                        int(_headers(r)["__dlq.errors.offset"][0] or b"")
                        for r in broker.read_topic(dlq, broker.count_records(dlq), 10)
                    }
                    return {d.offset for d in app.deliveries} | dead >= set(range(n))

                await _wait_thread(done, 120, "every record answered or in the DLQ")
                st = await sc.status()
                assert await sc.stop() == 0, sc.log_text()[-3000:]
                break
        else:
            raise AssertionError(f"the killer never reached the DLQ ({deaths} deaths)")

    recs = await trio.to_thread.run_sync(broker.read_topic, dlq, broker.count_records(dlq), 30)
    by_offset: dict[int, list[dict[str, list[bytes | None]]]] = {}
    for r in recs:
        h = _headers(r)
        by_offset.setdefault(int(h["__dlq.errors.offset"][0] or b""), []).append(h)
    seen: dict[int, list[int]] = {}
    for d in app.deliveries:
        seen.setdefault(d.offset, []).append(d.delivery_count)
    # The killer: at most L deliveries (one death each), then dead-lettered at its next
    # acquisition, once, with the deliveries the broker counted before it.
    (k,) = by_offset.pop(killer)
    assert k["__dlq.errors.topic"] == [topic.encode()]
    assert k["__dlq.errors.partition"] == [b"0"]
    assert k["__dlq.errors.group"] == [group.encode()]
    assert k["__dlq.errors.message"] == [CAUSE_DELIVERY_COUNT]
    assert k["__dlq.errors.exception.class.name"] == [b"sidecar.DeliveryCountExhausted"]
    killer_counts = seen[killer]
    if consumers == 1:
        assert deaths == limit, (deaths, seen)
        assert killer_counts == [1, 2, 3]
        assert k["__dlq.errors.delivery.count"] == [str(limit).encode()]
        assert _group_config(broker, group, "share.delivery.count.limit") == str(group_limit)
        # Isolation: after the first death every record the sidecar held is a suspect, delivered
        # alone with the others' outcomes already at the broker, in alternating order; a death
        # then charges the killer and the suspects behind it, and the next pass runs the other
        # way. No other record is dead-lettered (before isolation: all 39).
        assert not by_offset, sorted(by_offset)
        assert st["share"]["isolation_active"] is False
    else:
        assert 1 <= deaths <= limit, (deaths, seen)
        assert len(killer_counts) == deaths
        assert int(k["__dlq.errors.delivery.count"][0] or b"") >= limit
        assert _group_config(broker, group, "share.delivery.count.limit") == str(limit + 4)
    # No record was sent past the sidecar's limit, and none reached the broker's before the sidecar
    # dead-lettered it (the DLQ counts are below G): none was archived without our DLQ record.
    assert max(d.delivery_count for d in app.deliveries) <= limit
    g = int(_group_config(broker, group, "share.delivery.count.limit") or 0)
    for offset, hs in by_offset.items():
        assert all(h["__dlq.errors.message"] == [CAUSE_DELIVERY_COUNT] for h in hs), offset
        assert all(int(h["__dlq.errors.delivery.count"][0] or b"") < g for h in hs), offset
    # Nothing lost: every record was answered by the app or is in the DLQ. The others in the DLQ
    # (four consumers only) are what the deaths charged: the first death charges every record the
    # sidecar held up to four times (a poll's records are acknowledged together, and the dead
    # consumers' waiting share fetches acquire them again), past the limit for some.
    assert set(seen) | set(by_offset) | {killer} == set(range(n))
    print(
        f"killer, {consumers} consumer(s): {deaths} deaths, killer delivered with counts "
        f"{killer_counts}, DLQ count {k['__dlq.errors.delivery.count']}; {len(by_offset)} other "
        f"records dead-lettered; app deliveries by count "
        f"{dict(sorted(Counter(c for cs in seen.values() for c in cs).items()))}; "
        f"last incarnation {st['counters']}"
    )
