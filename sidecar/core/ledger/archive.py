"""Archiving, the DLQ side: records to write to the DLQ, and what their writes did.

`Archive` is a part of `sidecar.core.ledger.partition.PartitionLedger`, built in its constructor.
A record enters ARCHIVING through ``start`` (the ledger's call: a reject, the delivery limit, or
restored at it); from there ``to_archive`` hands each out once, and the engine answers with
``dlq_written`` (ARCHIVED, done), ``dlq_failed`` (retriable: handed out again) or ``dlq_withheld``
(the DLQ circuit breaker: AVAILABLE for one more delivery).
"""

from __future__ import annotations

from collections import deque

from sidecar.core.ledger.holdings import Holdings
from sidecar.core.ledger.machine import Event, LedgerRecord, enter
from sidecar.core.ledger.values import ArchiveRequest, IllegalTransition, RecordState
from sidecar.core.outcome import ArchiveReason, ErrorInfo

_ARCHIVING = RecordState.ARCHIVING
_DEAD_LETTER = Event.DEAD_LETTER


class Archive:
    """The DLQ side of one partition's ledger (see the module docstring)."""

    def __init__(self, topic: str, partition: int, holdings: Holdings) -> None:
        self._topic = topic
        self._partition = partition
        self._holdings = holdings
        self._queue: deque[int] = deque()  # offsets to hand to the DLQ (stale entries skipped)
        self.n_archiving = 0
        self.archived_total = 0
        self.tiered_total = 0  # written to a retry tier (reason RETRY_TIER), not archived

    def start(self, record: LedgerRecord, reason: ArchiveReason, error: ErrorInfo | None) -> None:
        """The record goes to the DLQ (its suspect mark is the ledger's to clear)."""
        enter(record, _DEAD_LETTER)
        record.reason = reason
        record.error = error
        record.handed_out = False
        self.n_archiving += 1
        self._queue.append(record.offset)

    def to_archive(self) -> list[ArchiveRequest]:
        """Records to write to the DLQ; each is returned once (again after ``dlq_failed``)."""
        out: list[ArchiveRequest] = []
        queue = self._queue
        records = self._holdings.records
        while queue:
            offset = queue.popleft()
            record = records.get(offset)
            if record is None or record.state is not _ARCHIVING or record.handed_out:
                continue
            record.handed_out = True
            assert record.reason is not None
            out.append(
                ArchiveRequest(
                    self._topic,
                    self._partition,
                    offset,
                    record.key,
                    record.item,
                    record.delivery_count,
                    record.reason,
                    record.error,
                    record.tier_delay_ms,
                )
            )
        return out

    def _handed_out(self, offset: int) -> LedgerRecord:
        record = self._holdings.records.get(offset)
        if record is None or record.state is not _ARCHIVING or not record.handed_out:
            raise IllegalTransition(
                f"offset {offset} is not waiting for a DLQ write "
                f"(state {record.state.name if record else 'not held'})"
            )
        return record

    def written(self, offset: int) -> LedgerRecord:
        """The DLQ record of ``offset`` is confirmed: ARCHIVED (the ledger finishes it)."""
        record = self._handed_out(offset)
        enter(record, Event.DLQ_WRITTEN)
        self.n_archiving -= 1
        if record.reason is ArchiveReason.RETRY_TIER:
            self.tiered_total += 1
        else:
            self.archived_total += 1
        return record

    def failed(self, offset: int) -> None:
        """A retriable DLQ write failure: ``to_archive`` hands the record out again."""
        record = self._handed_out(offset)
        record.handed_out = False
        self._queue.append(offset)

    def withheld(self, offset: int) -> LedgerRecord:
        """The DLQ circuit breaker held the write: AVAILABLE again (the ledger queues it)."""
        record = self._handed_out(offset)
        enter(record, Event.DLQ_WITHHELD)
        record.handed_out = False
        record.reason = None
        self.n_archiving -= 1
        return record

    def clear(self) -> None:
        """Revoke: nothing more is handed to the DLQ."""
        self._queue.clear()
