"""What the consumer engine's parts use of their neighbours: one narrow interface each.

A part is given the interface of what it uses, not the whole neighbour, so its unit test builds it
from fakes (tests/unit/engines): the Kafka source's flow control (`SourcePort`), its offset
commits (`CommitPort`), the DLQ writer's transactions (`TxnPort`), the committer as the scheduler
and the isolation step ask it for a commit (`CommitWanted`) and as the archiver joins its
transactions (`Transactions`), and the archiver as the scheduler starts it (`ArchiveStart`).
Must not import the pipeline, the share engine, or confluent-kafka.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import TYPE_CHECKING, Protocol

from sidecar.core.deadletter import FailedRecord
from sidecar.engines.interfaces import DlqSink, PartitionKey
from sidecar.kafka.dlq.txn import CommitOffset
from sidecar.kafka.source import OffsetToCommit

if TYPE_CHECKING:
    from sidecar.engines.consumer.partitions import PartitionState


class SourcePort(Protocol):
    """The Kafka source's partitions and fetching, as flow control and the isolation step use it."""

    @property
    def assigned(self) -> Set[PartitionKey]: ...
    @property
    def paused(self) -> Set[PartitionKey]: ...
    def pause(self, keys: Sequence[PartitionKey]) -> None: ...
    def resume(self, keys: Sequence[PartitionKey]) -> None: ...

    def mark_busy(self) -> None:
        """Records flow on a path that waits for the poll thread: keep its timeouts short."""


class CommitPort(Protocol):
    """The Kafka source's offset commits (CommitFailed when one fails)."""

    async def commit(self, offsets: Sequence[OffsetToCommit]) -> None: ...
    def group_metadata(self) -> object: ...


class TxnPort(Protocol):
    """The transactional DLQ writer, as the committer drives its transactions."""

    async def txn_begin(self) -> None: ...
    async def txn_produce(self, failed: FailedRecord, dlq_topic: str) -> object: ...
    async def txn_commit(self, commit: Sequence[CommitOffset], group_metadata: object) -> None: ...
    async def txn_abort(self) -> None: ...


class CommitWanted(Protocol):
    """The committer, asked for a commit (a horizon, an isolated record's count or outcome)."""

    def want_commit(self) -> None: ...


class Transactions(Protocol):
    """The committer, as the archiver sends a record into its next DLQ transaction."""

    def transaction(self, state: PartitionState, offset: int) -> DlqSink: ...


class ArchiveStart(Protocol):
    """The archiver, as the scheduler's turn starts the DLQ writes its partitions want."""

    def start(self, states: Sequence[PartitionState]) -> None: ...


__all__ = [
    "ArchiveStart",
    "CommitPort",
    "CommitWanted",
    "SourcePort",
    "Transactions",
    "TxnPort",
]
