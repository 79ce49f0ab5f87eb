"""Replacing a stuck transactional DLQ producer: the old handle's report of its own fencing, raised by
a poll under way before the swap, must not stop the writer; an error from the live producer must.

A fake producer stands in for confluent-kafka's here: the race (the new producer's
init_transactions() fences the old one while the poll loop holds the old handle) cannot be timed
against a real broker. tests/integration/test_dlq_txn.py covers the replacement against one.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import trio
from confluent_kafka import KafkaError, KafkaException

from sidecar.kafka import dlq
from sidecar.kafka.dlq import writer as dlq_writer

FENCED = KafkaException(
    KafkaError(KafkaError._FENCED, "This instance has been fenced by a newer instance", fatal=True)
)


class FakeProducer:
    instances: list[FakeProducer] = []
    hold_next_init = False

    def __init__(self, conf: dict[str, Any], logger: Any = None) -> None:
        self.conf = conf
        self.polls = 0
        self.raised = threading.Event()
        self.poll_error: KafkaException | None = None
        self.outstanding = 0  # delivery reports due: the writer polls only while there are some
        self.init_started = threading.Event()
        self.init_gate = threading.Event()
        if not FakeProducer.hold_next_init:
            self.init_gate.set()
        FakeProducer.instances.append(self)

    def init_transactions(self, timeout: float) -> None:
        self.init_started.set()
        assert self.init_gate.wait(10), "init_transactions never released"

    def poll(self, timeout: float) -> int:
        self.polls += 1
        time.sleep(timeout)
        error, self.poll_error = self.poll_error, None
        if error is not None:
            self.raised.set()
            raise error
        return 0

    def flush(self, timeout: float) -> int:
        return 0

    def __len__(self) -> int:
        # rd_kafka_outq_len(): reports due plus queued events (a fatal error's).
        return self.outstanding + (self.poll_error is not None)


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> dlq.DlqWriter:
    FakeProducer.instances = []
    FakeProducer.hold_next_init = False
    monkeypatch.setattr(dlq_writer, "Producer", FakeProducer)
    w = dlq.DlqWriter(
        {"bootstrap.servers": "127.0.0.1:9"},
        group="g",
        copy_record=False,
        stacktrace_max_bytes=0,
        retries_timeout_ms=1000,
        auto_create=False,
        topic_partitions=1,
        topic_replication_factor=1,
    )
    w.transactional_id = "dlq-sidecar.g.test"
    return w


async def _until(cond: Any, what: str) -> None:
    with trio.move_on_after(30):
        while not cond():
            await trio.sleep(0.005)
        return
    raise AssertionError(f"timed out waiting for {what}")


async def _run(writer: dlq.DlqWriter, outcome: list[BaseException | None]) -> None:
    try:
        await writer.run()
    except trio.Cancelled:
        raise
    except BaseException as exc:  # recorded for the test to inspect
        outcome.append(exc)
    else:
        outcome.append(None)


async def test_fencing_reported_by_the_old_handle_before_the_swap_is_ignored(
    writer: dlq.DlqWriter,
) -> None:
    outcome: list[BaseException | None] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run, writer, outcome)
        await _until(lambda: FakeProducer.instances and FakeProducer.instances[0].polls > 0, "poll")
        old = FakeProducer.instances[0]
        # A DLQ record is in flight on the old producer: the writer keeps polling it.
        old.outstanding = 1
        writer._ask_poll()

        FakeProducer.hold_next_init = True
        nursery.start_soon(writer._replace_producer)
        await _until(
            lambda: (
                len(FakeProducer.instances) == 2 and FakeProducer.instances[1].init_started.is_set()
            ),
            "successor's init_transactions",
        )
        new = FakeProducer.instances[1]
        # The successor's init_transactions() has fenced the old producer; the old handle reports
        # it from the poll loop, which still polls it: the swap waits for init to return.
        old.poll_error = FENCED
        assert await trio.to_thread.run_sync(old.raised.wait, 30), "the old handle never raised"
        # The writer dealt with that error once it polls again (the old handle, until the swap).
        polls_at_error = old.polls
        await _until(lambda: outcome or old.polls > polls_at_error, "the next poll or a stop")
        assert not outcome, f"the writer stopped on the old handle's fencing: {outcome}"

        new.outstanding = 1  # and one on the successor, once it is in use
        new.init_gate.set()
        await _until(lambda: writer._producer is new and new.polls > 0, "polling the successor")
        polls_of_old, polls_of_new = old.polls, new.polls
        await _until(lambda: new.polls >= polls_of_new + 5, "five more polls of the successor")
        assert old.polls == polls_of_old, "the replaced producer is still polled"
        assert not outcome

        # The live producer's own fatal error still stops the writer.
        new.poll_error = FENCED
        await _until(lambda: bool(outcome), "the writer to stop")
        nursery.cancel_scope.cancel()
    assert isinstance(outcome[0], KafkaException)
    assert outcome[0].args[0].code() == KafkaError._FENCED


async def test_an_error_from_the_live_producer_stops_the_writer(writer: dlq.DlqWriter) -> None:
    outcome: list[BaseException | None] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run, writer, outcome)
        await _until(lambda: FakeProducer.instances and FakeProducer.instances[0].polls > 0, "poll")
        FakeProducer.instances[0].poll_error = FENCED
        writer._ask_poll()  # as the next call on the handle does
        await _until(lambda: bool(outcome), "the writer to stop")
        nursery.cancel_scope.cancel()
    assert isinstance(outcome[0], KafkaException)
