"""A DLQ transaction whose commit's outcome is unknown, and that in fact aborted, must be redone: taken for
committed, its DLQ record is lost (never in the DLQ, its offset committed past).

The sidecar settles such an outcome from the group's committed offsets (`transaction_committed` in
sidecar/kafka/dlq/txn.py): a partition whose committed offset and metadata are exactly what the transaction
sent proves that it committed. That proof holds only while every partition in the transaction carries a
record newly counted done, so its state can never be one the group had already committed. A transaction
that also carried the offsets of partitions outside its batch (fe9b7fc, reverted in 36d98d3: "commits every
partition whose state moved on") breaks it: a partition opened from a committed horizon state (after an
unclean stop, or a partition lost and assigned again, as a broker restart does) has never been committed by
this sidecar, so the transaction carries it, with exactly the state the group already has. Its commit's
outcome unknown, that partition matched, the aborted transaction was taken for committed, and the record
counted done was committed past by the next commit.

Reproduced on purpose here: a first sidecar leaves partition 1 committed in its running (horizon) state and
is killed; the second one opens partition 1 from that state, and its first DLQ transaction (a record of
partition 0) has its EndTxn held by the fault proxy (hold-end-txn), so commit_transaction() keeps timing out
and the writer settles the outcome: a new producer fences the old one, the coordinator aborts the
transaction, and the group's offsets are read.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import trio
from confluent_kafka import KafkaException

from sidecar.http.server import Response
from tests.faults.broker import PrivateBroker
from tests.faults.proxy import HOLD_END_TXN, PASS, FaultProxy
from tests.harness import (
    Delivery,
    RecordingApp,
    restartable_member,
    running_sidecar,
    wait_until,
    wait_until_thread,
)
from tests.kafkatools import Broker, Rec

UNKNOWN = "the DLQ transaction commit's outcome is unknown"
SETTLED = ("the DLQ transaction had committed", "the DLQ transaction had not committed")


def _committed(broker: Broker, group: str, topic: str, partition: int) -> tuple[int, str | None]:
    """The group's committed offset and metadata; (-1, None) while the group coordinator is not
    ready (a fresh private broker answers NOT_COORDINATOR while its offsets partitions load)."""
    try:
        return broker.committed(group, topic, [partition])[partition]
    except KafkaException:
        return (-1, None)


def _reject_poison(d: Delivery) -> Response:
    return Response(400) if (d.value or b"").startswith(b"poison") else Response(200)


async def test_a_dlq_transaction_aborted_after_an_unknown_commit_outcome_is_redone(
    kafka_behind_proxy: tuple[PrivateBroker, FaultProxy], tmp_path: Path
) -> None:
    private, proxy = kafka_behind_proxy
    direct = Broker(private.direct)  # the test's own clients: never proxied
    suffix = f"{time.monotonic_ns():x}"
    topic = await trio.to_thread.run_sync(
        lambda: direct.create_topic(f"redo-{suffix}", partitions=2)
    )
    dlq = await trio.to_thread.run_sync(lambda: direct.create_topic(f"dlq.{topic}", partitions=1))
    group = f"g-redo-{suffix}"
    app = RecordingApp(policy=_reject_poison)
    txn = {
        "errors.deadletterqueue.transactional.enable": True,
        "errors.deadletterqueue.copy.record.enable": True,
    }
    async with running_sidecar(
        Broker(private.external),  # the sidecar's bootstrap: through the proxy
        tmp_path,
        app,
        topic=topic,
        group=group,
        partitions=2,
        path="/",
        extra=txn,
        # Static membership: the second sidecar takes the killed one's partitions at once.
        kafka_extra=restartable_member(suffix),
        start=False,
    ) as rig:
        # 1. Partition 1 done and committed in its running (horizon) state, then an unclean stop.
        await trio.to_thread.run_sync(
            direct.produce,
            topic,
            [Rec(key=f"a{i}".encode(), value=b"ok:a%d" % i, partition=1) for i in range(5)],
        )
        async with rig.sidecar(rig.config("first.yaml")) as first:
            await wait_until_thread(
                lambda: _committed(direct, group, topic, 1)[0] == 5,
                60,
                "partition 1 committed at its end",
            )
            first.proc.send_signal(signal.SIGKILL)
            assert await first.wait_exit(30) == -signal.SIGKILL
        committed_p1 = await trio.to_thread.run_sync(_committed, direct, group, topic, 1)
        assert committed_p1[0] == 5 and committed_p1[1], committed_p1

        # 2. A poison record on partition 0; the second sidecar's first DLQ transaction loses its
        # EndTxn. No periodic commit meanwhile: partition 1 keeps the state it was opened with.
        await trio.to_thread.run_sync(
            direct.produce,
            topic,
            [Rec(key=b"p0", value=b"poison:0", partition=0)]
            + [Rec(key=f"b{i}".encode(), value=b"ok:b%d" % i, partition=0) for i in (1, 2, 3)],
        )
        await trio.to_thread.run_sync(proxy.set_mode, HOLD_END_TXN)
        second_cfg = rig.config("second.yaml", extra={**txn, "commit.interval.ms": 600_000})
        async with rig.sidecar(second_cfg) as second:
            await wait_until(lambda: proxy.end_txn_held > 0, 60, "the transaction's EndTxn held")
            # commit_transaction() times out until the writer's retry budget is spent (~31 s), then
            # the outcome is settled on a new producer (which reaches the coordinator past the proxy).
            await wait_until(
                lambda: any(s in second.log_text() for s in SETTLED),
                150,
                "the commit's outcome settled",
            )
            assert UNKNOWN in second.log_text()
            await trio.to_thread.run_sync(proxy.set_mode, PASS)  # the held EndTxn is dropped
            await second.wait_status(
                lambda st: any(
                    p["partition"] == 0 and p["committable_offset"] == 4 and p["archiving"] == 0
                    for p in st["partitions"]
                ),
                90,
                "partition 0 done",
            )
            assert await second.stop() == 0
            log_text = second.log_text()
    committed = await trio.to_thread.run_sync(lambda: direct.committed(group, topic, [0, 1]))
    assert committed[0][0] == 4 and committed[1][0] == 5, committed
    got = await trio.to_thread.run_sync(direct.read_committed_to_end, dlq)
    assert [r.value for r in got] == [b"poison:0"], (
        f"partition 0 was committed past the poison record, whose DLQ record is {got!r} "
        "(the aborted transaction was taken for committed)"
    )
    # Settled the right way: the transaction had been aborted by the new producer's fencing.
    assert "the DLQ transaction had not committed; it is redone" in log_text
    # The app saw the poison record once: the redo rewrote its DLQ record, it did not redeliver it.
    assert [d.offset for d in app.deliveries if d.value == b"poison:0"] == [0]
