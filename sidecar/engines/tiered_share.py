"""Retry tiers with `engine: share`: long releases go to a tier, and a consumer-group reader brings them back.

Owns `ShareAndTiers`, the one adapter the pipeline sees then (the share engine and a consumer engine
reading only the tier topics, in the group ``<group.id>.tiers``: told in its docstring), and
`share_adapter`, which builds it or the share engine alone. The one module that joins both engines.

Must not import the pipeline or confluent-kafka.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import trio

from sidecar.core.outcome import Ack
from sidecar.core.wire import AckItem, Answer
from sidecar.engines.consumer.group import ConsumerGroupEngine
from sidecar.engines.interfaces import (
    Answered,
    Delivery,
    EngineParts,
    PartitionKey,
    StateAdapter,
    StateView,
)
from sidecar.engines.share.batch import Acquired
from sidecar.engines.share.group import ShareGroupEngine

#: The consumer group that reads a share group's retry tiers: ``<group.id>`` + this.
TIER_GROUP_SUFFIX = ".tiers"


def share_adapter(parts: EngineParts[Any]) -> StateAdapter:
    """The share engine's adapter: with retry tiers, the share engine and its tier reader."""
    config = parts.config
    share = ShareGroupEngine(parts)
    if not config.errors.tiers.enabled:
        return share
    kafka = dict(config.kafka)
    kafka["group.id"] = f"{config.group_id}{TIER_GROUP_SUFFIX}"
    reader_config = dataclasses.replace(config, kafka=MappingProxyType(kafka))
    reader = ConsumerGroupEngine(
        dataclasses.replace(parts, config=reader_config), tiers_of=config.group_id
    )
    return ShareAndTiers(share, reader)


class ShareAndTiers:
    """The share engine and its retry tier reader as one adapter.

    A share group cannot hold a record past its lock, so a long release cannot wait there: the share
    engine writes it to its retry tier (the tier step, `TierWriter`) and then ACCEPTs it on the share
    group (`sidecar.engines.share.tier_write`; a write that fails for good stops the sidecar and the
    record is RELEASEd, never dropped). The tier topics are read back the consumer engine's way: a
    :class:`~sidecar.engines.consumer.group.ConsumerGroupEngine` reading only the tier topics, in the
    consumer group ``<group.id>.tiers`` (a consumer group and a share group cannot share a name),
    pausing a tier partition until its head is due and delivering each record as the original.
    """

    def __init__(self, share: ShareGroupEngine, tiers: ConsumerGroupEngine) -> None:
        self._share = share
        self._tiers = tiers

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self._tiers.run)
            await nursery.start(self._share.run)
            task_status.started()

    def answered(self, delivery: Delivery[Any], ack: Ack, answer: Answer | AckItem) -> Answered:
        if isinstance(delivery.ref, Acquired):
            return self._share.answered(delivery, ack, answer)
        return self._tiers.answered(delivery, ack, answer)

    async def not_reached(self, deliveries: Sequence[Delivery[Any]]) -> bool:
        mine = [d for d in deliveries if not isinstance(d.ref, Acquired)]
        if mine:
            # The tier records go back to their ledger; a share record of the same request waits
            # for its lock to end (released then), rather than being sent again without them.
            await self._tiers.not_reached(mine)
            return False
        return await self._share.not_reached(deliveries)

    def wake(self, *, now: bool = False) -> None:
        self._share.wake(now=now)
        self._tiers.wake(now=now)

    def intake_changed(self, *, held_may_go: bool = False) -> None:
        self._share.intake_changed(held_may_go=held_may_go)
        self._tiers.intake_changed(held_may_go=held_may_go)

    async def wait_drained(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._share.wait_drained)
            nursery.start_soon(self._tiers.wait_drained)

    async def finish(self) -> None:
        await self._tiers.finish()
        await self._share.finish()

    @property
    def view(self) -> StateView:
        return self

    # ------------------------------------------------------------------------- StateView

    def readiness(self) -> dict[str, bool]:
        share, tiers = self._share.readiness(), self._tiers.view.readiness()
        return {k: share.get(k, True) and tiers.get(k, True) for k in share.keys() | tiers.keys()}

    def broker_error(self) -> str | None:
        return self._share.broker_error() or self._tiers.view.broker_error()

    def stalled(self) -> str | None:
        return self._share.stalled() or self._tiers.view.stalled()

    def status_fields(self) -> dict[str, Any]:
        fields = self._share.status_fields()
        tiers = self._tiers.view.tier_summary()
        if tiers:
            fields["retry_tiers"] = tiers
        return fields

    def partitions(self) -> list[dict[str, Any]]:
        return self._share.partitions() + self._tiers.view.partitions()

    def paused(self) -> set[PartitionKey]:
        return self._share.paused() | self._tiers.view.paused()

    def lag(self) -> dict[PartitionKey, int]:
        return self._share.lag() | self._tiers.view.lag()

    def commit_metadata_bytes(self) -> dict[PartitionKey, int]:
        return self._tiers.view.commit_metadata_bytes()


__all__ = ["TIER_GROUP_SUFFIX", "ShareAndTiers", "share_adapter"]
