"""The pure parts behind the dashboard's and alerts' metrics: the DLQ record labels (bounded) and the
share engine's lag estimate (sidecar/kafka/share/lag.py)."""

from __future__ import annotations

from sidecar.core.deadletter import DeadLetterPlan, FailedRecord
from sidecar.core.outcome import ArchiveReason
from sidecar.engines.dlq_step import DEAD_LETTERED_CLASSES_MAX, dead_lettered_key
from sidecar.engines.interfaces import Counters
from sidecar.kafka.share.lag import ShareLagEstimate


def plan(exception_class: str | None, topic: str = "orders") -> DeadLetterPlan:
    failed = FailedRecord(
        topic=topic,
        partition=0,
        offset=1,
        key=None,
        value=None,
        headers=(),
        group="g",
        delivery_count=1,
        cause="rejected",
        exception_class=exception_class,
    )
    return DeadLetterPlan(ArchiveReason.REJECTED, None, None, f"dlq.{topic}", failed)


def test_dead_lettered_labels_name_topic_reason_and_class() -> None:
    c = Counters()
    assert dead_lettered_key(c, plan("com.example.Invalid$Order")) == (
        "orders",
        "rejected",
        "com.example.Invalid$Order",
        "dlq.orders",
    )
    assert dead_lettered_key(c, plan(None, "pay")) == ("pay", "rejected", "none", "dlq.pay")
    # Not a class name (spaces, quotes, a whole message): one label for all of them.
    assert dead_lettered_key(c, plan('bad "class" name'))[2] == "other"
    assert dead_lettered_key(c, plan("x" * 200))[2] == "other"


def test_dead_lettered_classes_are_bounded() -> None:
    c = Counters()
    for n in range(DEAD_LETTERED_CLASSES_MAX):
        c.bump(c.dead_lettered, dead_lettered_key(c, plan(f"app.E{n}")))
    assert dead_lettered_key(c, plan("app.E0"))[2] == "app.E0"  # already counted: kept
    assert dead_lettered_key(c, plan("app.New"))[2] == "other"
    assert len({k[2] for k in c.dead_lettered}) == DEAD_LETTERED_CLASSES_MAX


def test_share_lag_estimate() -> None:
    est = ShareLagEstimate(["orders"])
    est.handed_all([("orders", 0, 89)])
    assert est.lag() == {}  # no high watermark read yet: no series
    est.update_ends({("orders", 0): 100, ("orders", 1): 50})
    # Partition 1 was never handed here (the group reads it elsewhere): no series for it.
    assert est.lag() == {("orders", 0): 10}
    est.update_ends({("orders", 0): 130, ("orders", 1): 60})
    assert est.lag() == {("orders", 0): 40}
    est.handed_all([("orders", 0, 119)])  # acquired up to offset 119
    est.handed_all([("orders", 0, 105)])  # an older one (a redelivery) moves nothing back
    assert est.lag() == {("orders", 0): 10}
    est.handed_all([("orders", 0, 129), ("orders", 1, 20), ("orders", 1, 7)])  # a poll's records
    assert est.lag() == {("orders", 0): 0, ("orders", 1): 39}
