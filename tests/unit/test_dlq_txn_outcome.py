"""Transactional DLQ writer: a fatal producer error or a commit whose outcome is unknown ends the
transaction by replacing the producer, and never stops the sidecar unless a new producer cannot help.

The first test replays the broker SIGKILL + restart failure: the broker died while the transaction after
a committed one had its AddPartitionsToTxn in flight. librdkafka cannot know whether the coordinator got
it, so its abort sends EndTxn(abort); the coordinator, whose last transaction is COMPLETE_COMMIT and
which never saw the new one, answers INVALID_TXN_STATE, which librdkafka makes fatal: the abort call
fails with it and the poll loop is handed the same error. A fake producer stands in for
confluent-kafka's (the broker cannot be made to lose that request on cue); the group's committed
offsets, read to settle an unknown outcome, are a fake too. The real path is the broker-kill scenario
in tests/reliability/test_broker_faults.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import trio
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from sidecar.kafka import dlq
from sidecar.kafka.dlq import txn as dlq_txn
from sidecar.kafka.dlq import writer as dlq_writer

DLQ_TOPIC = "dlq.src"
SRC = "src"


def _fatal(code: int, text: str) -> KafkaException:
    return KafkaException(KafkaError(code, text, fatal=True))


INVALID_TXN_STATE = _fatal(
    KafkaError.INVALID_TXN_STATE,
    "Failed to end transaction: Broker: Producer attempted a transactional operation in an "
    "invalid state",
)
FENCED = _fatal(KafkaError._FENCED, "This instance has been fenced by a newer instance")
MSG_TIMED_OUT = KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out", retriable=True)
REQUIRES_ABORT = KafkaException(
    KafkaError(
        KafkaError._INCONSISTENT, "EndTxn commit failed: Local: Timed out", txn_requires_abort=True
    )
)


class FakeProducer:
    """confluent-kafka's transactional Producer, scripted: each `*_error` is raised by the next call."""

    instances: list[FakeProducer] = []

    def __init__(self, conf: dict[str, Any], logger: Any = None) -> None:
        self.conf = conf
        self.calls: list[str] = []
        self.polls = 0
        self.poll_raised = 0
        self.produce_error: KafkaError | None = None
        self.poll_error: KafkaException | None = None
        self.commit_error: KafkaException | None = None
        self.abort_error: KafkaException | None = None
        # Also handed to the poll loop, as librdkafka does with a fatal error (error_cb).
        self.abort_error_polled = False
        self.commit_gate: threading.Event | None = None
        self._reports: list[tuple[Callable[..., None], KafkaError | None]] = []
        self._lock = threading.Lock()
        FakeProducer.instances.append(self)

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init_transactions")

    def begin_transaction(self) -> None:
        self.calls.append("begin_transaction")

    def produce(self, topic: str, **kwargs: Any) -> None:
        self.calls.append("produce")
        with self._lock:
            self._reports.append((kwargs["on_delivery"], self.produce_error))

    def poll(self, timeout: float) -> int:
        self.polls += 1
        time.sleep(min(timeout, 0.005))
        with self._lock:
            reports, self._reports = self._reports, []
            error, self.poll_error = self.poll_error, None
        for on_delivery, err in reports:
            on_delivery(err, None)
        if error is not None:
            self.poll_raised += 1
            raise error
        return len(reports)

    def flush(self, timeout: float) -> int:
        return 0

    def __len__(self) -> int:
        # rd_kafka_outq_len(): undelivered reports plus queued events (a fatal error's).
        with self._lock:
            return len(self._reports) + (self.poll_error is not None)

    def send_offsets_to_transaction(
        self, offsets: Any, group_metadata: Any, timeout: float
    ) -> None:
        self.calls.append("send_offsets_to_transaction")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit_transaction")
        if self.commit_gate is not None:
            assert self.commit_gate.wait(30), "commit_transaction never released"
        error, self.commit_error = self.commit_error, None
        if error is not None:
            raise error

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort_transaction")
        error, self.abort_error = self.abort_error, None
        if error is not None:
            if self.abort_error_polled:
                with self._lock:
                    self.poll_error = error
            raise error


class FakeGroup:
    """The group's committed offsets, as `DlqWriter._group_offsets_sync` returns them."""

    def __init__(self, offsets: dict[tuple[str, int], tuple[int, str | None]]) -> None:
        self.offsets = offsets
        self.unstable_reads = 0  # reads answered UNSTABLE_OFFSET_COMMIT before the stable answer
        self.unreadable = False
        self.reads = 0

    def read(self, parts: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, str | None]]:
        self.reads += 1
        if self.unreadable:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Local: Timed out"))
        if self.unstable_reads > 0:
            self.unstable_reads -= 1
            raise KafkaException(
                KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT, "Broker: unstable offset commit")
            )
        return {tp: self.offsets[tp] for tp in parts}


class Checks:
    """Stands in for the ABORT-marker check (tests/unit/test_dlq_abort_markers.py covers it)."""

    def __init__(self) -> None:
        self.calls: list[set[tuple[str, int]]] = []

    async def check(self, touched: set[tuple[str, int]]) -> None:
        self.calls.append(set(touched))


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> dlq.DlqWriter:
    FakeProducer.instances = []
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
        transactional_id="dlq-sidecar.g.test",
    )
    w.topics.partitions[DLQ_TOPIC] = 1
    w.topics.max_bytes[DLQ_TOPIC] = None
    return w


@pytest.fixture
def checks(writer: dlq.DlqWriter, monkeypatch: pytest.MonkeyPatch) -> Checks:
    c = Checks()
    monkeypatch.setattr(writer, "_check_abort_markers", c.check)
    return c


def _group(
    writer: dlq.DlqWriter, monkeypatch: pytest.MonkeyPatch, offset: int, metadata: str
) -> FakeGroup:
    g = FakeGroup({(SRC, 0): (offset, metadata)})
    monkeypatch.setattr(writer, "_group_offsets_sync", g.read)
    return g


def _failed(offset: int) -> dlq.FailedRecord:
    return dlq.FailedRecord(
        topic=SRC,
        partition=0,
        offset=offset,
        key=None,
        value=b"v",
        headers=(),
        group="g",
        delivery_count=1,
        cause=dlq.CAUSE_REJECTED,
    )


# What the transaction under test sends; the group's offsets before it were (10, "before").
SENT = [TopicPartition(SRC, 0, 12, metadata="after")]


async def _until(cond: Callable[[], object], what: str) -> None:
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


async def _started(nursery: trio.Nursery, writer: dlq.DlqWriter) -> list[BaseException | None]:
    outcome: list[BaseException | None] = []
    nursery.start_soon(_run, writer, outcome)
    await _until(lambda: FakeProducer.instances and FakeProducer.instances[0].polls > 0, "polls")
    return outcome


async def _polled(writer: dlq.DlqWriter) -> None:
    """Wait until the poll loop has served everything queued on the writer's producer (an error
    it was handed would have been raised by then) and sleeps until the next call on the handle."""
    producer = writer._producer
    assert isinstance(producer, FakeProducer)
    await _until(lambda: writer.poll_sleeping and not len(producer), "the poll loop idle")


async def test_an_abort_refused_with_invalid_txn_state_replaces_the_producer_instead_of_stopping(
    writer: dlq.DlqWriter, checks: Checks
) -> None:
    async with trio.open_nursery() as nursery:
        outcome = await _started(nursery, writer)
        old = FakeProducer.instances[0]
        await writer.txn_begin()
        # The broker was killed with this transaction's AddPartitionsToTxn in flight; its records
        # time out while it is down.
        old.produce_error = MSG_TIMED_OUT
        with pytest.raises(dlq.DlqTxnAbortable):
            await writer.txn_produce(_failed(5), DLQ_TOPIC)
        old.abort_error = INVALID_TXN_STATE
        old.abort_error_polled = True

        await writer.txn_abort()  # before the fix: DlqFatalError, and the poll loop raised it

        assert len(FakeProducer.instances) == 2
        new = FakeProducer.instances[1]
        assert writer._producer is new
        assert new.calls == ["init_transactions"]
        assert checks.calls == [{(DLQ_TOPIC, 0)}], "the aborted records' partition is checked"
        await _polled(writer)
        assert not outcome, f"the writer stopped: {outcome}"

        # The batch is redone on the new producer, which commits it.
        await writer.txn_begin()
        await writer.txn_produce(_failed(5), DLQ_TOPIC)
        await writer.txn_commit(SENT, object())
        assert new.calls[-4:] == [
            "begin_transaction",
            "produce",
            "send_offsets_to_transaction",
            "commit_transaction",
        ]
        assert "abort_transaction" not in new.calls
        assert not outcome
        nursery.cancel_scope.cancel()


async def test_the_poll_loop_handing_over_a_fatal_error_between_transactions_does_not_stop_the_writer(
    writer: dlq.DlqWriter,
) -> None:
    async with trio.open_nursery() as nursery:
        outcome = await _started(nursery, writer)
        old = FakeProducer.instances[0]
        old.poll_error = INVALID_TXN_STATE
        # Polling is event-driven: the error is served by the poll that a call on the handle (the
        # previous transaction's last) asks for.
        writer._ask_poll()
        await _until(lambda: old.poll_raised, "the poll to raise it")
        await _until(lambda: outcome or writer.poll_sleeping, "the poll loop idle, or a stop")
        assert not outcome, f"the writer stopped: {outcome}"
        await writer.txn_begin()  # on a new producer
        assert len(FakeProducer.instances) == 2
        assert FakeProducer.instances[1].calls == ["init_transactions", "begin_transaction"]
        assert "begin_transaction" not in FakeProducer.instances[0].calls
        nursery.cancel_scope.cancel()


async def test_a_commit_failing_fatally_that_had_committed_is_not_redone(
    writer: dlq.DlqWriter, checks: Checks, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = _group(writer, monkeypatch, 12, "after")  # the transaction's own offsets
    async with trio.open_nursery() as nursery:
        outcome = await _started(nursery, writer)
        old = FakeProducer.instances[0]
        await writer.txn_begin()
        await writer.txn_produce(_failed(5), DLQ_TOPIC)
        old.commit_error = INVALID_TXN_STATE
        await writer.txn_commit(SENT, object())  # returns: it committed
        assert group.reads == 1
        assert writer.outcomes_settled == 1
        assert len(FakeProducer.instances) == 2, "the producer was replaced to end the transaction"
        assert "abort_transaction" not in old.calls
        assert checks.calls == []
        await writer.txn_abort()  # what the engine would do on a DlqTxnAbortable: a no-op now
        assert len(FakeProducer.instances) == 2
        assert not outcome
        nursery.cancel_scope.cancel()


async def test_a_commit_failing_fatally_that_had_not_committed_is_redone(
    writer: dlq.DlqWriter, checks: Checks, monkeypatch: pytest.MonkeyPatch
) -> None:
    _group(writer, monkeypatch, 10, "before")
    async with trio.open_nursery() as nursery:
        outcome = await _started(nursery, writer)
        await writer.txn_begin()
        await writer.txn_produce(_failed(5), DLQ_TOPIC)
        FakeProducer.instances[0].commit_error = INVALID_TXN_STATE
        with pytest.raises(dlq.DlqTxnAbortable, match="did not commit"):
            await writer.txn_commit(SENT, object())
        assert checks.calls == [{(DLQ_TOPIC, 0)}]
        await writer.txn_abort()  # already ended by the fencing
        assert len(FakeProducer.instances) == 2
        assert not outcome
        nursery.cancel_scope.cancel()


async def test_an_abort_refused_after_a_failed_commit_settles_the_outcome_instead_of_redoing(
    writer: dlq.DlqWriter, checks: Checks, monkeypatch: pytest.MonkeyPatch
) -> None:
    # commit_transaction() says "abort", but its EndTxn(commit) had reached the coordinator, which
    # then refuses the abort. Redoing the batch would write its DLQ records twice.
    _group(writer, monkeypatch, 12, "after")
    async with trio.open_nursery() as nursery:
        outcome = await _started(nursery, writer)
        old = FakeProducer.instances[0]
        await writer.txn_begin()
        await writer.txn_produce(_failed(5), DLQ_TOPIC)
        old.commit_error = REQUIRES_ABORT
        old.abort_error = INVALID_TXN_STATE
        old.abort_error_polled = True
        await writer.txn_commit(SENT, object())  # returns: it committed
        assert old.calls[-2:] == ["commit_transaction", "abort_transaction"]
        assert len(FakeProducer.instances) == 2
        assert checks.calls == []
        await _polled(writer)
        assert not outcome
        nursery.cancel_scope.cancel()


async def test_an_abort_that_succeeds_after_a_failed_commit_is_redone_without_a_fencing(
    writer: dlq.DlqWriter, checks: Checks, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = _group(writer, monkeypatch, 10, "before")
    async with trio.open_nursery() as nursery:
        await _started(nursery, writer)
        await writer.txn_begin()
        await writer.txn_produce(_failed(5), DLQ_TOPIC)
        FakeProducer.instances[0].commit_error = REQUIRES_ABORT
        with pytest.raises(dlq.DlqTxnAbortable):
            await writer.txn_commit(SENT, object())
        assert FakeProducer.instances[0].calls[-1] == "abort_transaction"
        assert len(FakeProducer.instances) == 1
        assert group.reads == 0
        assert checks.calls == [{(DLQ_TOPIC, 0)}]
        await writer.txn_abort()
        assert FakeProducer.instances[0].calls.count("abort_transaction") == 1
        nursery.cancel_scope.cancel()


async def test_a_stuck_commit_is_settled_from_the_group_offsets(
    writer: dlq.DlqWriter, checks: Checks, monkeypatch: pytest.MonkeyPatch
) -> None:
    _group(writer, monkeypatch, 12, "after")
    gate = threading.Event()
    try:
        async with trio.open_nursery() as nursery:
            outcome = await _started(nursery, writer)
            await writer.txn_begin()
            await writer.txn_produce(_failed(5), DLQ_TOPIC)
            FakeProducer.instances[0].commit_gate = gate
            monkeypatch.setattr(dlq_txn, "TXN_CALL_WATCHDOG_S", 0.3)
            await writer.txn_commit(SENT, object())  # before: DlqFatalError "outcome is unknown"
            assert len(FakeProducer.instances) == 2
            assert writer._producer is FakeProducer.instances[1]
            await _polled(writer)
            assert not outcome
            nursery.cancel_scope.cancel()
    finally:
        gate.set()


async def test_unstable_offsets_are_waited_out(
    writer: dlq.DlqWriter, checks: Checks, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = _group(writer, monkeypatch, 12, "after")
    group.unstable_reads = 3
    async with trio.open_nursery() as nursery:
        await _started(nursery, writer)
        await writer.txn_begin()
        FakeProducer.instances[0].commit_error = INVALID_TXN_STATE
        await writer.txn_commit(SENT, object())
        assert group.reads == 4
        nursery.cancel_scope.cancel()


async def test_offsets_that_stay_unreadable_stop_the_sidecar(
    writer: dlq.DlqWriter, checks: Checks, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = _group(writer, monkeypatch, 12, "after")
    group.unreadable = True
    monkeypatch.setattr(dlq_txn, "OUTCOME_READ_BUDGET_S", 1.0)
    async with trio.open_nursery() as nursery:
        await _started(nursery, writer)
        await writer.txn_begin()
        FakeProducer.instances[0].commit_error = INVALID_TXN_STATE
        with pytest.raises(dlq.DlqFatalError, match="outcome is unknown"):
            await writer.txn_commit(SENT, object())
        assert group.reads >= 2
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("call", ["abort", "commit"])
async def test_a_fence_by_another_producer_stays_fatal(
    writer: dlq.DlqWriter, checks: Checks, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    # Another live sidecar holds the transactional.id: replacing ours would fence it in turn.
    group = _group(writer, monkeypatch, 12, "after")
    async with trio.open_nursery() as nursery:
        await _started(nursery, writer)
        await writer.txn_begin()
        producer = FakeProducer.instances[0]
        with pytest.raises(dlq.DlqFatalError, match="fenced"):
            if call == "abort":
                producer.abort_error = FENCED
                await writer.txn_abort()
            else:
                producer.commit_error = FENCED
                await writer.txn_commit(SENT, object())
        assert len(FakeProducer.instances) == 1
        assert group.reads == 0
        nursery.cancel_scope.cancel()


def test_transaction_committed_compares_offset_and_metadata() -> None:
    def committed(
        offset: int, metadata: str | None
    ) -> dict[tuple[str, int], tuple[int, str | None]]:
        return {(SRC, 0): (offset, metadata)}

    assert dlq.transaction_committed(SENT, committed(12, "after"))
    assert not dlq.transaction_committed(SENT, committed(10, "before"))
    assert not dlq.transaction_committed(SENT, committed(12, "before"))
    assert not dlq.transaction_committed(SENT, committed(-1001, None))
    assert not dlq.transaction_committed(SENT, {})
    assert dlq.transaction_committed([TopicPartition(SRC, 0, 3)], committed(3, None))
    # A partition lost meanwhile may have moved on under its next owner: one match is enough.
    two = [TopicPartition(SRC, 0, 12, metadata="after"), TopicPartition(SRC, 1, 7, metadata="x")]
    moved_on = {(SRC, 0): (12, "after"), (SRC, 1): (30, "next owner")}
    assert dlq.transaction_committed(two, moved_on)
    assert not dlq.transaction_committed(two, {(SRC, 0): (10, "a"), (SRC, 1): (5, "b")})
