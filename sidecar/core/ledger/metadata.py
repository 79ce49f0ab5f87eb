"""Commit metadata: the state a partition's ledger commits, its size, and its commit points.

``commit_state`` derives, from the records held, what to persist beyond the committed offset (the
codec is `sidecar.core.commitstate`); it walks the records held, bounded by
``max_buffered_records``.  Everything else here is O(1): the size checks bound the encoded
metadata from counters kept exact on every change (``_n_ranges``, ``_n_count_runs``, in
`sidecar.core.ledger.base`) and measure it exactly only when the bound is not conclusive, so a
partition pauses (`sidecar.core.ledger.flow`) before its metadata outgrows ``metadata_max_bytes``.
``commit_point`` is what the engine commits; in horizon mode it carries the horizon and the
isolated record's charge (`sidecar.core.ledger.horizon`), and revoke's final state is made here.
"""

from __future__ import annotations

from sidecar.core.commitstate import (
    CommitState,
    chars_for_payload,
    encode,
    encoded_length,
    payload_bound,
)
from sidecar.core.ledger.horizon import _Horizon
from sidecar.core.ledger.values import CommitPoint, RecordState

_AVAILABLE = RecordState.AVAILABLE
# Metadata fill (fraction of metadata_max_bytes) at which a partition pauses / may resume.
_PAUSE_FILL = 0.9
_RESUME_FILL = 0.7
# An acquisition changes one count: at most two more count runs of 9 + 9 + 3 raw bytes each (gap,
# length, count < 2**21), 63 characters with the estimate's 1.5 factor (base64 is 4/3).
_MAX_ENTRY_CHARS = 64


def _vlen(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


class _CommitMetadata(_Horizon):
    """The commit metadata's part of `PartitionLedger` (see the module docstring)."""

    def commit_state(self) -> CommitState:
        """The state to persist with ``committable_offset()``.

        Write-ahead mode: the counts of attempts in flight included.  Horizon mode: not included
        (only the isolated one's), and the horizon is the one the next commit point carries.
        """
        if self._final is not None:
            return self._final
        base = self.committable_offset()
        upper = self._max_done
        done: list[tuple[int, int]] = []
        counts: dict[int, int] = {}
        previous = base
        previous_seq = -1  # the first held record is the base itself
        last = upper if upper > self._max_counted else self._max_counted
        for offset, record in self._records.items():
            if offset > last:
                break  # nothing further is done or counted: see _max_counted
            if record.delivery_count:
                counts[offset] = record.delivery_count
            if offset <= upper:
                # Only where records were fetched between two held ones: a range of compaction
                # gaps alone would cost bytes and say nothing.
                if previous_seq >= 0 and record.seq - previous_seq > 1:
                    done.append((previous + 1, offset))
                previous = offset
                previous_seq = record.seq
        if upper > previous:
            done.append((previous + 1, upper + 1))
        # What the restored state said about offsets not fetched again yet.
        following = self._last_added + 1
        for range_start, end in self._restored_done[self._restored_index :]:
            start = max(range_start, following, base + 1)
            if start >= end:
                continue
            if done and done[-1][1] >= start:
                done[-1] = (done[-1][0], max(end, done[-1][1]))
            else:
                done.append((start, end))
        if self._restored_counts:
            self._restored_counts = {
                o: c for o, c in self._restored_counts.items() if o >= following
            }
            counts.update(self._restored_counts)
        if not self._horizon:
            return CommitState(base, tuple(done), counts)
        isolating = self._isolating
        return CommitState(
            base,
            tuple(done),
            counts,
            self._horizon_target(),
            isolating.offset if isolating is not None else None,
        )

    def encode_metadata(self) -> str:
        """The commit metadata string (may be a safe prefix encoding: see ``commitstate.encode``)."""
        encoded = encode(self.commit_state(), self.config.metadata_max_bytes)
        return encoded if encoded is not None else ""

    def commit_point(self) -> CommitPoint:
        """What to commit now: offset, metadata (version 2 in horizon mode) and its horizon."""
        state = self.commit_state()
        metadata = encode(state, self.config.metadata_max_bytes)
        if not self._revoked:
            self._points += 1
            self._changes += 1
        if state.horizon is not None:
            # The header always fits the smallest budget (64): a point never loses its horizon.
            assert metadata is not None
            if not self._revoked and state.horizon > self._issued:
                self._issued = state.horizon
        charged = state.charged
        return CommitPoint(
            self.topic,
            self.partition,
            state.base_offset,
            metadata or "",
            state.horizon,
            charged,
            None if charged is None else state.counts[charged],
            self._points,
        )

    def _final_state(self) -> CommitState:
        """Horizon mode, at revoke: the state with the lowest horizon that is still exact."""
        isolating = self._isolating
        if isolating is not None and isolating.state is _AVAILABLE:
            # Charged, never handed out: the charge goes back; it stays a suspect.
            count = isolating.delivery_count
            isolating.delivery_count = count - 1
            self._recount(isolating.offset, count, count - 1)
            self._isolating = isolating = None
        state = self.commit_state()
        top = state.base_offset - 1
        for record in self._live.values():  # answers lost: the next owner isolates up to them
            if record.offset > top:  # noqa: PLR1730
                top = record.offset
        if self._n_suspects or self._last_added < self._suspect_top:
            top = max(top, self._suspect_top)  # suspects not settled (or not fetched) stay so
        return CommitState(
            state.base_offset,
            state.done,
            state.counts,
            top,
            isolating.offset if isolating is not None else None,
        )

    def _structural_raw(self) -> int:
        """An upper bound of the run-length payload from O(1) counters.

        The done ranges and count runs kept in memory are counted exactly (``_n_ranges``,
        ``_n_count_runs``), the restored ones not yet reached are bounded by their number; a range
        is two varints, a count run three; every varint of an offset is at most the span from the
        base to the highest offset known.
        """
        records = self._records
        base = next(iter(records)) if records else self._last_added + 1
        v = _vlen(max(self._last_added, self._restored_top) - base + 2)
        ranges = self._n_ranges + len(self._restored_done) - self._restored_index
        runs = self._n_count_runs + len(self._restored_counts)
        # base (<= 9 bytes), done kind (1), two list lengths (<= 3 each); counts < 2**21; version
        # 2's header: horizon (<= 10), charged kind (1), its offset and count (<= 13).
        header = 40 if self._horizon else 16
        return header + ranges * 2 * v + runs * (2 * v + 3)

    def _metadata_estimate(self) -> int:
        """Encoded size estimate in characters, O(1).

        The structural bound is a true upper bound, but a poor one for compressible states; past
        it, the estimate is the last exact measurement plus the structural growth since.  That
        assumes the chosen (perhaps zlib) form grows no faster than the structure: zlib gives no
        such guarantee, but an underestimate only ever leads to a prefix encoding, which is safe
        (see ``commitstate.encode``), and it keeps exact measurements (O(records held)) rare.
        """
        raw = self._structural_raw()
        bound = chars_for_payload(raw)
        growth = max(0, raw - self._measured_raw)
        return min(bound, self._measured_chars + (growth * 3 + 1) // 2 + 8)

    def _metadata_over(self, fraction: float) -> bool:
        """Would the metadata exceed ``fraction`` of the budget?  Exact when it matters."""
        limit = self.config.metadata_max_bytes * fraction
        if self._metadata_estimate() <= limit:
            return False
        if self._measured_version != self._version:
            self._measure()
        return self._measured_chars > limit

    def _measure(self) -> None:
        state = self.commit_state()
        self._measured_raw = self._structural_raw()
        self._measured_version = self._version
        bound = chars_for_payload(payload_bound(state))
        # Encoding (zlib included) is the expensive part: only when the bound is not conclusive.
        self._measured_chars = (
            encoded_length(state)
            if bound > self.config.metadata_max_bytes * _RESUME_FILL
            else bound
        )
