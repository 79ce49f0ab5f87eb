"""Flow control: when a partition's fetching pauses and resumes, and when time alone changes it.

`FlowControl` is a part of `sidecar.core.ledger.partition.PartitionLedger`, built in its
constructor.  A partition pauses when it holds ``max_buffered_records`` records, or ``max_bytes``
(its share of the byte budget, `sidecar.core.budget`) of them, or has every record lock out, or its
commit metadata nears ``metadata_max_bytes`` (`sidecar.core.ledger.metadata`); it resumes with
hysteresis.  ``add`` takes each record's size and ``buffered_bytes`` is the sum over the records
not done.
"""

from __future__ import annotations

from sidecar.core.ledger.attempts import Attempts
from sidecar.core.ledger.holdings import Holdings
from sidecar.core.ledger.metadata import PAUSE_FILL, RESUME_FILL, CommitMetadata
from sidecar.core.ledger.values import LedgerConfig


class FlowControl:
    """Flow control of one partition's ledger (see the module docstring).

    ``version`` (every call's argument) is the ledger's state version, for the metadata's
    measurement (`sidecar.core.ledger.metadata.CommitMetadata.over`).
    """

    def __init__(
        self,
        config: LedgerConfig,
        holdings: Holdings,
        attempts: Attempts,
        metadata: CommitMetadata,
    ) -> None:
        self._max_buffered = config.max_buffered_records
        self._max_locks = config.max_record_locks
        self._holdings = holdings
        self._attempts = attempts
        self._live = attempts.live
        self._metadata = metadata
        self.paused = False

    def should_pause(self, max_bytes: int | None, version: int) -> bool:
        """Stop fetching: too many records held, or ``max_bytes`` or more of them (the partition's
        share of the byte budget), locks exhausted, or metadata near its budget."""
        holdings = self._holdings
        return (
            len(holdings.records) >= self._max_buffered
            or (max_bytes is not None and holdings.held_bytes >= max_bytes)
            or len(self._live) >= self._max_locks
            or self._metadata.over(PAUSE_FILL, version)
        )

    def may_resume(self, max_bytes: int | None, version: int) -> bool:
        """Fetch again (hysteresis: half the buffer, half of ``max_bytes``, a free lock, metadata
        under 70%).  Never blocked by one record larger than ``max_bytes``: once it is done the
        partition holds nothing, and an empty partition may always resume."""
        holdings = self._holdings
        return (
            len(holdings.records) <= self._max_buffered // 2
            and (max_bytes is None or holdings.held_bytes <= max_bytes // 2)
            and len(self._live) < self._max_locks
            and not self._metadata.over(RESUME_FILL, version)
        )

    def update(self, max_bytes: int | None, version: int) -> bool:
        """Apply the hysteresis and return whether the partition should now be paused."""
        if self.paused:
            self.paused = not self.may_resume(max_bytes, version)
        else:
            self.paused = self.should_pause(max_bytes, version)
        return self.paused

    def next_lock_deadline_ms(self) -> int | None:
        """The earliest lock deadline of a live attempt, or None (retry times not included)."""
        return self._attempts.next_deadline_ms()

    def next_deadline_ms(self) -> int | None:
        """The earliest time at which something changes by time alone, or None."""
        best = self._attempts.next_deadline_ms()
        retry = self._holdings.next_backoff_ms()
        if retry is not None and (best is None or retry < best):
            best = retry
        return best
