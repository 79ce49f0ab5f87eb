"""The share engine's batches in flight (a part of `ShareGroupEngine`): what status reads of them.

Owns `InFlight`: the batches whose answers or DLQ writes are under way (cancelled at a stop), the
records they hold per partition, and how many batches are still delivering their ordinary records
(a suspect waits for none). Plain data, no client calls.

Must not import the ledger, the consumer engine, or confluent-kafka.
"""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.engines.share.batch import Batch
from sidecar.engines.share.ports import PartitionKey


class InFlight:
    """The batches in flight, the records they hold per partition, and those still delivering."""

    def __init__(self) -> None:
        self._batches: set[Batch] = set()
        self._by_partition: dict[PartitionKey, int] = {}
        self._delivering = 0

    @property
    def batches(self) -> int:
        return len(self._batches)

    @property
    def delivering(self) -> int:
        """Batches still delivering their ordinary records (a suspect waits for none)."""
        return self._delivering

    def records(self, key: PartitionKey) -> int:
        """The records of partition `key` held by the batches in flight."""
        return self._by_partition.get(key, 0)

    def hold(self, counts: Mapping[PartitionKey, int]) -> None:
        """A batch's records in flight, counted per partition (`release` them once it is done)."""
        by_partition = self._by_partition
        for key, n in counts.items():
            by_partition[key] = by_partition.get(key, 0) + n

    def release(self, counts: Mapping[PartitionKey, int]) -> None:
        by_partition = self._by_partition
        for key, n in counts.items():
            left = by_partition.get(key, n) - n
            if left > 0:
                by_partition[key] = left
            else:
                by_partition.pop(key, None)

    def add(self, batch: Batch) -> None:
        self._batches.add(batch)

    def discard(self, batch: Batch) -> None:
        self._batches.discard(batch)

    def delivering_started(self) -> None:
        self._delivering += 1

    def delivering_ended(self) -> None:
        self._delivering -= 1

    def abandon(self, *, hard: bool = False) -> None:
        """Stop waiting for answers in every batch (`hard`: stop their DLQ writes too)."""
        for batch in list(self._batches):
            batch.cancel.cancel()
            if hard:
                batch.hard.cancel()


__all__ = ["InFlight"]
