"""An abort the transaction coordinator refuses (INVALID_TXN_STATE, fatal in librdkafka), reproduced on
purpose on a private broker behind the fault proxy.

What the broker SIGKILL + restart scenario hit under load: the broker died while the transaction after a
committed one had its AddPartitionsToTxn in flight. librdkafka counts a request that failed in transport
as received (it cannot know), so aborting the transaction sends EndTxn(abort); the coordinator, whose last
transaction for the id is COMPLETE_COMMIT and which never saw this one, answers INVALID_TXN_STATE
("state is COMPLETE_COMMIT, but received transaction marker result to send: ABORT"). The writer must
replace the producer and go on, not stop; the transaction is redone and nothing is written twice.

Here the proxy holds the producer's AddPartitionsToTxn (blackhole-produce), then drops it with the
connection (reset), and lets the abort through once librdkafka has begun it. The decisions are in
tests/unit/test_dlq_txn_outcome.py.
"""

from __future__ import annotations

import time

import trio
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sidecar.kafka.dlq import CAUSE_REJECTED, DlqTxnAbortable, DlqWriter, FailedRecord
from tests.faults.broker import PrivateBroker
from tests.faults.proxy import BLACKHOLE_PRODUCE, PASS, RESET, FaultProxy

REFUSED = "received transaction marker result to send: ABORT"


async def _wait(cond, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    with trio.move_on_after(timeout_s):
        while not cond():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def _failed(src: str, offset: int, group: str) -> FailedRecord:
    return FailedRecord(
        topic=src,
        partition=0,
        offset=offset,
        key=None,
        value=f"v{offset}".encode(),
        headers=(),
        group=group,
        delivery_count=1,
        cause=CAUSE_REJECTED,
    )


def _read_committed(bootstrap: str, topic: str) -> list[bytes | None]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"rc-{topic}",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    out: list[bytes | None] = []
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
                out.append(msg.value())
    finally:
        consumer.close()


def _committed(bootstrap: str, group: str, src: str) -> tuple[int, str | None]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed"}
    )
    try:
        (tp,) = consumer.committed([TopicPartition(src, 0)], timeout=30)
        return tp.offset, tp.metadata
    finally:
        consumer.close()


async def test_an_abort_refused_after_a_lost_add_partitions_request_replaces_the_producer(
    kafka_behind_proxy: tuple[PrivateBroker, FaultProxy],
) -> None:
    broker, proxy = kafka_behind_proxy
    suffix = f"{time.monotonic_ns():x}"
    group, src, dlq_topic = f"g-refused-{suffix}", f"refused-{suffix}", f"dlq.refused-{suffix}"
    admin = AdminClient({"bootstrap.servers": broker.direct})
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=1, replication_factor=1) for t in (src, dlq_topic)]
    )
    await trio.to_thread.run_sync(lambda: [f.result(30) for f in futures.values()])
    writer = DlqWriter(
        {"bootstrap.servers": broker.external},
        group,
        copy_record=True,
        stacktrace_max_bytes=1024,
        retries_timeout_ms=10_000,
        auto_create=False,
        topic_partitions=1,
        topic_replication_factor=1,
        transactional_id=f"txn-refused-{suffix}",
    )
    await trio.to_thread.run_sync(writer.prepare_topics_sync, [dlq_topic])
    member = Consumer({"bootstrap.servers": broker.direct, "group.id": group})
    group_metadata = member.consumer_group_metadata()
    member.close()
    refused_before = broker.log_text().count(REFUSED)
    purged: list[BaseException] = []
    aborted: list[BaseException | None] = []

    async def produce_in_flight() -> None:
        try:
            await writer.txn_produce(_failed(src, 7, group), dlq_topic)
        except DlqTxnAbortable as exc:  # purged by the abort
            purged.append(exc)

    async def abort() -> None:
        try:
            await writer.txn_abort()
        except Exception as exc:  # recorded for the assertion below
            aborted.append(exc)
        else:
            aborted.append(None)

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        # A committed transaction: the coordinator's state for the id is COMPLETE_COMMIT.
        await writer.txn_begin()
        await writer.txn_produce(_failed(src, 3, group), dlq_topic)
        await writer.txn_commit([TopicPartition(src, 0, 4, metadata="first")], group_metadata)

        # The next transaction's AddPartitionsToTxn is held, then lost with the connection.
        await writer.txn_begin()
        await trio.to_thread.run_sync(proxy.set_mode, BLACKHOLE_PRODUCE)
        nursery.start_soon(produce_in_flight)
        await _wait(lambda: proxy.held_producer_chunks > 0, 30, "the AddPartitionsToTxn to be held")
        await trio.to_thread.run_sync(proxy.set_mode, RESET)
        # Aborted (in the scenario: its partitions were lost, its records timed out). librdkafka
        # purges the record at once and sends EndTxn(abort) when the coordinator is back.
        nursery.start_soon(abort)
        await _wait(lambda: purged, 60, "the abort to purge the record")
        await trio.to_thread.run_sync(proxy.set_mode, PASS)
        await _wait(lambda: aborted, 90, "the abort to end")
        assert broker.log_text().count(REFUSED) > refused_before, (
            "the coordinator did not refuse the abort: the scenario was not reproduced"
        )
        assert aborted == [None], f"the abort failed: {aborted}"  # before: DlqFatalError
        assert writer.producers_replaced == 1

        # Redone on the new producer: committed once.
        await writer.txn_begin()
        await writer.txn_produce(_failed(src, 7, group), dlq_topic)
        await writer.txn_commit([TopicPartition(src, 0, 8, metadata="second")], group_metadata)
        nursery.cancel_scope.cancel()
    got = await trio.to_thread.run_sync(_read_committed, broker.direct, dlq_topic)
    assert got == [b"v3", b"v7"]
    assert await trio.to_thread.run_sync(_committed, broker.direct, group, src) == (8, "second")
