"""Crash accounting: how deliveries are charged against a death, the horizon and the isolation pass.

SPEC §3: a record that kills the process (or the pod) on every delivery reaches the DLQ after at
most ``limit + 1`` deaths, and no other record is dead-lettered, or has its count raised, because
of those deaths.  ``LedgerConfig.crash_accounting`` selects how:

``WRITE_AHEAD`` (what the engine does today): ``acquire`` counts the attempt, the caller commits
the state (counts of attempts in flight included, metadata version 1) before handing it out.  Every
record in flight at a death is charged that attempt.

``HORIZON``: the committed state carries a *horizon* H (metadata version 2), meaning "every offset
above H that is not done was never handed out".  Then:

- *Normal delivery.*  ``acquire`` hands out records up to the confirmed horizon without any commit;
  an attempt's count is *pending*: it is charged (``delivery_count`` goes up) only when its outcome
  is known -- a release, a lock expiry or a reject -- and never for a death.  ``commit_state``
  writes settled counts only.  The horizon runs ahead of the hand-outs by ``horizon_window``
  offsets (default ``max_record_locks``): ``horizon_wanted()`` asks for a commit once the
  hand-outs have used half of it (or a ready record is held beyond it), the caller commits a
  ``commit_point()`` asynchronously and reports it with ``committed()``.  A record waits for a
  commit only when that commit fell behind (or after an offset jump wider than half the window,
  e.g. a compaction gap), never in steady state.
- *Suspects.*  After an unclean stop (a death, a lost partition, a revoke with answers lost) the
  next owner restores H: every not-done record at or below it may have been in flight and is a
  *suspect*.  Suspects are few: those in flight, in backoff or held by key order, plus at most a
  window of records never delivered.
- *Isolation pass.*  While a suspect is ready, ``acquire`` hands out nothing for the partition.
  ``isolate()`` (allowed only with nothing of this partition in flight, and the caller makes sure
  nothing is in flight in the whole process) takes the lowest ready suspect and raises its count in
  memory (write-ahead, exactly as today); the next ``commit_point()`` carries it in the version-2
  header, where a prefix encoding cannot drop it; ``committed()`` of that point returns its
  :class:`Attempt`.  A death now charges that record and nothing else.  A suspect is *settled*
  once its isolated attempt has an outcome (any answer or a lock expiry: its count is then exact
  and persisted, and it leaves the pass even if it waits for a retry); ``not_attempted`` takes
  the charge back and it stays a suspect.  The outcome (or the take-back) is committed before
  anything else of the partition goes out (``IsolationPhase.SETTLING``): else a death caused by
  the next record would find the isolated one still charged and not done, and charge it again.
  The next suspect may be charged meanwhile: one commit then carries both (one commit a suspect).
  Suspects are taken in offset order, so key order holds;
  one blocked behind a record waiting for a retry (``IsolationPhase.WAITING``) does not hold the
  rest of the partition.  The pass is over when no fetched suspect is left; suspects fetched later
  (still at or below H) reopen it.  Restored at the limit, a suspect is archived with no delivery.
- *Killer.*  Its first death happens in normal delivery and charges no one; every later one happens
  with it alone in flight and charged: it is archived when restored at ``limit``, after
  ``limit + 1`` deaths.  Innocent suspects are charged only for isolated attempts whose outcome is
  known, or for a death while they are the one isolated (then they were alone in flight: that
  death was theirs, or not caused by a record).
- *Revoke.*  The final state (``revoke()``) charges nothing in flight and lowers H to what is
  unsettled: the highest offset still in flight (its answer is lost), and the restored H while
  suspects are left.  A revoke with nothing in flight and no suspect leaves H below the base: the
  next owner has no pass.  A charge not yet handed out is taken back.  (The caller should let the
  app answer what is in flight before revoking; a clean shutdown is a revoke of every partition.)
- *Records in backoff* (released, count > 0) are settled: their counts are exact.  They are
  suspects after a death only because one may have been redelivered; isolating them costs time,
  never a count that is not theirs.
- *Transactional DLQ*: a commit point can go with the open transaction
  (``send_offsets_to_transaction``); ``committed()`` once the transaction commits.
- *Metadata size*: version 2 adds at most 24 bytes of header (horizon and the charged count); the
  size checks count them.  A version-1 state restored in horizon mode (or none) has no horizon:
  counts as stored, no pass.  A version-2 state restored in write-ahead mode: counts as stored,
  the horizon ignored.  Builds before version 2 read version 2 as foreign: redelivery, no loss.

The commit points that carry the horizon are made in `sidecar.core.ledger.metadata`; this module
owns the horizon's marks, the suspects and the isolation pass (sans-IO, like the whole ledger).
"""

from __future__ import annotations

import heapq

from sidecar.core.commitstate import MAX_OFFSET
from sidecar.core.ledger.base import _LedgerBase
from sidecar.core.ledger.machine import Event, _Record, enter
from sidecar.core.ledger.values import (
    Attempt,
    CommitPoint,
    HorizonStatus,
    IllegalTransition,
    IsolationCharge,
    IsolationPhase,
    LedgerClosed,
    RecordState,
)

_AVAILABLE = RecordState.AVAILABLE


class _Horizon(_LedgerBase):
    """Horizon mode's part of `PartitionLedger` (see the module docstring)."""

    def _settle(self, record: _Record) -> None:
        """The outcome of the record's attempt is known (not an accept): charge it if pending."""
        if record.pending:
            record.pending = False
            count = record.delivery_count
            record.delivery_count = count + 1
            self._recount(record.offset, count, count + 1)
            self._max_counted = max(self._max_counted, record.offset)
        if record.suspect:
            self._clear_suspect(record)

    def _horizon_need(self) -> int:
        """The highest offset handed out, held beyond the horizon, or next in line."""
        need = self._handed_top if self._handed_top > self._held_at else self._held_at
        ready = self._ready
        if ready and ready[0] > need:  # a stale entry is lower than a live one: harmless
            need = ready[0]
        return need

    def _horizon_target(self) -> int:
        """The horizon the next commit point carries: never below one already issued."""
        need = self._horizon_need()
        target = self._issued
        if need + self._window // 2 > self._confirmed:
            target = max(target, min(MAX_OFFSET, need + self._window))
        return max(target, self.committable_offset() - 1)

    def horizon_wanted(self) -> int | None:
        """Horizon mode: a commit is wanted now; the horizon its ``commit_point`` carries.

        Wanted when the hand-outs have used half the window beyond the committed horizon, or a
        ready record is held beyond it (the commit is asynchronous: hand-outs up to the committed
        horizon go on meanwhile), and during the isolation pass when a charge or an outcome waits
        for its commit.  None otherwise, in write-ahead mode and after a revoke.
        """
        if not self._horizon or self._revoked:
            return None
        if self._unflushed_after is not None or (
            self._isolating is not None and self._isolating.state is _AVAILABLE
        ):
            return self._horizon_target()
        need = self._horizon_need()
        if need + self._window // 2 <= self._confirmed:
            return None
        return self._horizon_target()

    @property
    def wants_isolation(self) -> bool:
        """A suspect is ready and nothing of it is charged or in flight: call ``isolate`` once
        nothing is in flight in the whole process (a death must charge only the isolated one)."""
        return not self._revoked and self._isolating is None and self._next_suspect() is not None

    def isolate(self, now_ms: int) -> IsolationCharge:
        """Charge the lowest ready suspect for an isolated delivery (horizon mode).

        Its delivery count goes up now, in memory: the next ``commit_point`` writes it, and once
        that point is ``committed`` the attempt is handed out.  Normal hand-outs of this partition
        stop until the pass is over.  Raises IllegalTransition in write-ahead mode, while an
        attempt of this partition is in flight or an isolation is under way, or with no suspect
        ready.
        """
        if self._revoked:
            raise LedgerClosed(f"{self._id_prefix} was revoked")
        if not self._horizon:
            raise IllegalTransition("isolation is for crash_accounting HORIZON")
        if self._isolating is not None:
            raise IllegalTransition(f"offset {self._isolating.offset} is being isolated already")
        if self._live:
            raise IllegalTransition(
                f"{len(self._live)} attempts in flight: an isolated delivery goes alone"
            )
        now = self._tick(now_ms)
        if self._backoff:
            self._release_backoffs(now)
        record = self._next_suspect()
        if record is None:
            raise IllegalTransition("no suspect is ready to be isolated")
        heapq.heappop(self._suspects_ready)
        record.queued = False
        count = record.delivery_count
        record.delivery_count = count + 1
        self._recount(record.offset, count, count + 1)
        self._max_counted = max(self._max_counted, record.offset)
        self._isolating = record
        self._version += 1
        self._changes += 1
        return IsolationCharge(self.topic, self.partition, record.offset, count + 1)

    def committed(self, point: CommitPoint, now_ms: int) -> Attempt | None:
        """The broker confirmed ``point``: hand-outs may reach its horizon, and if it carried the
        charge of the record being isolated, that record's attempt is returned: send it."""
        if self._revoked:
            raise LedgerClosed(f"{self._id_prefix} was revoked")
        if point.topic != self.topic or point.partition != self.partition:
            raise IllegalTransition(f"a commit point of {point.topic}/{point.partition}")
        if point.horizon is not None and (not self._horizon or point.horizon > self._issued):
            raise IllegalTransition(f"horizon {point.horizon} was never issued by this ledger")
        if point.serial > self._points:
            raise IllegalTransition(f"commit point {point.serial} was never made by this ledger")
        self._changes += 1
        if point.horizon is not None and point.horizon > self._confirmed:
            self._confirmed = point.horizon
        if self._unflushed_after is not None and point.serial > self._unflushed_after:
            self._unflushed_after = None
        record = self._isolating
        if (
            record is None
            or self._unflushed_after is not None  # the previous outcome is not committed yet
            or point.charged != record.offset
            or point.charged_count != record.delivery_count
            or record.state is not _AVAILABLE
        ):
            return None
        enter(record, Event.ACQUIRE)
        now = self._tick(now_ms)
        self._version += 1
        self._changes += 1
        seq = self._next_seq
        self._next_seq = seq + 1
        attempt_id = f"{self._id_prefix}{record.offset}{self._id_epoch}{seq}"
        deadline = now + self.config.lock_duration_ms
        record.attempt_id = attempt_id
        record.lock_deadline_ms = deadline
        self._live[attempt_id] = record
        self._attempts_total += 1
        self._handed_top = max(self._handed_top, record.offset)
        return Attempt(
            self.topic,
            self.partition,
            record.offset,
            attempt_id,
            record.delivery_count,
            deadline,
            record.key,
            record.item,
        )

    def horizon_status(self) -> HorizonStatus:
        record = self._isolating
        if not self._horizon:
            phase = IsolationPhase.NONE
        elif record is not None:
            phase = (
                IsolationPhase.CHARGED if record.state is _AVAILABLE else IsolationPhase.IN_FLIGHT
            )
        elif self._unflushed_after is not None:
            phase = IsolationPhase.SETTLING
        elif self._next_suspect() is not None:
            phase = IsolationPhase.READY
        elif self._n_suspects:
            phase = IsolationPhase.WAITING
        else:
            phase = IsolationPhase.NONE
        held = False
        if self._horizon and not self._revoked:
            ready = self._ready
            while ready:
                top = self._records.get(ready[0])
                if top is not None and top.queued:
                    held = ready[0] > self._confirmed
                    break
                heapq.heappop(ready)
        return HorizonStatus(
            mode=self.config.crash_accounting,
            horizon_committed=self._confirmed if self._horizon else None,
            horizon_wanted=self.horizon_wanted(),
            held=held,
            isolation=phase,
            isolating_offset=record.offset if record is not None else None,
            suspects_left=self._n_suspects,
            suspects_total=self._suspects_total,
            isolated_total=self._isolated_total,
        )
