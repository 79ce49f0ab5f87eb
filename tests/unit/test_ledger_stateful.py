"""Hypothesis stateful tests of the ledger's invariants against a small model.

Invariants checked after every step:
- the committable offset never decreases and is exactly the lowest offset not done;
- every record becomes done exactly once (unless a truncated state made a redelivery legitimate);
- a delivery count never exceeds the limit, and without truncation no record is acquired more than
  ``limit`` times, restarts included;
- KEY order: one attempt in flight per key, in offset order; PARTITION order: one per partition;
- after encode -> decode -> new ledger, done records are skipped and counts continue, and a record
  that is not done is never marked done by the persisted state (offsets near 2**63, gaps, and
  states too big for their budget included);
- at the end, with time moving on and every answer an accept, everything drains.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from sidecar.core.backoff import RetryPolicy
from sidecar.core.commitstate import MAX_OFFSET, CommitState, decode, encode, payload_bound
from sidecar.core.ledger import (
    Ack,
    ArchiveReason,
    Attempt,
    CommitPoint,
    CrashAccounting,
    ExpiredAttempt,
    IsolationPhase,
    LedgerConfig,
    Ordering,
    PartitionLedger,
    RecordState,
    UnknownAttempt,
)

LOCK_MS = 100
KEYS = [None, b"a", b"b", b"c"]


class LedgerMachine(RuleBasedStateMachine):
    ledger: PartitionLedger
    config: LedgerConfig

    @initialize(
        ordering=st.sampled_from(list(Ordering)),
        start=st.sampled_from([0, 1000, MAX_OFFSET - 400]),
        limit=st.integers(1, 3),
        budget=st.sampled_from([64, 96, 4096]),
        locks=st.sampled_from([1, 2, 5, 40]),
    )
    def setup(self, ordering: Ordering, start: int, limit: int, budget: int, locks: int) -> None:
        self.config = LedgerConfig(
            delivery_count_limit=limit,
            lock_duration_ms=LOCK_MS,
            max_record_locks=locks,
            max_buffered_records=50,
            ordering=ordering,
            retry=RetryPolicy(initial_ms=10, max_ms=40, jitter=0.5),
            metadata_max_bytes=budget,
        )
        self.epoch = 0
        self.ledger = PartitionLedger("t", 7, start, self.config)
        self.now = 0
        self.start = start
        self.next_offset = start
        self.keys: dict[int, bytes | None] = {}
        self.fetched: list[int] = []
        self.done: set[int] = set()
        self.count: dict[int, int] = {}
        self.acquired: dict[int, int] = {}
        self.live: dict[str, tuple[int, int]] = {}
        self.retired: list[str] = []
        self.foreign: list[str] = []
        self.archiving: set[int] = set()
        self.last_committable = start
        self.lossy = False  # a truncated state made redeliveries / count resets legitimate
        # The scheduler's skip (`PartitionLedger.changes`): the ledger's counter after an acquire
        # that gave less than it was offered, and its next deadline then; and the answers of its
        # queries at the last step.
        self.quiet: tuple[int, int | None] | None = None
        self.seen: tuple[int, object] | None = None

    # -- helpers ---------------------------------------------------------------------------------

    def not_done(self) -> list[int]:
        return [o for o in self.fetched if o not in self.done and o >= self.start]

    @staticmethod
    def size(offset: int) -> int:
        return offset % 97 + 1  # what the record costs against the byte budget

    def snapshot(self) -> object:
        return (
            self.ledger.commit_state(),
            self.ledger.statistics(),
            self.ledger.next_deadline_ms(),
        )

    def mark_done(self, offset: int) -> None:
        assert offset not in self.done, f"offset {offset} done twice"
        self.done.add(offset)

    def retire(self, attempt_id: str) -> int:
        offset, _ = self.live.pop(attempt_id)
        self.retired.append(attempt_id)
        return offset

    # -- rules -----------------------------------------------------------------------------------

    @rule(
        batch=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(KEYS)), min_size=1, max_size=20)
    )
    def add(self, batch: list[tuple[int, bytes | None]]) -> None:
        for gap, key in batch:
            offset = self.next_offset + gap
            if offset > MAX_OFFSET:
                return
            assert self.ledger.add(offset, key, ("item", offset), self.now, self.size(offset))
            self.keys[offset] = key
            self.fetched.append(offset)
            self.next_offset = offset + 1

    @rule(max_n=st.integers(1, 20))
    def acquire(self, max_n: int) -> None:
        attempts = self.ledger.acquire(self.now, max_n)
        assert len(attempts) <= max_n
        for attempt in attempts:
            offset = attempt.offset
            assert offset in self.keys and offset not in self.done
            assert offset not in self.archiving
            assert attempt.item == ("item", offset)
            assert attempt.key == self.keys[offset]
            assert attempt.lock_deadline_ms == self.now + LOCK_MS
            self.count[offset] = self.count.get(offset, 0) + 1
            self.acquired[offset] = self.acquired.get(offset, 0) + 1
            assert attempt.delivery_count == self.count[offset]
            assert attempt.delivery_count <= self.config.delivery_count_limit
            if not self.lossy:
                assert self.acquired[offset] <= self.config.delivery_count_limit
            in_flight = {o for o, _ in self.live.values()}
            assert offset not in in_flight
            ordering = self.config.ordering
            key = self.keys[offset]
            if ordering is Ordering.PARTITION or (ordering is Ordering.KEY and key is not None):
                same = [
                    o
                    for o in self.not_done()
                    if ordering is Ordering.PARTITION or self.keys[o] == key
                ]
                assert not in_flight.intersection(same), "two in flight for one key"
                earlier = [o for o in same if o < offset]
                assert not earlier, f"{offset} delivered before {earlier}"
            self.live[attempt.attempt_id] = (offset, attempt.lock_deadline_ms)
        assert len(self.live) <= self.config.max_record_locks
        ledger = self.ledger
        self.quiet = (ledger.changes, ledger.next_deadline_ms()) if len(attempts) < max_n else None

    @precondition(
        lambda self: (
            self.quiet is not None
            and self.quiet[0] == self.ledger.changes
            and (self.quiet[1] is None or self.now < self.quiet[1])
        )
    )
    @rule(max_n=st.integers(1, 20))
    def acquire_when_unchanged(self, max_n: int) -> None:
        # The scheduler skips such a partition: nothing to acquire until it changes or its
        # next deadline comes.
        assert self.ledger.acquire(self.now, max_n) == []

    @precondition(lambda self: self.live)
    @rule(data=st.data(), ack=st.sampled_from(list(Ack)))
    def answer(self, data: st.DataObject, ack: Ack) -> None:
        attempt_id = data.draw(st.sampled_from(sorted(self.live)))
        offset, deadline = self.live[attempt_id]
        if self.now >= deadline:
            before = self.snapshot()
            try:
                self.ledger.answer(attempt_id, ack, self.now)
            except ExpiredAttempt:
                assert self.snapshot() == before
                return
            raise AssertionError("an answer after the lock deadline was accepted")
        result = self.ledger.answer(attempt_id, ack, self.now)
        assert result.offset == offset
        assert result.delivery_count == self.count[offset]
        if ack is Ack.RENEW:
            assert result.state is RecordState.ACQUIRED
            self.live[attempt_id] = (offset, self.now + LOCK_MS)
            return
        self.retire(attempt_id)
        if ack is Ack.ACCEPT:
            assert result.state is RecordState.ACKNOWLEDGED
            self.mark_done(offset)
        elif ack is Ack.REJECT or self.count[offset] >= self.config.delivery_count_limit:
            assert result.state is RecordState.ARCHIVING
            self.archiving.add(offset)
        else:
            assert result.state is RecordState.AVAILABLE

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def not_attempted(self, data: st.DataObject) -> None:
        attempt_id = data.draw(st.sampled_from(sorted(self.live)))
        offset, deadline = self.live[attempt_id]
        if self.now >= deadline:
            return  # covered by answer(); expire() will count it
        result = self.ledger.not_attempted(attempt_id, self.now)
        self.retire(attempt_id)
        self.count[offset] -= 1
        self.acquired[offset] -= 1
        assert result.delivery_count == self.count[offset]

    @precondition(lambda self: self.retired)
    @rule(data=st.data(), ack=st.sampled_from(list(Ack)))
    def stale_answer(self, data: st.DataObject, ack: Ack) -> None:
        attempt_id = data.draw(st.sampled_from(self.retired))
        before = self.snapshot()
        try:
            self.ledger.answer(attempt_id, ack, self.now)
        except ExpiredAttempt:
            pass
        else:
            raise AssertionError(f"a retired attempt {attempt_id} was answered")
        assert self.snapshot() == before

    @precondition(lambda self: self.foreign)
    @rule(data=st.data())
    def foreign_answer(self, data: st.DataObject) -> None:
        attempt_id = data.draw(st.sampled_from(self.foreign))
        before = self.snapshot()
        try:
            self.ledger.answer(attempt_id, Ack.ACCEPT, self.now)
        except UnknownAttempt:
            pass
        else:
            raise AssertionError(f"an attempt {attempt_id} of an old assignment was answered")
        assert self.snapshot() == before

    @rule(ms=st.integers(0, 150))
    def tick(self, ms: int) -> None:
        self.now += ms
        results = self.ledger.expire(self.now)
        due = {i for i, (_, deadline) in self.live.items() if deadline <= self.now}
        assert {r.attempt_id for r in results} == due
        for result in results:
            offset = self.retire(result.attempt_id)
            if self.count[offset] >= self.config.delivery_count_limit:
                assert result.state is RecordState.ARCHIVING
                self.archiving.add(offset)
            else:
                assert result.state is RecordState.AVAILABLE
                assert result.retry_at_ms is not None and result.retry_at_ms > self.now
        deadline = self.ledger.next_deadline_ms()
        if self.live:
            # Expired locks are gone; the next wake-up is no later than the next lock expiry.
            assert deadline is not None
            assert deadline <= min(d for _, d in self.live.values())
            assert min(d for _, d in self.live.values()) > self.now

    @rule(data=st.data())
    def archive(self, data: st.DataObject) -> None:
        for request in self.ledger.to_archive():
            offset = request.offset
            limit = self.config.delivery_count_limit
            assert offset in self.archiving or self.count.get(offset, 0) >= limit
            assert offset not in self.done
            assert request.delivery_count == self.count.get(offset, 0)
            if data.draw(st.booleans()):
                self.ledger.dlq_written(offset)
                self.archiving.discard(offset)
                self.mark_done(offset)
            else:
                self.ledger.dlq_failed(offset)
                self.archiving.add(offset)

    @rule(squeeze=st.sampled_from([None, None, 20, 28, 40]))
    def restart(self, squeeze: int | None) -> None:
        """Commit, lose the process (or the partition), and start again from the metadata.

        ``squeeze`` encodes with a smaller budget than configured: a state that does not fit."""
        metadata = self.ledger.encode_metadata()
        assert len(metadata) <= self.config.metadata_max_bytes
        if squeeze is not None:
            metadata = encode(self.ledger.commit_state(), squeeze) or ""
        committed = self.ledger.committable_offset()
        full = self.ledger.revoke()
        assert full.base_offset == committed
        restored = decode(metadata) if metadata else None
        if restored is None:
            restored = CommitState(committed)
        assert restored.base_offset == committed
        not_done = set(self.not_done())
        for offset in not_done:
            # Safety: a record that is not done must never be persisted as done.
            assert not restored.is_done(offset), f"{offset} persisted as done"
        if restored != full:
            self.lossy = True
        else:
            for offset in self.fetched:
                if offset >= committed and offset in self.done:
                    assert restored.is_done(offset)
            for offset in not_done:
                assert restored.count(offset) == self.count.get(offset, 0)
        for attempt_id in list(self.live):
            self.retire(attempt_id)
        # Ids of the old assignment are unknown to the new one (the epoch differs).
        self.foreign = self.retired
        self.retired = []
        self.archiving.clear()
        self.epoch += 1
        self.ledger = PartitionLedger("t", 7, committed, self.config, restored, epoch=self.epoch)
        self.quiet = self.seen = None  # a new ledger: its own counter
        self.start = committed
        self.last_committable = committed
        for offset in self.fetched:
            if offset < committed:
                continue
            if offset not in not_done and not restored.is_done(offset):
                self.done.discard(offset)  # dropped by truncation: it will be redelivered
            added = self.ledger.add(
                offset, self.keys[offset], ("item", offset), self.now, self.size(offset)
            )
            assert added == (not restored.is_done(offset))
            if added:
                self.count[offset] = restored.count(offset)

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def committable_is_the_lowest_not_done(self) -> None:
        committable = self.ledger.committable_offset()
        assert committable >= self.last_committable, "committable offset went back"
        self.last_committable = committable
        not_done = self.not_done()
        if not_done:
            assert committable == min(not_done)
        else:
            assert committable >= self.next_offset or committable >= self.start

    @invariant()
    def metadata_size_bound_holds(self) -> None:
        # The O(1) structural bound the pause decision starts from must bound the real payload,
        # and its exact done-range count must match what commit_state emits.
        state = self.ledger.commit_state()
        assert self.ledger._metadata._structural_raw() >= payload_bound(state)
        pending = self.ledger._holdings.restored_done[self.ledger._holdings.restored_index :]
        if not pending:
            assert self.ledger._metadata._n_ranges == len(state.done)
        if not self.ledger._holdings.restored_counts:
            runs = sum(
                1
                for o, c in state.counts.items()
                if state.counts.get(o - 1) != c  # a run starts where the previous offset differs
            )
            assert self.ledger._metadata._n_count_runs == runs

    @invariant()
    def unchanged_means_the_same_answers(self) -> None:
        ledger = self.ledger
        answers = (
            ledger.commit_state(),
            ledger.statistics(),
            ledger.next_deadline_ms(),
            ledger.next_lock_deadline_ms(),
            ledger.should_pause(200),
            ledger.may_resume(200),
            ledger.horizon_wanted(),
        )
        if self.seen is not None and self.seen[0] == ledger.changes:
            assert answers == self.seen[1], "the ledger's answers changed, its counter did not"
        self.seen = (ledger.changes, answers)

    @invariant()
    def counters_match(self) -> None:
        stats = self.ledger.statistics()
        assert stats.in_flight == len(self.live)
        assert stats.buffered == len(self.not_done())
        assert stats.available >= 0
        # The byte budget's accounting: exactly the sizes of the records not done.
        assert stats.buffered_bytes == sum(self.size(o) for o in self.not_done())

    def teardown(self) -> None:
        # Liveness: time moves on, every attempt is accepted, every DLQ write succeeds.
        for _ in range(10 * len(self.fetched) + 20):
            for attempt_id in list(self.live):
                offset = self.retire(attempt_id)
                self.ledger.answer(attempt_id, Ack.ACCEPT, self.now)
                self.mark_done(offset)
            for request in self.ledger.to_archive():
                self.ledger.dlq_written(request.offset)
                self.mark_done(request.offset)
            if self.ledger.is_idle:
                break
            self.now += 100
            for attempt in self.ledger.acquire(self.now, 100):
                self.live[attempt.attempt_id] = (attempt.offset, attempt.lock_deadline_ms)
        assert self.ledger.is_idle, self.ledger.statistics()
        assert self.ledger.committable_offset() >= self.next_offset
        assert not self.not_done()


LedgerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_ledger_machine = LedgerMachine.TestCase


# -- horizon mode: deaths and restarts -------------------------------------------------------------


class HorizonMachine(RuleBasedStateMachine):
    """Horizon crash accounting, with the broker's stored commit and deaths modelled.

    The model is the engine: it hands out what ``acquire`` and ``committed`` return, commits one
    point at a time (made, then landed), isolates when the ledger wants it and nothing is in
    flight, and on a death (a random one, or the killer handed out) rebuilds the ledger from the
    stored commit -- a commit under way may have landed or not.  Invariants, checked at every step
    or at every death / revoke against the state the next owner reads:

    - *horizon*: every attempt in flight is at or below the stored horizon (a hand-out never
      outruns the persisted "may have been delivered" mark);
    - *safety*: the stored offset is at most the lowest record not done, and no record that is not
      done is stored as done;
    - *no charge for a death*: a record's stored count <= the failed outcomes seen for it (release,
      expiry, reject) + the isolated attempts of it whose outcome a death or revoke lost;
    - *no count without a hand-out*: stored count <= its hand-outs + the deaths that came while it
      was charged and not sent (at most one record per death);
    - *killer* (killer runs: one record kills the process on every hand-out; other deaths may
      happen too): at each of its deaths no other record is being isolated, and if it is, it is
      alone in flight; it is dead-lettered for its count after at most ``limit + 1`` of its
      deaths; any other record dead-lettered for its count failed, or lost an isolated attempt to
      a death it did not cause, ``limit`` times.
    """

    ledger: PartitionLedger
    config: LedgerConfig

    @initialize(
        ordering=st.sampled_from(list(Ordering)),
        limit=st.integers(1, 3),
        window=st.sampled_from([2, 4, 16]),
        locks=st.sampled_from([1, 3, 40]),
        killer=st.one_of(st.none(), st.integers(0, 8)),
        budget=st.sampled_from([200, 4096]),
    )
    def setup(
        self,
        ordering: Ordering,
        limit: int,
        window: int,
        locks: int,
        killer: int | None,
        budget: int,
    ) -> None:
        self.config = LedgerConfig(
            delivery_count_limit=limit,
            lock_duration_ms=LOCK_MS,
            max_record_locks=locks,
            max_buffered_records=50,
            ordering=ordering,
            retry=RetryPolicy(initial_ms=10, max_ms=40, jitter=0.5),
            metadata_max_bytes=4096 if killer is not None else budget,
            crash_accounting=CrashAccounting.HORIZON,
            horizon_window=window,
        )
        self.killer_mode = killer is not None
        self.killer_index = killer  # the killer is the record fetched at this index
        self.killer: int | None = None
        self.killer_deaths = 0
        self.start = 1000
        self.stored_offset = self.start
        self.stored_metadata = ""
        self.epoch = 0
        self.ledger = PartitionLedger("t", 7, self.start, self.config)
        self.now = 0
        self.next_offset = self.start
        self.keys: dict[int, bytes | None] = {}
        self.fetched: list[int] = []
        self.done: set[int] = set()
        self.handouts: dict[int, int] = {}
        self.failures: dict[int, int] = {}
        self.lost_isolated: dict[int, int] = {}
        self.unsent_deaths: dict[int, int] = {}
        self.live: dict[str, int] = {}
        self.archived: dict[int, int] = {}
        self.in_commit: CommitPoint | None = None
        self.points_made = 0
        self.in_commit_seq = 0
        self.isolating: int | None = None
        self.isolation_sent = False
        # The isolated attempt's outcome, not committed yet: (offset, points made before it, sent).
        self.unflushed: tuple[int, int, bool] | None = None

    # -- the engine --------------------------------------------------------------------------------

    def stored(self) -> CommitState:
        state = decode(self.stored_metadata) if self.stored_metadata else None
        return state if state is not None else CommitState(self.stored_offset)

    def send(self, attempts: list[Attempt]) -> None:
        horizon = self.stored().horizon
        died = False
        for attempt in attempts:
            offset = attempt.offset
            assert horizon is not None and offset <= horizon, (offset, horizon)
            assert offset not in self.done
            self.handouts[offset] = self.handouts.get(offset, 0) + 1
            self.live[attempt.attempt_id] = offset
            assert attempt.delivery_count <= self.handouts[offset] + self.unsent_deaths.get(
                offset, 0
            )
            if offset == self.isolating:
                self.isolation_sent = True
            died = died or offset == self.killer
        if died:
            self.die(landed=False, by_killer=True)

    def outcome(self, offset: int, *, failed: bool) -> None:
        if failed:
            self.failures[offset] = self.failures.get(offset, 0) + 1
        if offset == self.isolating:
            self.isolating = None
            self.unflushed = (offset, self.points_made, True)

    def rebuild(self, restored: CommitState | None) -> None:
        # Done after the last stored commit is not done for the next owner: redelivered.
        self.done = {o for o in self.done if restored is not None and restored.is_done(o)} | {
            o for o in self.done if o < self.stored_offset
        }
        self.live.clear()
        self.isolating = None
        self.in_commit = None
        self.unflushed = None
        self.epoch += 1
        self.ledger = PartitionLedger(
            "t", 7, self.stored_offset, self.config, restored, epoch=self.epoch
        )
        for offset in self.fetched:
            if offset >= self.stored_offset:
                added = self.ledger.add(offset, self.keys[offset], None, self.now)
                assert added == (restored is None or not restored.is_done(offset))

    def check_stored(self, *, charging: set[int | None] | None = None) -> None:
        """``charging``: records whose isolation charge may be stored ahead of its outcome."""
        charging = charging or set()
        state = self.stored()
        not_done = [o for o in self.fetched if o not in self.done]
        if not_done:
            assert state.base_offset <= min(not_done)
        for offset in not_done:
            assert not state.is_done(offset), f"{offset} stored as done"
        for offset, count in state.counts.items():
            failed = self.failures.get(offset, 0) + (offset in charging)
            assert count <= failed + self.lost_isolated.get(offset, 0), (
                f"{offset}: stored count {count}, {failed} failures: charged for a death"
            )
            sent = self.handouts.get(offset, 0) + (offset in charging)
            assert count <= sent + self.unsent_deaths.get(offset, 0)

    def die(self, *, landed: bool, by_killer: bool = False) -> None:
        if by_killer:
            # Only the killer kills: a death charges it alone, or (its first) no one.
            assert self.isolating in (None, self.killer), "an innocent isolated at a death"
            assert self.unflushed is None, "handed out before an isolated outcome was committed"
            if self.isolating is not None:
                assert sorted(self.live.values()) == [self.killer], "isolated, not alone"
        if self.in_commit is not None and landed:
            self.stored_offset = self.in_commit.offset
            self.stored_metadata = self.in_commit.metadata
        if self.isolating is not None:
            offset = self.isolating
            self.lost_isolated[offset] = self.lost_isolated.get(offset, 0) + 1
            if not self.isolation_sent:
                self.unsent_deaths[offset] = self.unsent_deaths.get(offset, 0) + 1
        if self.unflushed is not None:
            offset, _, sent = self.unflushed
            self.lost_isolated[offset] = self.lost_isolated.get(offset, 0) + 1
            if not sent:
                self.unsent_deaths[offset] = self.unsent_deaths.get(offset, 0) + 1
        if by_killer:
            self.killer_deaths += 1
        self.check_stored()
        self.rebuild(decode(self.stored_metadata) if self.stored_metadata else None)

    # -- rules -------------------------------------------------------------------------------------

    @rule(
        batch=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(KEYS)), min_size=1, max_size=12)
    )
    def add(self, batch: list[tuple[int, bytes | None]]) -> None:
        for gap, key in batch:
            offset = self.next_offset + gap
            assert self.ledger.add(offset, key, None, self.now)
            self.keys[offset] = key
            self.fetched.append(offset)
            self.next_offset = offset + 1
            if self.killer_index == len(self.fetched) - 1:
                self.killer = offset

    @rule(max_n=st.integers(1, 10))
    def acquire(self, max_n: int) -> None:
        self.send(self.ledger.acquire(self.now, max_n))

    @precondition(lambda self: self.in_commit is None)
    @rule()
    def start_commit(self) -> None:
        self.in_commit = self.ledger.commit_point()
        self.points_made += 1
        self.in_commit_seq = self.points_made

    @precondition(lambda self: self.in_commit is not None)
    @rule()
    def land_commit(self) -> None:
        point = self.in_commit
        assert point is not None
        self.in_commit = None
        self.stored_offset, self.stored_metadata = point.offset, point.metadata
        if self.unflushed is not None and self.in_commit_seq > self.unflushed[1]:
            self.unflushed = None
        charging = {self.isolating, None if self.unflushed is None else self.unflushed[0]}
        self.check_stored(charging=charging)
        attempt = self.ledger.committed(point, self.now)
        if attempt is not None:
            assert attempt.offset == self.isolating
            self.send([attempt])

    @precondition(lambda self: self.ledger.in_flight == 0)
    @rule()
    def isolate(self) -> None:
        if not self.ledger.wants_isolation:
            return
        charge = self.ledger.isolate(self.now)
        assert self.ledger.horizon_status().isolation is IsolationPhase.CHARGED
        self.isolating = charge.offset
        self.isolation_sent = False

    @precondition(lambda self: self.live)
    @rule(data=st.data(), ack=st.sampled_from(list(Ack)))
    def answer(self, data: st.DataObject, ack: Ack) -> None:
        attempt_id = data.draw(st.sampled_from(sorted(self.live)))
        offset = self.live[attempt_id]
        try:
            result = self.ledger.answer(attempt_id, ack, self.now)
        except ExpiredAttempt:
            return  # its lock ran out: tick() sees the expiry
        if ack is Ack.RENEW:
            return
        del self.live[attempt_id]
        if ack is Ack.ACCEPT:
            self.done.add(offset)
            self.outcome(offset, failed=False)
        else:
            self.outcome(offset, failed=True)
            assert result.delivery_count <= self.failures[offset] + self.lost_isolated.get(
                offset, 0
            )

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def not_attempted(self, data: st.DataObject) -> None:
        attempt_id = data.draw(st.sampled_from(sorted(self.live)))
        offset = self.live[attempt_id]
        try:
            self.ledger.not_attempted(attempt_id, self.now)
        except ExpiredAttempt:
            return
        del self.live[attempt_id]
        self.handouts[offset] -= 1  # it never left
        if offset == self.isolating:
            self.isolating = None
            # The charge may still be stored, until a point made from now on lands.
            self.unflushed = (offset, self.points_made, False)

    @rule(ms=st.integers(0, 150))
    def tick(self, ms: int) -> None:
        self.now += ms
        for result in self.ledger.expire(self.now):
            offset = self.live.pop(result.attempt_id)
            self.outcome(offset, failed=True)

    @rule(write=st.booleans())
    def archive(self, write: bool) -> None:
        limit = self.config.delivery_count_limit
        for request in self.ledger.to_archive():
            offset = request.offset
            if request.reason is ArchiveReason.DELIVERY_COUNT_EXCEEDED:
                if offset == self.killer:
                    assert self.killer_deaths <= limit + 1
                else:
                    charged = self.failures.get(offset, 0) + self.lost_isolated.get(offset, 0)
                    assert charged >= limit, f"{offset} dead-lettered"
            if write:
                self.ledger.dlq_written(offset)
                self.archived[offset] = request.delivery_count
                self.done.add(offset)
            else:
                self.ledger.dlq_failed(offset)

    @rule(landed=st.booleans())
    def crash(self, landed: bool) -> None:
        """A death no record caused (OOM kill, node drain, a deploy)."""
        self.die(landed=landed)

    @rule()
    def revoke(self) -> None:
        """A rebalance: the engine commits the final state (a commit under way is dropped)."""
        state = self.ledger.revoke()
        for offset in self.live.values():
            assert state.horizon is not None and offset <= state.horizon
        if self.isolating is not None and self.isolation_sent:
            self.lost_isolated[self.isolating] = self.lost_isolated.get(self.isolating, 0) + 1
        self.stored_offset = state.base_offset
        self.stored_metadata = self.ledger.encode_metadata()
        self.check_stored()
        self.rebuild(decode(self.stored_metadata) if self.stored_metadata else None)

    # -- invariants --------------------------------------------------------------------------------

    @invariant()
    def in_flight_within_the_stored_horizon(self) -> None:
        horizon = self.stored().horizon
        for offset in self.live.values():
            assert horizon is not None and offset <= horizon
        assert self.ledger.in_flight == len(self.live)
        status = self.ledger.horizon_status()
        assert status.suspects_left >= 0
        if status.isolation in (IsolationPhase.CHARGED, IsolationPhase.IN_FLIGHT):
            assert self.ledger.in_flight == (status.isolation is IsolationPhase.IN_FLIGHT)

    def teardown(self) -> None:
        # Liveness: commits land, suspects are isolated, the app accepts every innocent record.
        for _ in range(30 * len(self.fetched) + 50):
            if self.in_commit is None:
                self.start_commit()
            self.land_commit()
            if self.ledger.in_flight == 0 and self.ledger.wants_isolation:
                self.isolate()
                continue
            for attempt_id, offset in list(self.live.items()):
                self.ledger.answer(attempt_id, Ack.ACCEPT, self.now)
                del self.live[attempt_id]
                self.done.add(offset)
                self.outcome(offset, failed=False)
            for request in self.ledger.to_archive():
                self.ledger.dlq_written(request.offset)
                self.archived[request.offset] = request.delivery_count
                self.done.add(request.offset)
            if self.ledger.is_idle:
                break
            self.now += 50
            self.send(self.ledger.acquire(self.now, 100))
        assert self.ledger.is_idle, (self.ledger.statistics(), self.ledger.horizon_status())
        assert not [o for o in self.fetched if o not in self.done]
        if self.killer is not None:
            limit = self.config.delivery_count_limit
            assert self.archived.get(self.killer) == limit
            assert self.killer_deaths <= limit + 1


HorizonMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=50, deadline=None)
test_horizon_machine = HorizonMachine.TestCase
