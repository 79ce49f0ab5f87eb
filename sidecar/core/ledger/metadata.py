"""Commit metadata: the state a partition's ledger commits, its size, and its commit points.

Owns `CommitMetadata`, a part of `sidecar.core.ledger.partition.PartitionLedger` (the codec is
`sidecar.core.commitstate`).  Sans-IO: imports the standard library and `sidecar.core` only.
"""

from __future__ import annotations

from collections import OrderedDict

from sidecar.core.commitstate import (
    CommitState,
    chars_for_payload,
    encode,
    encoded_length,
    payload_bound,
)
from sidecar.core.ledger.holdings import Holdings
from sidecar.core.ledger.horizon import Horizon
from sidecar.core.ledger.machine import LedgerRecord
from sidecar.core.ledger.values import CommitPoint, LedgerConfig, RecordState

_AVAILABLE = RecordState.AVAILABLE
# Metadata fill (fraction of metadata_max_bytes) at which a partition pauses / may resume.
PAUSE_FILL = 0.9
RESUME_FILL = 0.7
# An acquisition changes one count: at most two more count runs of 9 + 9 + 3 raw bytes each (gap,
# length, count < 2**21), 63 characters with the estimate's 1.5 factor (base64 is 4/3).
MAX_ENTRY_CHARS = 64


def _vlen(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


class CommitMetadata:
    """The commit metadata of one partition's ledger.

    A part of `sidecar.core.ledger.partition.PartitionLedger`, built in its
    constructor.  ``commit_state`` derives, from the records held, what to persist beyond the committed
    offset (the codec is `sidecar.core.commitstate`); it walks the records held, bounded by
    ``max_buffered_records``.  Everything else here is O(1): the size checks bound the encoded metadata
    from counters this part keeps exact on every change (the done ranges and the count runs) and
    measure it exactly only when the bound is not conclusive, so a partition pauses
    (`sidecar.core.ledger.flow`) before its metadata outgrows ``metadata_max_bytes``.
    ``commit_point`` is what the engine commits; in horizon mode it carries the horizon and the
    isolated record's charge (`sidecar.core.ledger.horizon`), and revoke's final state is made here.
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        config: LedgerConfig,
        holdings: Holdings,
        horizon: Horizon,
        live: OrderedDict[str, LedgerRecord],
        start_offset: int,
    ) -> None:
        self._topic = topic
        self._partition = partition
        self._budget = config.metadata_max_bytes
        self._holdings = holdings
        self._horizon = horizon
        self._live = live
        self._max_done = start_offset - 1
        # Highest offset that ever had a delivery count: commit_state() stops scanning past it
        # (and past _max_done), so a deep buffer of untouched records costs nothing per commit.
        self._max_counted = start_offset - 1
        self._final: CommitState | None = None  # horizon mode: the state revoke() returned
        # Size tracking: O(1) counters give a structural bound of the payload; an exact
        # measurement is cached per version of the ledger's state.
        self._n_count_runs = 0  # runs of held records with equal counts (exact, see recount)
        self._held_seqs: set[int] = set()
        self._n_ranges = 0  # done ranges above the base (exact, see _count_done_run)
        self._max_done_seq = -1
        self._measured_version = -1
        self._measured_chars = 0
        self._measured_raw = 0
        self.measure(0)  # a restored state may start near the budget

    # -- the counters, kept exact on every change --------------------------------------------

    def held(self, seq: int) -> None:
        """The record fetched ``seq``-th is held."""
        self._held_seqs.add(seq)

    def counted(self, offset: int, before: int, after: int) -> None:
        """The delivery count of the record at ``offset`` went from ``before`` to ``after``."""
        if offset > self._max_counted:  # noqa: PLR1730 (max() is a call: slower on the hot path)
            self._max_counted = offset
        self.recount(offset, before, after)

    def counted_runs(self, runs: int, top: int) -> None:
        """Acquisitions changed the count runs by ``runs`` and counted offsets up to ``top``
        (the ledger's hand-out loop adds them up: see ``recount``)."""
        self._n_count_runs += runs
        if top > self._max_counted:  # noqa: PLR1730
            self._max_counted = top

    def recount(self, offset: int, before: int, after: int) -> None:
        """Keep ``_n_count_runs`` exact when the delivery count at ``offset`` changes.

        Count runs are maximal runs of consecutive offsets with the same count (the codec's
        counts section), so only the neighbours ``offset - 1`` and ``offset + 1`` matter.
        """
        if before == after:
            return
        records = self._holdings.records
        neighbour = records.get(offset - 1)
        left = neighbour.delivery_count if neighbour is not None else 0
        neighbour = records.get(offset + 1)
        right = neighbour.delivery_count if neighbour is not None else 0
        delta = 0
        if before:
            delta -= 1 - (left == before) - (right == before)
        if after:
            delta += 1 - (left == after) - (right == after)
        self._n_count_runs += delta

    def done(self, record: LedgerRecord) -> None:
        """The record is done, about to leave the holdings (it is still held)."""
        offset = record.offset
        seq = record.seq
        records = self._holdings.records
        front_seq = next(iter(records.values())).seq
        self._held_seqs.discard(seq)
        count = record.delivery_count
        if count:
            # recount(offset, count, 0), inlined: this is the hot path.
            neighbour = records.get(offset - 1)
            left = neighbour.delivery_count if neighbour is not None else 0
            neighbour = records.get(offset + 1)
            right = neighbour.delivery_count if neighbour is not None else 0
            self._n_count_runs -= 1 - (left == count) - (right == count)
        if offset > self._max_done:  # noqa: PLR1730 (hot path)
            self._max_done = offset
        self._count_done_run(seq, front_seq, seq > self._max_done_seq)

    def done_restored(self, offset: int, seq: int) -> None:
        """A fetched offset the restored state says is done (never held)."""
        self._max_done = offset
        records = self._holdings.records
        front_seq = next(iter(records.values())).seq if records else seq
        self._count_done_run(seq, front_seq, extends=True)

    def _count_done_run(self, seq: int, front_seq: int, extends: bool) -> None:
        """Keep ``_n_ranges`` (the done ranges commit_state emits) exact as ``seq`` becomes done.

        Ranges are maximal runs, in fetch order, of done records between the lowest held record
        (``front_seq``, before ``seq`` left) and the highest done one; every record fetched above
        the front is either held or done, so the neighbours ``seq - 1`` and ``seq + 1`` decide.
        """
        held = self._held_seqs
        top = self._max_done_seq
        if not held:
            self._n_ranges = 0  # everything fetched is done: the base moved past it all
        elif seq == front_seq:
            # The base moves up past the run that followed it, if there was one.
            if seq + 1 <= top and seq + 1 not in held:
                self._n_ranges -= 1
        else:
            left = seq - 1 > front_seq and seq - 1 <= top and seq - 1 not in held
            right = not extends and seq + 1 <= top and seq + 1 not in held
            self._n_ranges += 1 - left - right
        if extends:
            self._max_done_seq = seq

    # -- the state to commit -----------------------------------------------------------------

    def commit_state(self) -> CommitState:
        """See `sidecar.core.ledger.partition.PartitionLedger.commit_state`."""
        if self._final is not None:
            return self._final
        holdings = self._holdings
        base = holdings.committable_offset()
        upper = self._max_done
        done: list[tuple[int, int]] = []
        counts: dict[int, int] = {}
        previous = base
        previous_seq = -1  # the first held record is the base itself
        last = upper if upper > self._max_counted else self._max_counted
        for offset, record in holdings.records.items():
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
        following = holdings.last_added + 1
        for range_start, end in holdings.restored_done[holdings.restored_index :]:
            start = max(range_start, following, base + 1)
            if start >= end:
                continue
            if done and done[-1][1] >= start:
                done[-1] = (done[-1][0], max(end, done[-1][1]))
            else:
                done.append((start, end))
        restored_counts = holdings.restored_counts_from(following)
        if restored_counts:
            counts.update(restored_counts)
        horizon = self._horizon
        if not horizon.enabled:
            return CommitState(base, tuple(done), counts)
        isolating = horizon.isolating
        return CommitState(
            base,
            tuple(done),
            counts,
            horizon.target(),
            isolating.offset if isolating is not None else None,
        )

    def encode_metadata(self) -> str:
        """The commit metadata string (may be a safe prefix encoding: see ``commitstate.encode``)."""
        encoded = encode(self.commit_state(), self._budget)
        return encoded if encoded is not None else ""

    def commit_point(self, revoked: bool) -> CommitPoint:
        """See `sidecar.core.ledger.partition.PartitionLedger.commit_point`."""
        state = self.commit_state()
        metadata = encode(state, self._budget)
        horizon = self._horizon
        if state.horizon is not None:
            # The header always fits the smallest budget (64): a point never loses its horizon.
            assert metadata is not None
        if not revoked:
            horizon.point_made(state.horizon)
        charged = state.charged
        return CommitPoint(
            self._topic,
            self._partition,
            state.base_offset,
            metadata or "",
            state.horizon,
            charged,
            None if charged is None else state.counts[charged],
            horizon.points,
        )

    def finish(self) -> CommitState:
        """Revoke (horizon mode): the state with the lowest horizon that is still exact, from now
        on the state to commit.  A charge never handed out is taken back."""
        horizon = self._horizon
        uncharged = horizon.uncharge()
        if uncharged is not None:
            # Charged, never handed out: the charge goes back; it stays a suspect.
            count = uncharged.delivery_count
            uncharged.delivery_count = count - 1
            self.recount(uncharged.offset, count, count - 1)
        state = self.commit_state()
        top = horizon.final_top(
            state.base_offset,
            [record.offset for record in self._live.values()],
            self._holdings.last_added,
        )
        isolating = horizon.isolating
        self._final = CommitState(
            state.base_offset,
            state.done,
            state.counts,
            top,
            isolating.offset if isolating is not None else None,
        )
        return self._final

    # -- its size ----------------------------------------------------------------------------

    def _structural_raw(self) -> int:
        """An upper bound of the run-length payload from O(1) counters.

        The done ranges and count runs kept in memory are counted exactly (``_n_ranges``,
        ``_n_count_runs``), the restored ones not yet reached are bounded by their number; a range
        is two varints, a count run three; every varint of an offset is at most the span from the
        base to the highest offset known.
        """
        holdings = self._holdings
        records = holdings.records
        base = next(iter(records)) if records else holdings.last_added + 1
        v = _vlen(max(holdings.last_added, holdings.restored_top) - base + 2)
        ranges = self._n_ranges + len(holdings.restored_done) - holdings.restored_index
        runs = self._n_count_runs + len(holdings.restored_counts)
        # base (<= 9 bytes), done kind (1), two list lengths (<= 3 each); counts < 2**21; version
        # 2's header: horizon (<= 10), charged kind (1), its offset and count (<= 13).
        header = 40 if self._horizon.enabled else 16
        return header + ranges * 2 * v + runs * (2 * v + 3)

    def estimate(self) -> int:
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

    def over(self, fraction: float, version: int) -> bool:
        """Would the metadata exceed ``fraction`` of the budget?  Exact when it matters.

        ``version`` is the ledger's state version: a measurement of the same version is reused.
        """
        limit = self._budget * fraction
        if self.estimate() <= limit:
            return False
        if self._measured_version != version:
            self.measure(version)
        return self._measured_chars > limit

    def measure(self, version: int) -> None:
        """Measure the state to commit against its budget (the ledger's state ``version``)."""
        state = self.commit_state()
        self._measured_raw = self._structural_raw()
        self._measured_version = version
        bound = chars_for_payload(payload_bound(state))
        # Encoding (zlib included) is the expensive part: only when the bound is not conclusive.
        self._measured_chars = (
            encoded_length(state) if bound > self._budget * RESUME_FILL else bound
        )
