"""Transactional DLQ mode: DLQ records and the offset commit in one transaction, so kill -9 cannot duplicate them."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, TopicPartition

from sidecar.http.server import Response
from sidecar.kafka import dlq as dlq_module
from sidecar.kafka.dlq import CAUSE_REJECTED, DlqTxnStuck, FailedRecord
from sidecar.kafka.dlq import txn as dlq_txn
from tests.harness import (
    RecordingApp,
    restartable_member,
    running_sidecar,
    transactional_dlq_writer,
)
from tests.harness import wait_until_thread as _wait_thread
from tests.kafkatools import Broker, Rec


async def test_kill_9_repeatedly_gives_no_duplicate_and_no_lost_dlq_record(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=2)
    group = f"g-{unique}"
    dlq = f"dlq.{topic}"
    n = 600
    poison = {i for i in range(n) if i % 3 == 0}

    async def slow_reject(d):  # type: ignore[no-untyped-def]
        await trio.sleep(0.005)  # keep the stream flowing while the kills land
        return Response(400) if (d.value or b"").startswith(b"poison") else Response(200)

    app = RecordingApp(policy=slow_reject)
    rng = random.Random(7)
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        extra={
            "errors.deadletterqueue.transactional.enable": True,
            "errors.deadletterqueue.copy.record.enable": True,
        },
        app_extra={"max.in.flight": 4},
        kafka_extra=restartable_member(unique),
        start=False,
    ) as rig:
        recs = [
            Rec(
                key=f"k{i % 13}".encode(),
                value=(b"poison:" if i in poison else b"ok:") + str(i).encode(),
            )
            for i in range(n)
        ]
        await trio.to_thread.run_sync(broker.produce, topic, recs)
        kills = 0
        for _ in range(4):
            async with rig.sidecar() as sc:
                # Let it make progress (a rebalance after a kill takes up to the session timeout).
                await trio.sleep(rng.uniform(5.0, 8.0))
                sc.proc.send_signal(signal.SIGKILL)
                assert await sc.wait_exit(30) == -signal.SIGKILL
                kills += 1
        async with rig.sidecar() as sc:
            ends = broker.end_offsets(topic, [0, 1])
            await _wait_thread(
                lambda: all(
                    broker.committed(group, topic, [0, 1])[p][0] == ends[p] for p in (0, 1)
                ),
                180,
                "every record done",
            )
            assert await sc.stop() == 0
    assert kills == 4
    got = broker.read_topic(
        dlq, len(poison), timeout_s=60
    )  # read_committed: aborted writes are invisible
    values = [r.value for r in got]
    assert len(values) == len(set(values)), "duplicate DLQ records"
    assert {int((v or b"").split(b":")[1]) for v in values} == poison, "lost or extra DLQ records"
    # Every ok record was accepted at least once (at-least-once to the app).
    accepted = {
        int((d.value or b"").split(b":")[1])
        for d in app.deliveries
        if (d.value or b"").startswith(b"ok")
    }
    assert accepted == set(range(n)) - poison


async def test_many_dlq_records_share_one_transaction_and_each_is_committed_once(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """DLQ records that arrive while a transaction is under way go into the next one: one
    transaction carries many records. Counted from the DLQ partition itself: each committed
    transaction ends with one COMMIT marker, which takes an offset, so the partition's end offset
    is the records plus the transactions that wrote to it."""
    topic = broker.create_topic(f"src-{unique}", partitions=2)
    dlq = broker.create_topic(f"dlq.{topic}", partitions=1)
    group = f"g-{unique}"
    n = 600
    poison = {i for i in range(n) if i % 3 != 0}

    async def reject_poison(d):  # type: ignore[no-untyped-def]
        return Response(400) if (d.value or b"").startswith(b"poison") else Response(200)

    app = RecordingApp(policy=reject_poison)
    await trio.to_thread.run_sync(
        broker.produce,
        topic,
        [
            Rec(key=f"k{i}".encode(), value=(b"poison:" if i in poison else b"ok:") + b"%d" % i)
            for i in range(n)
        ],
    )
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        extra={
            "errors.deadletterqueue.transactional.enable": True,
            "errors.deadletterqueue.copy.record.enable": True,
        },
    ) as rig:
        assert rig.dlq_topic == dlq
        ends = broker.end_offsets(topic, [0, 1])
        await _wait_thread(
            lambda: all(broker.committed(group, topic, [0, 1])[p][0] == ends[p] for p in (0, 1)),
            120,
            "every record done",
        )
        assert await rig.sc.stop() == 0
    got = await _committed_once_visible(broker, dlq)
    values = [r.value or b"" for r in got]
    assert len(values) == len(set(values)), "duplicate DLQ records"
    assert {int(v.split(b":")[1]) for v in values} == poison, "lost or extra DLQ records"
    transactions = broker.end_offsets(dlq, [0])[0] - len(poison)
    assert 1 <= transactions <= len(poison) // 4, (
        f"{len(poison)} DLQ records took {transactions} transactions"
    )


def _failed(topic: str, offset: int, group: str) -> FailedRecord:
    return FailedRecord(
        topic=topic,
        partition=0,
        offset=offset,
        key=None,
        value=f"v{offset}".encode(),
        headers=(),
        group=group,
        delivery_count=1,
        cause=CAUSE_REJECTED,
    )


async def test_a_stuck_transaction_call_is_fenced_and_the_transaction_redone(
    broker: Broker, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer stuck in send_offsets_to_transaction (librdkafka #5456/#5511 after a broker restart) is
    replaced; the new producer's init_transactions() aborts the old transaction, so neither its DLQ record
    nor its offsets (no pending transactional offset commit left behind) become visible, and the redone
    transaction commits both."""
    src = broker.create_topic(f"src-{unique}", partitions=1)
    dlq_topic = broker.create_topic(f"dlq-{unique}", partitions=1)
    group = f"g-{unique}"
    writer = transactional_dlq_writer(broker.bootstrap, group, f"txn-{unique}")
    await trio.to_thread.run_sync(writer.prepare_topics_sync, [dlq_topic])
    # A group member's metadata is not needed: generation -1 commits for a group with no members.
    member = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    group_metadata = member.consumer_group_metadata()
    member.close()
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.txn_begin()
        await writer.txn_produce(_failed(src, 3, group), dlq_topic)
        # Every transaction call now "overstays" at once, as a stuck one does after the watchdog.
        monkeypatch.setattr(dlq_txn, "TXN_CALL_WATCHDOG_S", 0.0)
        with pytest.raises(DlqTxnStuck):
            await writer.txn_commit([TopicPartition(src, 0, 4, metadata="old")], group_metadata)
        monkeypatch.undo()
        await writer.txn_abort()  # replaces the producer
        await writer.txn_begin()
        await writer.txn_produce(_failed(src, 7, group), dlq_topic)
        await writer.txn_commit([TopicPartition(src, 0, 8, metadata="new")], group_metadata)
        nursery.cancel_scope.cancel()
    got = await _committed_once_visible(broker, dlq_topic)
    assert [r.value for r in got] == [
        b"v7"
    ]  # read_committed: the fenced transaction's record is gone
    # read_committed OffsetFetch (require_stable): fails while a transactional offset commit is pending.
    committed = await trio.to_thread.run_sync(broker.committed, group, src, [0])
    assert committed[0] == (8, "new")


async def _committed_once_visible(broker: Broker, topic: str) -> list[Rec]:
    """The topic's records (read_committed, to its end) once the last commit's are visible: its
    markers are written after the commit returns, and an earlier open transaction holds the stable
    offset back until it ends, so every earlier transaction has ended by then too."""
    await _wait_thread(lambda: broker.count_committed_records(topic) > 0, 60, "a committed record")
    return await trio.to_thread.run_sync(broker.read_committed_to_end, topic)


def _read_uncommitted(
    bootstrap: str, topic: str
) -> list[tuple[int, tuple[tuple[str, bytes], ...]]]:
    """(offset, headers) of every data record in partition 0, aborted ones included."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"ru-{topic}",
            "isolation.level": "read_uncommitted",
            "enable.partition.eof": True,
        }
    )
    out: list[tuple[int, tuple[tuple[str, bytes], ...]]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 60
        while True:
            msgs = consumer.consume(100, 1)
            assert msgs or time.monotonic() < deadline, "no end of partition within 60 s"
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    return out
                out.append((int(msg.offset() or 0), tuple(msg.headers() or ())))
    finally:
        consumer.close()


async def test_an_abort_is_checked_for_its_marker_and_an_abort_only_transaction_stays_invisible(
    broker: Broker, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an abort the writer reads its DLQ partitions' last stable offset (the KAFKA-20734 check):
    on a healthy broker the marker is there, so nothing more is written. The abort-only transaction
    that writes a skipped marker leaves one aborted probe record, which read_committed readers (the
    DLQ's) never see, and the partition's stable offset reaches its end."""
    src = broker.create_topic(f"src-{unique}", partitions=1)
    dlq_topic = broker.create_topic(f"dlq-{unique}", partitions=1)
    group = f"g-{unique}"
    writer = transactional_dlq_writer(broker.bootstrap, group, f"txn-{unique}")
    await trio.to_thread.run_sync(writer.prepare_topics_sync, [dlq_topic])
    member = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    group_metadata = member.consumer_group_metadata()
    member.close()
    tp = (dlq_topic, 0)
    # A wait for the settle time would take 15 s, a settled partition's check far less, loaded or not.
    monkeypatch.setattr(dlq_txn, "ABORT_SETTLE_S", 15.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.txn_begin()
        await writer.txn_produce(_failed(src, 3, group), dlq_topic)
        t0 = trio.current_time()
        await writer.txn_abort()
        took = trio.current_time() - t0
        assert writer.abort_markers_repaired == 0
        assert took < dlq_txn.ABORT_SETTLE_S, f"a settled partition was waited on ({took:.1f}s)"
        deadline = trio.current_time() + 10
        ends = await writer._log_ends([tp], committed=False, deadline=deadline)
        stable = await writer._log_ends([tp], committed=True, deadline=deadline)
        assert ends == stable == {tp: 2}  # the aborted record and its ABORT marker

        await writer._abort_only([tp])
        ends = await writer._log_ends([tp], committed=False, deadline=deadline)
        stable = await writer._log_ends([tp], committed=True, deadline=deadline)
        assert ends == stable == {tp: 4}  # the probe and its ABORT marker

        await writer.txn_begin()
        await writer.txn_produce(_failed(src, 7, group), dlq_topic)
        await writer.txn_commit([TopicPartition(src, 0, 8, metadata="m")], group_metadata)
        nursery.cancel_scope.cancel()
    got = await _committed_once_visible(broker, dlq_topic)
    assert [r.value for r in got] == [b"v7"]
    raw = await trio.to_thread.run_sync(_read_uncommitted, broker.bootstrap, dlq_topic)
    assert [off for off, _ in raw] == [0, 2, 4]
    assert (dlq_module.PROBE_HEADER, b"abort-only") in raw[1][1]


async def test_an_unknown_commit_outcome_is_read_from_the_groups_stable_offsets(
    broker: Broker, unique: str
) -> None:
    """A commit whose outcome is unknown is settled by fencing the producer and reading the group's
    stable committed offsets (tests/unit/test_dlq_txn_outcome.py has the decisions). On the real broker:
    a transaction that committed reads as committed and its record stays, once; one left open with its
    offsets sent (a pending transactional offset commit, which answers UNSTABLE_OFFSET_COMMIT until it
    ends) is aborted by the fencing and reads as not committed, and neither its record nor its offsets
    become visible; the redone transaction then commits."""
    src = broker.create_topic(f"src-{unique}", partitions=1)
    dlq_topic = broker.create_topic(f"dlq-{unique}", partitions=1)
    group = f"g-{unique}"
    writer = transactional_dlq_writer(broker.bootstrap, group, f"txn-{unique}")
    await trio.to_thread.run_sync(writer.prepare_topics_sync, [dlq_topic])
    member = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    group_metadata = member.consumer_group_metadata()
    member.close()
    first = [TopicPartition(src, 0, 4, metadata="first")]
    second = [TopicPartition(src, 0, 8, metadata="second")]
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.txn_begin()
        await writer.txn_produce(_failed(src, 3, group), dlq_topic)
        await writer.txn_commit(first, group_metadata)
        assert await writer._settle_outcome(first, "test: committed") is True
        assert writer.producers_replaced == 1

        await writer.txn_begin()
        await writer.txn_produce(_failed(src, 7, group), dlq_topic)
        offsets = list(second)
        await trio.to_thread.run_sync(
            lambda: writer._producer.send_offsets_to_transaction(offsets, group_metadata, 10)  # type: ignore[union-attr]
        )
        assert await writer._settle_outcome(second, "test: left open") is False
        assert writer.producers_replaced == 2
        assert await trio.to_thread.run_sync(broker.committed, group, src, [0]) == {0: (4, "first")}

        await writer.txn_begin()
        await writer.txn_produce(_failed(src, 7, group), dlq_topic)
        await writer.txn_commit(second, group_metadata)
        nursery.cancel_scope.cancel()
    got = await _committed_once_visible(broker, dlq_topic)
    assert [r.value for r in got] == [b"v3", b"v7"]
    assert (await trio.to_thread.run_sync(broker.committed, group, src, [0]))[0] == (8, "second")
