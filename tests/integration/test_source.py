"""The Kafka source on the real broker: where an assignment starts, the order of batches and revokes,
commits, and which intake runs (the queue signal on trio's thread, or the poll thread it falls back to)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import pytest
import trio
from confluent_kafka import Consumer, Message, TopicPartition

from sidecar.kafka.queue_signal import installed_version
from sidecar.kafka.source import AssignedPartition, KafkaSource, OffsetToCommit
from sidecar.kafka.source_port import OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, start_offsets
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


def _starts(bootstrap: str, topic: str, reset: int) -> list[int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}"})
    try:
        assigned = [
            AssignedPartition(topic, 0, None, None),
            AssignedPartition(topic, 1, 7, "committed"),
        ]
        return [tp.offset for tp in start_offsets(consumer, assigned, reset, 10.0)]
    finally:
        consumer.close()


def test_start_offsets_are_looked_up_for_partitions_with_no_committed_offset(
    bootstrap: str, broker: Broker, unique: str
) -> None:
    # Looked up at once for every partition (librdkafka would look each up alone before its first
    # fetch): the log start for "earliest", the end for "latest"; a committed offset as it is.
    topic = f"src-{unique}"
    broker.create_topic(topic, 2)
    broker.produce(topic, [Rec(key=None, value=b"v", partition=0) for _ in range(3)])
    assert _starts(bootstrap, topic, OFFSET_BEGINNING) == [0, 7]
    assert _starts(bootstrap, topic, OFFSET_END) == [3, 7]
    assert _starts(bootstrap, topic, OFFSET_INVALID) == [OFFSET_INVALID, 7]  # "error": librdkafka's


class _OrderListener(RecordingListener):
    """Records the order of everything the source hands over: ("m", partition, offset), ("revoked", p)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int, int]] = []

    async def on_assigned(self, partitions: Sequence[AssignedPartition]) -> None:
        await super().on_assigned(partitions)
        self.events += [("assigned", ap.partition, -1) for ap in partitions]

    def revoked_now(self, partitions: Sequence[tuple[str, int]]) -> Sequence[OffsetToCommit]:
        self.events += [("revoked", p, -1) for _, p in partitions]
        return super().revoked_now(partitions)

    def on_messages(self, messages: Sequence[Message]) -> None:
        super().on_messages(messages)
        self.events += [("m", m.partition() or 0, m.offset() or 0) for m in messages]


async def test_batches_reach_the_listener_before_a_revoke_of_their_partition(
    bootstrap: str, broker: Broker, unique: str
) -> None:
    # The poll thread hands batches over without waiting for them; a rebalance callback must still
    # come after every batch fetched before it (a record of a revoked partition handed over after
    # its revoke would be read into a ledger that is gone, or into the next assignment's).
    topic, group = f"src-{unique}", f"g-{unique}"
    broker.create_topic(topic, 4)
    props = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    first_listener, second_listener = _OrderListener(), _OrderListener()
    first = KafkaSource(props, [topic], first_listener, batch_size=5)
    second = KafkaSource(props, [topic], second_listener, batch_size=5)
    async with trio.open_nursery() as nursery:
        first.start()
        nursery.start_soon(first.run)
        await wait_until(lambda: len(first.assigned) == 4, 60, "every partition on the first")

        async def keep_producing() -> None:
            batch = [Rec(key=None, value=b"v", partition=p) for p in range(4) for _ in range(5)]
            while True:
                await trio.to_thread.run_sync(broker.produce, topic, batch)

        nursery.start_soon(keep_producing)
        await wait_until(lambda: len(first_listener.messages) >= 100, 60, "records flowing")
        second.start()
        nursery.start_soon(second.run)
        await wait_until(
            lambda: any(e[0] == "revoked" for e in first_listener.events), 60, "a revoke"
        )
        await wait_until(lambda: len(second_listener.messages) >= 20, 60, "records on the second")
        for source in (first, second):
            source.stop_polling()
            await source.wait_stopped()
            await source.close()
        nursery.cancel_scope.cancel()
    owned: set[int] = set()
    for kind, partition, offset in first_listener.events:
        if kind == "assigned":
            owned.add(partition)
        elif kind == "revoked":
            owned.discard(partition)
        else:
            assert partition in owned, f"record {partition}@{offset} handed over after its revoke"


class _CommitDuringRevoke(RecordingListener):
    """On a revoke: a commit of an older state of the partition, as the engine's periodic commit
    makes while the revoke waits for the app's answers, queued behind the revoke (the poll thread
    is inside it); then the revoke's final state, `revoke_commit`."""

    def __init__(self, nursery: trio.Nursery) -> None:
        super().__init__(revoke_commit=(5, "final"))
        self.nursery = nursery
        self.source: KafkaSource | None = None
        self.older_done = trio.Event()
        self.revoked: list[int] = []

    async def on_revoked(self, partitions: Sequence[tuple[str, int]]) -> Sequence[OffsetToCommit]:
        source = self.source
        assert source is not None
        if not self.revoked:
            self.revoked = [p for _, p in partitions]

            async def commit_older() -> None:
                await source.commit([OffsetToCommit(t, p, 3, "older") for t, p in partitions])
                self.older_done.set()

            self.nursery.start_soon(commit_older)
            await wait_until(lambda: bool(source._commands), 10, "the older commit queued")
        return self.revoked_now(partitions)


async def test_a_commit_queued_before_a_revoke_does_not_land_after_its_final_commit(
    bootstrap: str, broker: Broker, unique: str
) -> None:
    # Landing after the revoke's final commit, the older state would send the next owner back to
    # it: what was answered in between would be delivered again.
    topic, group = f"src-{unique}", f"g-{unique}"
    broker.create_topic(topic, 2)
    broker.produce(topic, [Rec(key=None, value=b"v", partition=i % 2) for i in range(20)])
    props = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
    }
    async with trio.open_nursery() as nursery:
        listener = _CommitDuringRevoke(nursery)
        first = KafkaSource(props, [topic], listener)
        listener.source = first
        second = KafkaSource(props, [topic], RecordingListener())
        first.start()
        nursery.start_soon(first.run)
        await wait_until(lambda: len(listener.messages) >= 20, 60, "the records")
        second.start()  # joining, it takes a partition through a revoke of the first's
        nursery.start_soon(second.run)
        with trio.fail_after(60):
            await listener.older_done.wait()
        # The older commit has returned: had it gone out, the broker would hold it now.
        committed = await trio.to_thread.run_sync(broker.committed, group, topic, listener.revoked)
        assert committed == dict.fromkeys(listener.revoked, (5, "final"))
        for source in (first, second):
            source.stop_polling()
            await source.wait_stopped()
            await source.close()
        nursery.cancel_scope.cancel()


async def test_a_cancelled_poll_loop_ends_its_thread(
    bootstrap: str, broker: Broker, unique: str
) -> None:
    topic, group = f"src-{unique}", f"g-{unique}"
    broker.create_topic(topic, 1)
    listener = RecordingListener()
    source = KafkaSource({"bootstrap.servers": bootstrap, "group.id": group}, [topic], listener)
    source.start()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(source.run)
        await wait_until(lambda: bool(listener.assigned), 60, "the assignment")
        nursery.cancel_scope.cancel()  # no stop_polling(): cancelled, as when the engine fails
    # The poll loop returned (its thread joined), and the consumer is usable from here again.
    assert source._stopped.is_set()
    assert not source._poll_thread_active
    await source.close()


class _BrokenListener(RecordingListener):
    """A listener with a bug: taking a batch raises."""

    def on_messages(self, messages: Sequence[Message]) -> None:
        super().on_messages(messages)
        raise ZeroDivisionError("a bug in the listener")


async def test_an_error_taking_a_batch_ends_the_poll_loop_with_it(
    bootstrap: str, broker: Broker, unique: str
) -> None:
    # Batches are taken in trio's wake-up callback, not in the poll loop's task: the listener's
    # error must still end the poll loop (and so the engine), not vanish or crash trio itself.
    topic, group = f"src-{unique}", f"g-{unique}"
    broker.create_topic(topic, 1)
    broker.produce(topic, [Rec(key=None, value=b"v", partition=0) for _ in range(3)])
    listener = _BrokenListener()
    source = KafkaSource(
        {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"},
        [topic],
        listener,
    )
    source.start()
    with trio.fail_after(60), pytest.raises(ZeroDivisionError, match="a bug in the listener"):
        await source.run()
    assert listener.messages  # it was handed a batch, once
    assert source._stopped.is_set()
    assert not source._poll_thread_active  # the thread was joined
    await source.close()


def _two_partition_source(
    bootstrap: str, broker: Broker, unique: str, queue_signal: bool, props: dict[str, object]
) -> tuple[str, KafkaSource, RecordingListener]:
    """A new two-partition topic and a source on it (earliest, its own group), with `props`."""
    topic = f"src-{unique}"
    broker.create_topic(topic, 2)
    listener = RecordingListener()
    base = {
        "bootstrap.servers": bootstrap,
        "group.id": f"g-{unique}",
        "auto.offset.reset": "earliest",
    }
    source = KafkaSource({**base, **props}, [topic], listener, queue_signal=queue_signal)
    return topic, source, listener


async def _records_through(
    bootstrap: str,
    broker: Broker,
    unique: str,
    *,
    queue_signal: bool = True,
    strategy: str = "cooperative-sticky",
) -> tuple[KafkaSource, RecordingListener, set[str]]:
    """A source that takes 50 records; the names of the process's threads while it did."""
    topic, source, listener = _two_partition_source(
        bootstrap, broker, unique, queue_signal, {"partition.assignment.strategy": strategy}
    )
    threads: set[str] = set()
    async with trio.open_nursery() as nursery:
        source.start()
        nursery.start_soon(source.run)
        await wait_until(lambda: len(source.assigned) == 2, 60, "the assignment")
        batch = [Rec(key=None, value=b"v", partition=i % 2) for i in range(50)]
        await trio.to_thread.run_sync(broker.produce, topic, batch)
        await wait_until(lambda: len(listener.messages) >= 50, 60, "the records")
        threads = {t.name for t in threading.enumerate()}
        # A commit's result comes back through the same queue (its callback on trio's thread).
        await source.commit([OffsetToCommit(topic, 0, 25, "m")])
        source.stop_polling()
        await source.wait_stopped()
        await source.close()
        nursery.cancel_scope.cancel()
    assert sorted(m.offset() or 0 for m in listener.messages if m.partition() == 0) == list(
        range(25)
    )
    return source, listener, threads


async def test_records_come_through_the_queue_signal_on_trio_s_thread(
    bootstrap: str, broker: Broker, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.source")
    source, _listener, threads = await _records_through(bootstrap, broker, unique)
    assert source.intake == "queue-signal"
    assert "sidecar-poll" not in threads  # no poll thread ran: trio's thread took the records
    assert "poll thread" not in caplog.text


async def test_intake_thread_takes_the_records_through_the_poll_thread_and_says_nothing(
    bootstrap: str, broker: Broker, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sidecar.source")
    source, _listener, threads = await _records_through(
        bootstrap, broker, unique, queue_signal=False
    )
    assert source.intake == "poll-thread"
    assert "sidecar-poll" in threads
    assert "poll thread" not in caplog.text


async def test_an_eager_rebalance_protocol_takes_the_poll_thread_and_says_why(
    bootstrap: str, broker: Broker, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Its revoke cannot be held open on trio's thread (HeldRevokes): the poll thread waits instead.
    caplog.set_level(logging.INFO, logger="sidecar.source")
    source, _listener, threads = await _records_through(bootstrap, broker, unique, strategy="range")
    assert source.intake == "poll-thread"
    assert "sidecar-poll" in threads
    said = [r.getMessage() for r in caplog.records if "poll thread" in r.getMessage()]
    assert said == [
        "consumer records through a poll thread: an eager rebalance protocol's revoke cannot be "
        "held open on trio's thread"
    ]


async def test_a_failed_handle_check_falls_back_to_the_poll_thread_and_says_why(
    bootstrap: str,
    broker: Broker,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sidecar.kafka.queue_signal.CHECKED_WITH", {})
    caplog.set_level(logging.INFO, logger="sidecar.source")
    source, _listener, threads = await _records_through(bootstrap, broker, unique)
    assert source.intake == "poll-thread"
    assert "sidecar-poll" in threads
    said = [r.getMessage() for r in caplog.records if "poll thread" in r.getMessage()]
    assert said == [
        f"consumer records through a poll thread: confluent-kafka {installed_version()} "
        "is not one the handle layout was checked with"
    ]


class _HeldListener(RecordingListener):
    """A revoke's wait for answers in flight: `on_revoked` returns only once `answers_in` is set,
    with the state after them; `revoked_now` (a revoke that cannot wait) would commit another."""

    def __init__(self) -> None:
        super().__init__()
        self.answers_in = trio.Event()
        self.revoking: list[tuple[str, int]] = []

    async def on_revoked(self, partitions: Sequence[tuple[str, int]]) -> Sequence[OffsetToCommit]:
        self.revoking.extend(partitions)
        await self.answers_in.wait()
        return [OffsetToCommit(t, p, 5, "after-the-answers") for t, p in partitions]

    def revoked_now(self, partitions: Sequence[tuple[str, int]]) -> Sequence[OffsetToCommit]:
        return [OffsetToCommit(t, p, 1, "at-once") for t, p in partitions]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
async def test_a_revoke_on_trio_s_thread_waits_for_the_answers_and_commits_after_them(
    bootstrap: str, broker: Broker, unique: str, protocol: str
) -> None:
    # The queue signal serves a rebalance inside consume() on trio's thread: the revoke is held
    # (its partitions paused and kept) while the listener waits, then committed and let go.
    topic, group = f"src-{unique}", f"g-{unique}"
    broker.create_topic(topic, 2)
    props = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": protocol,
        "auto.offset.reset": "earliest",
    }
    first_listener, second_listener = _HeldListener(), RecordingListener()
    first = KafkaSource(props, [topic], first_listener, queue_signal=True)
    second = KafkaSource(dict(props), [topic], second_listener, queue_signal=True)
    async with trio.open_nursery() as nursery:
        first.start()
        nursery.start_soon(first.run)
        await wait_until(lambda: len(first.assigned) == 2, 60, "the first member's assignment")
        assert first.intake == "queue-signal"
        second.start()
        nursery.start_soon(second.run)
        await wait_until(lambda: bool(first_listener.revoking), 60, "a revoke on the first")
        (key,) = first_listener.revoking
        # Held: still the first member's, and the group waits for it.
        assert key in first.assigned
        broker.produce(topic, [Rec(key=None, value=b"while-held", partition=key[1])] * 6)
        assert not [a for a in second_listener.assigned if (a.topic, a.partition) == key]
        first_listener.answers_in.set()
        await wait_until(
            lambda: any((a.topic, a.partition) == key for a in second_listener.assigned),
            60,
            "the revoked partition at the second member",
        )
        (handed,) = [a for a in second_listener.assigned if (a.topic, a.partition) == key]
        assert (handed.committed_offset, handed.metadata) == (5, "after-the-answers")
        assert key not in first.assigned
        # Nothing of the held partition reached the first member's listener.
        assert not [m for m in first_listener.messages if (m.topic(), m.partition()) == key]
        # The second leaves: the first takes the partition back and fetches it (its pause while
        # held is not left behind on librdkafka's partition object).
        second.stop_polling()
        await second.wait_stopped()
        await second.close()
        await wait_until(lambda: key in first.assigned, 60, "the partition back at the first")
        broker.produce(topic, [Rec(key=None, value=b"back", partition=key[1])])
        await wait_until(
            lambda: any(m.value() == b"back" for m in first_listener.messages),
            60,
            "a record of the partition taken back",
        )
        first.stop_polling()
        await first.wait_stopped()
        await first.close()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("queue_signal", [True, False], ids=["signal", "poll-thread"])
async def test_a_resume_with_every_partition_paused_fetches_at_once_and_from_where_it_stopped(
    bootstrap: str, broker: Broker, unique: str, queue_signal: bool
) -> None:
    """librdkafka's fetcher, with every partition paused, sleeps out a one-second serve timeout
    that a resume does not end; the source wakes it. Each round: records taken, both partitions
    paused, the fetcher left idle, new records, resume: the new records come well inside that
    second, each offset exactly once."""
    topic, source, listener = _two_partition_source(
        bootstrap, broker, unique, queue_signal, {"fetch.wait.max.ms": 100}
    )
    keys = [(topic, 0), (topic, 1)]
    waits: list[float] = []
    async with trio.open_nursery() as nursery:
        source.start()
        nursery.start_soon(source.run)
        await wait_until(lambda: len(source.assigned) == 2, 60, "the assignment")
        for round_ in range(3):
            rec = [Rec(key=None, value=b"v", partition=p) for p in (0, 1)]
            await trio.to_thread.run_sync(broker.produce, topic, rec)
            want = 4 * round_ + 2
            await wait_until(lambda n=want: len(listener.messages) >= n, 60, "the records")
            source.pause(keys)
            # The fetch under way (held by the broker up to fetch.wait.max.ms, 100 ms) ends and
            # the fetcher, with nothing to fetch, goes to sleep.
            await trio.sleep(0.4)
            await trio.to_thread.run_sync(broker.produce, topic, rec)
            start = trio.current_time()
            source.resume(keys)
            await wait_until(
                lambda n=want + 2: len(listener.messages) >= n, 60, "the resumed records"
            )
            waits.append(trio.current_time() - start)
        source.stop_polling()
        await source.wait_stopped()
        await source.close()
        nursery.cancel_scope.cancel()
    for p in (0, 1):
        assert sorted(m.offset() or 0 for m in listener.messages if m.partition() == p) == list(
            range(6)
        )
    assert max(waits) < 0.4, waits  # without the wake-up: about 0.6 s each round
