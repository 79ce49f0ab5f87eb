"""The Kafka source on the real broker: where an assignment starts, and commits through the poll thread."""

from __future__ import annotations

import pytest
import trio
from confluent_kafka import Consumer, TopicPartition

from sidecar.kafka.source import KafkaSource, OffsetToCommit
from tests.harness import RecordingListener, wait_until
from tests.kafkatools import Broker, Rec

pytestmark = pytest.mark.broker


def _commit_directly(bootstrap: str, group: str, topic: str, offset: int, metadata: str) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(
            offsets=[TopicPartition(topic, 0, offset, metadata=metadata)], asynchronous=False
        )
    finally:
        consumer.close()


async def test_fetching_starts_at_the_committed_offset_the_ledger_starts_at(
    bootstrap: str, broker: Broker, unique: str
) -> None:
    topic, group = f"src-{unique}", f"g-{unique}"
    broker.create_topic(topic, 1)
    broker.produce(topic, [Rec(key=b"k", value=str(i).encode(), partition=0) for i in range(10)])
    await trio.to_thread.run_sync(_commit_directly, bootstrap, group, topic, 4, "state-at-4")

    listener = RecordingListener()
    source = KafkaSource({"bootstrap.servers": bootstrap, "group.id": group}, [topic], listener)
    async with trio.open_nursery() as nursery:
        source.start()
        nursery.start_soon(source.run)
        await wait_until(lambda: len(listener.messages) >= 6, 60, "the records after offset 4")
        assert [(a.committed_offset, a.metadata) for a in listener.assigned] == [(4, "state-at-4")]
        # Fetching began where the ledger begins: no record before the committed offset.
        assert [m.offset() for m in listener.messages] == list(range(4, 10))

        # A commit goes through the poll thread and comes back through the commit callback.
        await source.commit([OffsetToCommit(topic, 0, 7, "state-at-7")])
        committed = await trio.to_thread.run_sync(broker.committed, group, topic, [0])
        assert committed == {0: (7, "state-at-7")}
        # Two identical commits at once: each caller gets a result.
        async with trio.open_nursery() as inner:
            for _ in range(2):
                inner.start_soon(source.commit, [OffsetToCommit(topic, 0, 8, "same")])
        assert await trio.to_thread.run_sync(broker.committed, group, topic, [0]) == {
            0: (8, "same")
        }
        source.stop_polling()
        await source.wait_stopped()
        # After the poll loop stopped, a commit still lands (synchronously, in a worker thread).
        await source.commit([OffsetToCommit(topic, 0, 9, "after-stop")])
        await source.close()
        nursery.cancel_scope.cancel()
    assert await trio.to_thread.run_sync(broker.committed, group, topic, [0]) == {
        0: (9, "after-stop")
    }


async def test_no_committed_offset_starts_at_the_reset_policy(
    bootstrap: str, broker: Broker, unique: str
) -> None:
    topic, group = f"src-{unique}", f"g-{unique}"
    broker.create_topic(topic, 1)
    broker.produce(topic, [Rec(key=None, value=b"old", partition=0) for _ in range(3)])
    listener = RecordingListener()
    source = KafkaSource(
        {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "latest"},
        [topic],
        listener,
    )
    async with trio.open_nursery() as nursery:
        source.start()
        nursery.start_soon(source.run)
        await wait_until(lambda: bool(listener.assigned), 60, "the assignment")
        assert listener.assigned[0].committed_offset is None
        # The consumer resolves "latest" after the assignment, at a moment the client does not show:
        # a record produced before then is behind the start and never read. Produce new records
        # until one arrives; the old ones must never come.
        with trio.move_on_after(60):
            while not listener.messages:
                broker.produce(topic, [Rec(key=None, value=b"new", partition=0)])
                with trio.move_on_after(2):
                    while not listener.messages:
                        await trio.sleep(0.05)
        assert listener.messages, "no new record read in 60 s"
        got = [(m.offset(), m.value()) for m in listener.messages]
        assert all(value == b"new" and offset >= 3 for offset, value in got), got
        source.stop_polling()
        await source.wait_stopped()
        await source.close()
        nursery.cancel_scope.cancel()
