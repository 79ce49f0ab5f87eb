"""Cooperative revokes that come on trio's thread, held open until the answers in flight are in.

Owns `HeldRevokes`: with the queue signal, a rebalance callback runs inside `consume()` on trio's
thread, where no task can run until it returns. An incremental revoke is therefore held: its
partitions are paused, confluent-kafka is kept from unassigning them when the callback returns, and
a task finishes the revoke (the listener's wait, the final commit) and then unassigns them.
Must not import the ledger, the engines or the HTTP modules.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import trio
from confluent_kafka import Consumer, KafkaException, TopicPartition

log = logging.getLogger("sidecar.source")

PartitionKey = tuple[str, int]


class HeldRevokes:
    """Revokes held open on trio's thread; `keys` are their partitions until each is unassigned.

    librdkafka lets a revoke finish whenever the application calls `incremental_unassign` (its
    group waits in the join state WAIT_UNASSIGN_CALL until then: `rd_kafka_cgrp_incremental_unassign`
    in src/rdkafka_cgrp.c). confluent-kafka calls it itself when the callback returns, unless the
    callback made an assignment call of its own (`Consumer_rebalance_cb` in
    src/confluent_kafka/src/Consumer.c); an `incremental_assign` of no partitions is such a call and
    changes nothing else (`rd_kafka_cgrp_incremental_assign` moves the join state only from
    WAIT_ASSIGN_CALL). Only for the incremental protocols (cooperative-sticky, `group.protocol:
    consumer`); an eager revoke is not held.
    """

    def __init__(self) -> None:
        self.keys: set[PartitionKey] = set()
        self._nursery: trio.Nursery | None = None

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[None]:
        """Around the loop that calls `consume()`: revokes may be held inside; on leaving, the
        held ones are finished first."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                yield
            finally:
                self._nursery = None

    def hold(
        self,
        consumer: Consumer,
        partitions: list[TopicPartition],
        finish: Callable[[list[TopicPartition]], Awaitable[None]],
    ) -> bool:
        """In the revoke callback: pause `partitions`, keep them assigned, and run `finish(partitions)`
        (the listener's wait and the final commit) in a task, then unassign them. False when no
        loop is open to run that task: the caller revokes at once."""
        nursery = self._nursery
        if nursery is None:
            return False
        keys = [(tp.topic, tp.partition) for tp in partitions]
        consumer.pause(partitions)
        consumer.incremental_assign([])
        self.keys.update(keys)
        nursery.start_soon(self._finish, consumer, partitions, finish)
        return True

    async def _finish(
        self,
        consumer: Consumer,
        partitions: list[TopicPartition],
        finish: Callable[[list[TopicPartition]], Awaitable[None]],
    ) -> None:
        try:
            await finish(partitions)
        finally:
            # Also when cancelled: the group waits for this call, and nothing else makes it.
            try:
                consumer.incremental_unassign(partitions)
                # librdkafka keeps the application's pause on a partition object across an
                # unassign: assigned here again later, it would never fetch.
                consumer.resume(partitions)
            except (KafkaException, RuntimeError) as exc:
                log.warning("unassigning the revoked partitions: %s", exc)
            self.keys.difference_update((tp.topic, tp.partition) for tp in partitions)


__all__ = ["HeldRevokes"]
