"""An ABORT marker the broker skips (Kafka KAFKA-20734), reproduced on purpose, and repaired.

Kafka 4.x's transaction coordinator takes a partition without a leader for a deleted one and completes
the abort without writing that partition's marker. The aborted DLQ records then stay in an open
transaction, and the producer's next commit to the partition would make them visible: a DLQ record
written twice. Two nodes: node 1 is the controller and the transaction coordinator; node 2 is a broker
that leads the DLQ partition (one replica). Pausing node 2 past its session gets it fenced, which leaves
the partition without a leader while the transaction is aborted. The second test keeps node 2 paused
past the check's budget: the partition is then checked before its next DLQ record.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import trio
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sidecar.kafka import dlq as dlq_module
from sidecar.kafka.dlq import CAUSE_REJECTED, DlqTxnAbortable, DlqWriter, FailedRecord
from sidecar.kafka.dlq import txn as dlq_txn
from tests.faults.broker import PrivateBroker
from tests.harness import transactional_dlq_writer

# Fence a silent broker within seconds instead of the default 9.
FAST_FENCE = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}


@pytest.fixture
def two_nodes() -> Iterator[tuple[PrivateBroker, PrivateBroker]]:
    node1 = PrivateBroker(extra=FAST_FENCE, heap="320m")
    node2 = PrivateBroker(node_id=2, controller=node1, extra=FAST_FENCE, heap="320m")
    try:
        node1.start()
        yield node1, node2
    finally:
        node2.close()
        node1.close()


def _leader_seen_by(bootstrap: str, topic: str) -> int:
    """Partition 0's leader in the metadata of the broker at `bootstrap` itself.

    A new client's first metadata request goes to its bootstrap broker, the only one it knows; that
    broker answers from the metadata cache its transaction coordinator reads partition leaders from.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(topic, timeout=5)
    return int(md.topics[topic].partitions[0].leader)


def _wait(cond, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if cond():
                return
        except Exception:  # the cluster is changing: ask again
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


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
            assert msgs or time.monotonic() < deadline, (
                "no end of partition within 60 s (a hanging transaction holds it?)"
            )
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    assert err.code() == KafkaError._PARTITION_EOF, err
                    return out
                out.append(msg.value())
    finally:
        consumer.close()


def _failed(offset: int) -> FailedRecord:
    return FailedRecord(
        topic="src",
        partition=0,
        offset=offset,
        key=None,
        value=f"v{offset}".encode(),
        headers=(),
        group="g",
        delivery_count=1,
        cause=CAUSE_REJECTED,
    )


async def _dlq_topic_on_node2(
    node2: PrivateBroker, admin: AdminClient, writer: DlqWriter, dlq_topic: str
) -> None:
    """Start node 2 and create `dlq_topic` with its one replica there (the writer already runs, so
    __transaction_state lives on node 1 and the coordinator stays up when node 2 is paused)."""
    await trio.to_thread.run_sync(node2.start)
    await trio.to_thread.run_sync(
        lambda: _wait(lambda: len(admin.list_topics(timeout=5).brokers) == 2, 60, "node 2")
    )
    futures = admin.create_topics(
        [NewTopic(dlq_topic, num_partitions=1, replication_factor=-1, replica_assignment=[[2]])]
    )
    await trio.to_thread.run_sync(lambda: futures[dlq_topic].result(30))
    await trio.to_thread.run_sync(writer.prepare_topics_sync, [dlq_topic])


async def _leaderless(node1: PrivateBroker, dlq_topic: str, fenced_before: int) -> None:
    """Wait, node 2 paused, until it is fenced and node 1 itself sees `dlq_topic` without a leader."""
    # The controller's log, not metadata: a client may ask the paused node and wait.
    await trio.to_thread.run_sync(
        lambda: _wait(
            lambda: node1.log_text().count("handleBrokerFenced") > fenced_before,
            30,
            "node 2 fenced",
        )
    )
    # The controller logs the fencing before node 1's own metadata has it. An abort in between
    # finds node 2 still the leader, queues the marker for it and waits out the request timeout
    # (30 s) before it looks again: longer than the check's budget. So the abort waits until node 1
    # itself sees the partition without a leader.
    await trio.to_thread.run_sync(
        lambda: _wait(
            lambda: _leader_seen_by(node1.direct, dlq_topic) == -1,
            30,
            "node 1 to see the DLQ partition without a leader",
        )
    )


Reads = list[tuple[str, dict[tuple[str, int], int] | None]]


def _recorded_log_ends(writer: DlqWriter, monkeypatch: pytest.MonkeyPatch) -> Reads:
    """What the writer's check read, in order: ("ends", log ends) and ("stable", last stable offsets)."""
    reads: Reads = []
    real = writer._log_ends

    async def log_ends(
        parts: list[tuple[str, int]], *, committed: bool, deadline: float
    ) -> dict[tuple[str, int], int] | None:
        got = await real(parts, committed=committed, deadline=deadline)
        reads.append(("stable" if committed else "ends", got))
        return got

    monkeypatch.setattr(writer, "_log_ends", log_ends)
    return reads


async def _abort_while_leaderless(
    node1: PrivateBroker, node2: PrivateBroker, writer: DlqWriter, dlq_topic: str, offset: int
) -> None:
    """One DLQ record in a transaction, node 2 paused until fenced, the abort, node 2 resumed once the
    coordinator has skipped the marker; returns when `txn_abort` (and its check) is done."""
    await writer.txn_begin()
    await writer.txn_produce(_failed(offset), dlq_topic)  # acknowledged by node 2
    fenced_before = node1.log_text().count("handleBrokerFenced")
    skipped_before = node1.log_text().count("likely deleted")
    node2.pause()
    resumed = False
    try:
        await _leaderless(node1, dlq_topic, fenced_before)
        async with trio.open_nursery() as nursery:

            async def resume_once_the_marker_is_skipped() -> None:
                # Node 2 comes back only after the coordinator skipped its marker (a resume before
                # that, on a slow machine, would let the marker through and leave nothing to repair).
                nonlocal resumed
                await trio.to_thread.run_sync(
                    lambda: _wait(
                        lambda: node1.log_text().count("likely deleted") > skipped_before,
                        60,
                        "the skipped marker",
                    )
                )
                node2.resume()
                resumed = True

            nursery.start_soon(resume_once_the_marker_is_skipped)
            # The abort completes at once: the coordinator skips the leaderless partition's marker.
            # Then the check waits for the partition to have a leader again, finds the aborted
            # record still in an open transaction, and ends it with an abort-only transaction.
            with trio.fail_after(dlq_module.ABORT_CHECK_BUDGET_S + dlq_module.TXN_CALL_TIMEOUT_S):
                await writer.txn_abort()
    finally:
        if not resumed:
            node2.resume()
    assert resumed
    await trio.to_thread.run_sync(
        lambda: _wait(lambda: _leader_seen_by(node1.direct, dlq_topic) == 2, 60, "a leader again")
    )


# Tries at leaving the aborted record in an open transaction. Each one has always done so here; the
# bound is for a run where the broker did end it (the check then finds it settled, and says so).
HANG_TRIES = 3


async def test_an_abort_marker_skipped_for_a_leaderless_partition_is_written_again(
    two_nodes: tuple[PrivateBroker, PrivateBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    node1, node2 = two_nodes
    bootstrap = node1.direct
    writer = transactional_dlq_writer(bootstrap, "g", "txn-markers")
    dlq_topic = "dlq.markers"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    reads = _recorded_log_ends(writer, monkeypatch)
    tries: list[str] = []
    async with trio.open_nursery() as nursery:
        # The writer's init_transactions() creates __transaction_state while node 1 is the only broker,
        # so the coordinator stays up when node 2 is paused.
        await nursery.start(writer.run)
        await _dlq_topic_on_node2(node2, admin, writer, dlq_topic)

        for attempt in range(HANG_TRIES):
            reads.clear()
            await _abort_while_leaderless(node1, node2, writer, dlq_topic, 100 + attempt)
            tries.append(f"try {attempt + 1}: {reads}")
            if writer.abort_markers_repaired:
                break
            # Not repaired: then the check must have seen the transaction ended, the last stable
            # offset at or past the log's end read after the abort (the broker ended it after all).
            (what, ends), (last, stable) = reads[0], reads[-1]
            assert what == "ends" and last == "stable" and ends and stable, tries
            assert all(stable[tp] >= end for tp, end in ends.items()), (
                f"no repair, and the check did not find the partition settled: {tries}"
            )
        assert "likely deleted" in node1.log_text()
        assert writer.abort_markers_repaired == 1, (
            f"the aborted record was never left in an open transaction in {HANG_TRIES} tries: "
            f"{tries}"
        )

        # The next transaction commits only its own record; without the repair its COMMIT marker
        # would have committed the aborted ones too.
        await writer.txn_begin()
        await writer.txn_produce(_failed(2), dlq_topic)
        await writer.txn_commit([], None)
        nursery.cancel_scope.cancel()
    got = await trio.to_thread.run_sync(_read_committed, bootstrap, dlq_topic)
    assert got == [b"v2"], tries


async def test_a_partition_leaderless_past_the_check_is_checked_before_its_next_record(
    two_nodes: tuple[PrivateBroker, PrivateBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check after the abort gives up while node 2 is still paused (its budget shortened): the
    # skipped marker is repaired before the next DLQ record goes to that partition, not never.
    monkeypatch.setattr(dlq_txn, "ABORT_CHECK_BUDGET_S", 4.0)
    node1, node2 = two_nodes
    bootstrap = node1.direct
    writer = transactional_dlq_writer(bootstrap, "g", "txn-markers-late")
    dlq_topic = "dlq.markers.late"
    part = (dlq_topic, 0)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await _dlq_topic_on_node2(node2, admin, writer, dlq_topic)

        await writer.txn_begin()
        await writer.txn_produce(_failed(1), dlq_topic)
        fenced_before = node1.log_text().count("handleBrokerFenced")
        skipped_before = node1.log_text().count("likely deleted")
        node2.pause()
        try:
            await _leaderless(node1, dlq_topic, fenced_before)
            with trio.fail_after(dlq_txn.ABORT_CHECK_BUDGET_S + dlq_module.TXN_CALL_TIMEOUT_S):
                await writer.txn_abort()  # the marker is skipped; the partition cannot be read
            assert writer._unchecked == {part}
            assert writer.abort_markers_repaired == 0
            await trio.to_thread.run_sync(
                lambda: _wait(
                    lambda: node1.log_text().count("likely deleted") > skipped_before,
                    60,
                    "the skipped marker",
                )
            )
        finally:
            node2.resume()
        await trio.to_thread.run_sync(
            lambda: _wait(lambda: _leader_seen_by(bootstrap, dlq_topic) == 2, 60, "a leader again")
        )

        # The next DLQ record for the partition is refused inside its transaction; the abort that
        # follows (as the engine's redo does) checks the partition and repairs the marker.
        await writer.txn_begin()
        with pytest.raises(DlqTxnAbortable, match="checked for an earlier abort"):
            await writer.txn_produce(_failed(2), dlq_topic)
        with trio.fail_after(dlq_txn.ABORT_CHECK_BUDGET_S + dlq_module.TXN_CALL_TIMEOUT_S):
            await writer.txn_abort()
        assert writer.abort_markers_repaired == 1
        assert writer._unchecked == set()
        await writer.txn_begin()
        await writer.txn_produce(_failed(2), dlq_topic)
        await writer.txn_commit([], None)
        nursery.cancel_scope.cancel()
    got = await trio.to_thread.run_sync(_read_committed, bootstrap, dlq_topic)
    assert got == [b"v2"]
