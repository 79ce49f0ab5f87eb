"""Flow control: when a partition's fetching pauses and resumes, and when time alone changes it.

A partition pauses when it holds ``max_buffered_records`` records, or ``max_bytes`` (its share of
the byte budget, `sidecar.core.budget`) of them, or has every record lock out, or its commit
metadata nears ``metadata_max_bytes`` (`sidecar.core.ledger.metadata`); it resumes with
hysteresis.  ``add`` takes each record's size and ``buffered_bytes`` is the sum over the records
not done.
"""

from __future__ import annotations

import heapq

from sidecar.core.ledger.metadata import _PAUSE_FILL, _RESUME_FILL, _CommitMetadata


class _FlowControl(_CommitMetadata):
    """Flow control's part of `PartitionLedger` (see the module docstring)."""

    def should_pause(self, max_bytes: int | None = None) -> bool:
        """Stop fetching: too many records held, or ``max_bytes`` or more of them (the partition's
        share of the byte budget), locks exhausted, or metadata near its budget."""
        return (
            len(self._records) >= self.config.max_buffered_records
            or (max_bytes is not None and self._held_bytes >= max_bytes)
            or len(self._live) >= self.config.max_record_locks
            or self._metadata_over(_PAUSE_FILL)
        )

    def may_resume(self, max_bytes: int | None = None) -> bool:
        """Fetch again (hysteresis: half the buffer, half of ``max_bytes``, a free lock, metadata
        under 70%).  Never blocked by one record larger than ``max_bytes``: once it is done the
        partition holds nothing, and an empty partition may always resume."""
        return (
            len(self._records) <= self.config.max_buffered_records // 2
            and (max_bytes is None or self._held_bytes <= max_bytes // 2)
            and len(self._live) < self.config.max_record_locks
            and not self._metadata_over(_RESUME_FILL)
        )

    def update_paused(self, max_bytes: int | None = None) -> bool:
        """Apply the hysteresis and return whether the partition should now be paused."""
        if self._paused:
            self._paused = not self.may_resume(max_bytes)
        else:
            self._paused = self.should_pause(max_bytes)
        return self._paused

    def next_lock_deadline_ms(self) -> int | None:
        """The earliest lock deadline of a live attempt, or None (retry times not included)."""
        if self._live:
            return next(iter(self._live.values())).lock_deadline_ms
        return None

    def next_deadline_ms(self) -> int | None:
        """The earliest time at which something changes by time alone, or None."""
        best: int | None = None
        if self._live:
            best = next(iter(self._live.values())).lock_deadline_ms
        backoff = self._backoff
        while backoff:
            not_before, offset = backoff[0]
            if self._backing_off(offset, not_before) is not None:
                if best is None or not_before < best:
                    best = not_before
                break
            heapq.heappop(backoff)
        return best
