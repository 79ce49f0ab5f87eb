"""Archiving, the DLQ side: records to write to the DLQ, and what their writes did.

A record enters ARCHIVING in `sidecar.core.ledger.base` (``_start_archiving``: a reject, the
delivery limit, or restored at it); from there ``to_archive`` hands each out once, and the engine
answers with ``dlq_written`` (ARCHIVED, done), ``dlq_failed`` (retriable: handed out again) or
``dlq_withheld`` (the DLQ circuit breaker: AVAILABLE for one more delivery).
"""

from __future__ import annotations

import heapq

from sidecar.core.ledger.flow import _FlowControl
from sidecar.core.ledger.machine import Event, _Record, enter
from sidecar.core.ledger.values import ArchiveRequest, IllegalTransition, LedgerClosed, RecordState

_ARCHIVING = RecordState.ARCHIVING


class _Archive(_FlowControl):
    """Archiving's part of `PartitionLedger` (see the module docstring)."""

    def to_archive(self) -> list[ArchiveRequest]:
        """Records to write to the DLQ; each is returned once (again after ``dlq_failed``)."""
        out: list[ArchiveRequest] = []
        while self._archive:
            offset = self._archive.popleft()
            record = self._records.get(offset)
            if record is None or record.state is not _ARCHIVING or record.handed_out:
                continue
            record.handed_out = True
            assert record.reason is not None
            out.append(
                ArchiveRequest(
                    self.topic,
                    self.partition,
                    offset,
                    record.key,
                    record.item,
                    record.delivery_count,
                    record.reason,
                    record.error,
                )
            )
        return out

    def _handed_out(self, offset: int) -> _Record:
        if self._revoked:
            raise LedgerClosed(f"{self._id_prefix} was revoked")
        record = self._records.get(offset)
        if record is None or record.state is not _ARCHIVING or not record.handed_out:
            raise IllegalTransition(
                f"offset {offset} is not waiting for a DLQ write "
                f"(state {record.state.name if record else 'not held'})"
            )
        return record

    def dlq_written(self, offset: int) -> None:
        """The DLQ record of ``offset`` is confirmed (or no DLQ is configured): ARCHIVED, done."""
        record = self._handed_out(offset)
        enter(record, Event.DLQ_WRITTEN)
        self._version += 1
        self._changes += 1
        self._n_archiving -= 1
        self._archived_total += 1
        self._finish(record)

    def dlq_failed(self, offset: int) -> None:
        """A retriable DLQ write failure: ``to_archive`` hands the record out again."""
        record = self._handed_out(offset)
        self._changes += 1
        record.handed_out = False
        self._archive.append(offset)

    def dlq_withheld(self, offset: int, now_ms: int) -> None:
        """The DLQ circuit breaker held the write of ``offset``: AVAILABLE again, for one more
        delivery (not done, so nothing is committed past it meanwhile).

        Its count continues, and it goes out even at the limit (``_make_ready``'s check is not
        applied): the breaker judged the answers that sent it to the DLQ untrustworthy. An answer
        to that delivery other than an accept archives it as usual (the limit is reached).
        """
        record = self._handed_out(offset)
        enter(record, Event.DLQ_WITHHELD)
        self._tick(now_ms)
        self._version += 1
        self._changes += 1
        record.handed_out = False
        record.reason = None
        self._n_archiving -= 1
        record.not_before_ms = self._now
        record.queued = True
        heapq.heappush(self._ready, offset)  # archiving cleared it as a suspect
