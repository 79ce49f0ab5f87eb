"""Crash accounting: how deliveries are charged against a death, the horizon and the isolation pass.

Owns `Horizon`, a part of `sidecar.core.ledger.partition.PartitionLedger` built in its constructor:
the horizon's marks, the suspects' counts, the commit points made and the isolation pass (whose
phase moves only through `sidecar.core.ledger.machine.enter_pass`). The modes and the pass are
told in `Horizon`'s docstring; the commit points are made by
`sidecar.core.ledger.metadata.CommitMetadata`.

Sans-IO: must not import trio, confluent_kafka or anything doing I/O; never reads a clock.
"""

from __future__ import annotations

from sidecar.core.commitstate import MAX_OFFSET, CommitState
from sidecar.core.ledger.holdings import Holdings
from sidecar.core.ledger.machine import IsolationPass, LedgerRecord, PassEvent, enter_pass
from sidecar.core.ledger.values import (
    CommitPoint,
    CrashAccounting,
    HorizonStatus,
    IllegalTransition,
    IsolationPhase,
    LedgerConfig,
)

_NONE = IsolationPhase.NONE
_CHARGED = IsolationPhase.CHARGED
_IN_FLIGHT = IsolationPhase.IN_FLIGHT
_SETTLING = IsolationPhase.SETTLING


class Horizon:
    """Crash accounting of one partition's ledger.

    docs/guarantees.md: a record that kills the process (or the pod) on every delivery reaches the DLQ after at
    most ``limit + 1`` deaths, and no other record is dead-lettered, or has its count raised, because
    of those deaths.  ``LedgerConfig.crash_accounting`` selects how:

    ``WRITE_AHEAD``: ``acquire`` counts the attempt, the caller commits
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
      memory (write-ahead); the next ``commit_point()`` carries it in the version-2
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
    - *Retry tier partitions* (``due_only``): a tier record goes out only once it is due, so one
      fetched long before that was never handed out.  Their horizon runs no window ahead: it covers
      the records handed out and those ready (due) now, the highest ready one included, so a death
      leaves as suspects only records that were due at it, never the ones still waiting for their
      due time.  A record that falls due waits for one commit before it goes out.
    - *Metadata size*: version 2 adds at most 24 bytes of header (horizon and the charged count); the
      size checks count them.  A version-1 state restored in horizon mode (or none) has no horizon:
      counts as stored, no pass.  A version-2 state restored in write-ahead mode: counts as stored,
      the horizon ignored.  Builds before version 2 read version 2 as foreign: redelivery, no loss.
    """

    def __init__(
        self,
        config: LedgerConfig,
        holdings: Holdings,
        start_offset: int,
        restored: CommitState | None,
        *,
        due_only: bool = False,
    ) -> None:
        self._config = config
        self._holdings = holdings
        # Every offset handed out in this assignment is at most confirmed; issued is the highest
        # horizon put in a commit point.
        self.enabled = config.crash_accounting is CrashAccounting.HORIZON
        # A retry tier's partition: no window beyond the records due (see the class docstring).
        self._due_only = due_only
        self._window = 0 if due_only else config.window
        restored_horizon = (
            restored.horizon if restored is not None and restored.horizon is not None else None
        )
        if not self.enabled or restored_horizon is None or restored_horizon < start_offset:
            restored_horizon = start_offset - 1  # no suspects: counts as stored (version 1)
        self.suspect_top = restored_horizon
        self.confirmed = restored_horizon
        self.issued = restored_horizon
        self.handed_top = start_offset - 1
        self.held_at = -1
        self.n_suspects = 0
        self._suspects_total = 0
        self._isolated_total = 0
        self.points = 0  # commit points made
        # The highest serial of a point the broker confirmed, and the points made when the count
        # of a redelivery held for it was raised (an outcome that counts; each record keeps its
        # own, `LedgerRecord.counted_after`): a redelivery waits until a point made after its
        # raise is confirmed, so a death cannot restore a count below one the app has seen.
        self.stored_serial = 0
        self.counts_after = -1
        self.count_held = False  # a redelivery is ready and waits for that commit
        # The isolated record and its phase; the isolated attempt's outcome (or its take-back) is
        # not committed before a point made after it is confirmed: until then nothing goes out (a
        # death would charge it again).  Changed only through machine.enter_pass.
        self.isolation = IsolationPass()

    # -- suspects ----------------------------------------------------------------------------

    def fetched(self, record: LedgerRecord) -> None:
        """A record just fetched at or below ``suspect_top``: the previous owner may have handed
        it out and died, so it is a suspect."""
        record.suspect = True
        self.n_suspects += 1
        self._suspects_total += 1

    def clear_suspect(self, record: LedgerRecord) -> None:
        """The suspect's count is exact now (an outcome, or archived with no delivery)."""
        if self.isolation.isolating is record:
            enter_pass(self.isolation, PassEvent.SETTLE, points=self.points)
            self._isolated_total += 1
        record.suspect = False
        self.n_suspects -= 1

    # -- the isolation pass ------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A record is being isolated, or its outcome waits for its commit: nothing else goes."""
        return self.isolation.phase is not _NONE

    @property
    def isolating(self) -> LedgerRecord | None:
        """The record being isolated (charged or in flight), or None."""
        return self.isolation.isolating

    def charge(self, record: LedgerRecord) -> None:
        """``record`` (a suspect just taken off its heap) is charged for an isolated delivery."""
        enter_pass(self.isolation, PassEvent.CHARGE, record)

    def hand_out(self, record: LedgerRecord) -> None:
        """The isolated record's attempt goes out (the point with its charge is confirmed)."""
        enter_pass(self.isolation, PassEvent.HAND_OUT, record)

    def take_back(self, record: LedgerRecord) -> None:
        """The isolated attempt was never sent: it is still a suspect and goes again, alone, once
        the take-back is committed."""
        if self.isolation.isolating is record:
            enter_pass(self.isolation, PassEvent.TAKE_BACK, points=self.points)

    def fence(self) -> None:
        """Revoke: the isolated attempt in flight (if any) lost its answer; its charge stands."""
        if self.isolation.phase is _IN_FLIGHT:
            enter_pass(self.isolation, PassEvent.FENCE)

    def uncharge(self) -> LedgerRecord | None:
        """Revoke: a charge never handed out goes back; the record charged, or None."""
        isolating = self.isolation.isolating
        if self.isolation.phase is _CHARGED and isolating is not None:
            enter_pass(self.isolation, PassEvent.UNCHARGE)
            return isolating
        return None

    def check_isolate(self) -> None:
        """Raise unless a suspect may be charged now (the ledger checks what is in flight)."""
        if not self.enabled:
            raise IllegalTransition("isolation is for crash_accounting HORIZON")
        isolating = self.isolation.isolating
        if isolating is not None:
            raise IllegalTransition(f"offset {isolating.offset} is being isolated already")

    def confirm(self, point: CommitPoint) -> LedgerRecord | None:
        """The broker confirmed ``point``: hand-outs may reach its horizon.  The isolated record
        to hand out now (``point`` carried its charge and nothing waits for a commit), or None.
        Raises IllegalTransition, nothing changed, for a point this ledger never made."""
        if point.horizon is not None and (not self.enabled or point.horizon > self.issued):
            raise IllegalTransition(f"horizon {point.horizon} was never issued by this ledger")
        if point.serial > self.points:
            raise IllegalTransition(f"commit point {point.serial} was never made by this ledger")
        if point.horizon is not None and point.horizon > self.confirmed:
            self.confirmed = point.horizon
        if point.serial > self.stored_serial:  # noqa: PLR1730
            self.stored_serial = point.serial
        if self.count_held and self.counts_stored:
            self.count_held = False
        isolation = self.isolation
        unflushed = isolation.unflushed_after
        if unflushed is not None and point.serial > unflushed:
            enter_pass(isolation, PassEvent.FLUSH)
        record = isolation.isolating
        if (
            record is None
            or isolation.phase is not _CHARGED
            or isolation.unflushed_after is not None  # the previous outcome is not committed yet
            or point.charged != record.offset
            or point.charged_count != record.delivery_count
        ):
            return None
        return record

    def handed(self, offset: int) -> None:
        """Records up to ``offset`` were handed out."""
        if offset > self.handed_top:  # noqa: PLR1730 (max() is a call: slower on the hot path)
            self.handed_top = offset

    def held_beyond(self, offset: int) -> None:
        """A ready record at ``offset`` waits for the horizon's commit (it fell behind)."""
        if offset > self.held_at:  # noqa: PLR1730 (hot path: no max() call)
            self.held_at = offset

    def hold_for_count(self, counted_after: int) -> None:
        """A ready redelivery waits for the commit of the count it had raised once ``counted_after``
        points were made: a commit is wanted now (otherwise the periodic one, usually within the
        retry backoff, carries it)."""
        self.count_held = True
        if counted_after > self.counts_after:  # noqa: PLR1730 (hot path: no max() call)
            self.counts_after = counted_after

    @property
    def counts_stored(self) -> bool:
        """The counts of the redeliveries held so far are in a confirmed commit point."""
        return self.stored_serial > self.counts_after

    def point_made(self, horizon: int | None) -> None:
        """A commit point was made (not after revoke), carrying ``horizon``."""
        self.points += 1
        if horizon is not None and horizon > self.issued:
            self.issued = horizon

    # -- what a commit should carry ----------------------------------------------------------

    def _need(self) -> int:
        """The highest offset handed out, held beyond the horizon, or next in line."""
        need = self.handed_top if self.handed_top > self.held_at else self.held_at
        ready = self._holdings.ready
        if not ready:
            return need
        # The lowest ready (a stale entry is lower than a live one: harmless); with no window,
        # the highest, so one commit covers every record that fell due together (a stale entry
        # there stands for a record that was due: covering it costs nothing).
        top = max(ready) if self._due_only else ready[0]
        return top if top > need else need

    def target(self) -> int:
        """The horizon the next commit point carries: never below one already issued."""
        need = self._need()
        target = self.issued
        if need + self._window // 2 > self.confirmed:
            target = max(target, min(MAX_OFFSET, need + self._window))
        return max(target, self._holdings.committable_offset() - 1)

    def wanted(self, revoked: bool) -> int | None:
        """See `sidecar.core.ledger.partition.PartitionLedger.horizon_wanted`."""
        if not self.enabled or revoked:
            return None
        phase = self.isolation.phase
        if phase is _SETTLING or phase is _CHARGED:
            return self.target()
        if self.count_held and not self.counts_stored:
            return self.target()
        need = self._need()
        if need + self._window // 2 <= self.confirmed:
            return None
        return self.target()

    def final_top(self, base_offset: int, live_offsets: list[int], last_added: int) -> int:
        """Revoke: the lowest horizon that is still exact (what is unsettled)."""
        top = base_offset - 1
        for offset in live_offsets:  # answers lost: the next owner isolates up to them
            if offset > top:  # noqa: PLR1730
                top = offset
        if self.n_suspects or last_added < self.suspect_top:
            top = max(top, self.suspect_top)  # suspects not settled (or not fetched) stay so
        return top

    def status(self, revoked: bool) -> HorizonStatus:
        """See `sidecar.core.ledger.partition.PartitionLedger.horizon_status`."""
        record = self.isolation.isolating
        holdings = self._holdings
        phase = self.isolation.phase  # NONE in write-ahead mode
        if phase is not _NONE or not self.enabled:
            pass  # the table's phase
        elif holdings.next_suspect() is not None:
            phase = IsolationPhase.READY
        elif self.n_suspects:
            phase = IsolationPhase.WAITING
        else:
            phase = IsolationPhase.NONE
        held = False
        if self.enabled and not revoked:
            first = holdings.first_ready()
            held = first is not None and first > self.confirmed
        return HorizonStatus(
            mode=self._config.crash_accounting,
            horizon_committed=self.confirmed if self.enabled else None,
            horizon_wanted=self.wanted(revoked),
            held=held,
            isolation=phase,
            isolating_offset=record.offset if record is not None else None,
            suspects_left=self.n_suspects,
            suspects_total=self._suspects_total,
            isolated_total=self._isolated_total,
        )
