"""The DLQ producer is polled only while it has something to serve (issue 19, no busy polling).

An idle writer sleeps on an event (no thread, no timer); a produce() wakes it, it polls until the
record's delivery report is served, and then it sleeps again. A fake producer stands in for
confluent-kafka's: what is asserted is which calls the writer makes on the handle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from sidecar.kafka import dlq
from sidecar.kafka.dlq import writer as dlq_writer


class FakeProducer:
    instances: list[FakeProducer] = []

    def __init__(self, conf: dict[str, Any], logger: Any = None) -> None:
        self.polls = 0
        self.release = threading.Event()  # delivery reports are served once set
        self._reports: list[Callable[..., None]] = []
        self._lock = threading.Lock()
        FakeProducer.instances.append(self)

    def produce(self, topic: str, **kwargs: Any) -> None:
        with self._lock:
            self._reports.append(kwargs["on_delivery"])

    def poll(self, timeout: float) -> int:
        self.polls += 1
        time.sleep(min(timeout, 0.002))
        if not self.release.is_set():
            return 0
        with self._lock:
            reports, self._reports = self._reports, []
        for on_delivery in reports:
            on_delivery(None, None)
        return len(reports)

    def flush(self, timeout: float) -> int:
        return 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._reports)


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> dlq.DlqWriter:
    FakeProducer.instances = []
    monkeypatch.setattr(dlq_writer, "Producer", FakeProducer)
    return dlq.DlqWriter(
        {"bootstrap.servers": "127.0.0.1:9"},
        group="g",
        copy_record=False,
        stacktrace_max_bytes=0,
        retries_timeout_ms=1000,
        auto_create=False,
        topic_partitions=1,
        topic_replication_factor=1,
    )


async def _until(cond: Callable[[], object], what: str) -> None:
    with trio.move_on_after(30):
        while not cond():
            await trio.sleep(0.005)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def _all_blocked() -> None:
    with trio.move_on_after(10):
        await trio.testing.wait_all_tasks_blocked(cushion=0.2)


RECORD = dlq.DlqRecord("dlq.orders", 0, None, None, (("__dlq.errors.topic", b"orders"),))


async def test_an_idle_writer_does_not_poll_and_a_produce_polls_until_its_report_is_served(
    writer: dlq.DlqWriter,
) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        producer = FakeProducer.instances[0]
        await _until(lambda: writer.poll_sleeping, "the poll loop to sleep")
        idle_polls = producer.polls
        # Every task blocked, the poll loop among them, for longer than the old 20 ms poll period
        # (a loop that keeps polling never lets this return: bounded, and the count tells).
        await _all_blocked()
        assert producer.polls == idle_polls, "an idle producer was polled"
        assert writer.poll_sleeping

        done = trio.Event()
        errors: list[object] = []

        async def produce() -> None:
            errors.append(await writer._produce(RECORD))
            done.set()

        nursery.start_soon(produce)
        # Its report is due but not yet served: the writer keeps polling for it.
        await _until(lambda: producer.polls >= idle_polls + 3, "polls while the report is due")
        assert not writer.poll_sleeping and not done.is_set()
        producer.release.set()
        await done.wait()
        assert errors == [None]
        await _until(lambda: writer.poll_sleeping, "the poll loop to sleep again")
        after = producer.polls
        await _all_blocked()
        assert producer.polls == after, "polled again with nothing due"
        nursery.cancel_scope.cancel()


async def test_records_go_to_librdkafka_one_wave_per_dlq_partition(writer: dlq.DlqWriter) -> None:
    """While a DLQ partition has a record whose report is not back, its next records wait in the
    writer (not in librdkafka, whose broker thread would spin on them); they go together once it is.
    Another partition's record is not held."""
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        producer = FakeProducer.instances[0]
        results: list[object] = []

        async def produce(record: dlq.DlqRecord) -> None:
            results.append(await writer._produce(record))

        nursery.start_soon(produce, RECORD)
        await _until(lambda: len(producer) == 1, "the first record handed over")
        for _ in range(3):
            nursery.start_soon(produce, RECORD)
        other = dlq.DlqRecord("dlq.orders", 1, None, None, RECORD.headers)
        nursery.start_soon(produce, other)
        await _all_blocked()
        assert len(producer) == 2, (
            "only the first record and the other partition's were handed over"
        )
        producer.release.set()
        await _until(lambda: len(results) == 5, "every record confirmed")
        assert results == [None] * 5
        assert writer._waves.waiting() == 0
        nursery.cancel_scope.cancel()


async def test_a_wave_waits_for_every_record_of_the_one_before() -> None:
    waves = dlq_writer.Waves()
    key = ("dlq", 0)
    waves.handed(key)
    waves.handed(key)
    went: list[str] = []

    async def next_record(name: str) -> None:
        await waves.turn(key)
        waves.handed(key)
        went.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(next_record, "b")
        await trio.testing.wait_all_tasks_blocked()
        waves.confirmed(key)
        await trio.testing.wait_all_tasks_blocked()
        assert went == [], "went while one record of the wave before was unconfirmed"
        waves.confirmed(key)
        await trio.testing.wait_all_tasks_blocked()
        assert went == ["b"]
        # "b" is unconfirmed now: "c" waits for it; a replaced producer's reports never come.
        nursery.start_soon(next_record, "c")
        await trio.testing.wait_all_tasks_blocked()
        assert went == ["b"]
        waves.release_all()
        await trio.testing.wait_all_tasks_blocked()
        assert went == ["b", "c"]
