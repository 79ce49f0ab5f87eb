"""The attempts in flight of a partition's ledger: their ids and their lock-deadline order (sans-IO).

Owns `Attempts`, a part of `sidecar.core.ledger.partition.PartitionLedger`.

Imports the standard library and the ledger's values and machine only.
"""

from __future__ import annotations

from collections import OrderedDict

from sidecar.core.ledger.machine import Event, LedgerRecord, enter
from sidecar.core.ledger.values import ExpiredAttempt, LedgerError, UnknownAttempt


class Attempts:
    """The live attempts of one partition's ledger.

    A part of `sidecar.core.ledger.partition.PartitionLedger`, built in its constructor.
    An attempt id is ``topic/partition/offset/epoch.seq``: ``epoch`` tells successive assignments of
    the partition apart (an answer from before a rebalance never matches an attempt made after it) and
    ``seq`` counts the attempts of this one, so an id this ledger issued and retired (``ExpiredAttempt``)
    is told from one it never issued (``UnknownAttempt``).  The live attempts are kept in lock-deadline
    order: the lock duration is constant and ``now_ms`` never decreases, so insertion order is deadline
    order; a renew moves an entry to the end.
    """

    def __init__(self, topic: str, partition: int, epoch: int) -> None:
        self._id_prefix = f"{topic}/{partition}/"
        self._id_epoch = f"/{epoch}."
        self._epoch = epoch
        self.live: OrderedDict[str, LedgerRecord] = OrderedDict()
        self._next_seq = 0
        self.total = 0  # attempts made (a request never sent is not one)

    def issue(self, record: LedgerRecord, deadline_ms: int) -> str:
        """A new attempt of ``record`` (ACQUIRED already), locked until ``deadline_ms``: its id."""
        seq = self._next_seq
        self._next_seq = seq + 1
        attempt_id = f"{self._id_prefix}{record.offset}{self._id_epoch}{seq}"
        record.attempt_id = attempt_id
        record.lock_deadline_ms = deadline_ms
        self.live[attempt_id] = record
        self.total += 1
        return attempt_id

    def renew(self, attempt_id: str, record: LedgerRecord, deadline_ms: int) -> None:
        """The attempt keeps its lock until ``deadline_ms``."""
        record.lock_deadline_ms = deadline_ms
        self.live.move_to_end(attempt_id)

    def retire(self, attempt_id: str, record: LedgerRecord) -> None:
        """The attempt is over (answered, expired, never sent): its id is live no more."""
        del self.live[attempt_id]
        record.attempt_id = None

    def not_sent(self) -> None:
        """The attempt just retired was never sent: it does not count as one."""
        self.total -= 1

    def fence(self) -> None:
        """Revoke: every live attempt's answer is lost."""
        for record in self.live.values():
            enter(record, Event.FENCE)
            record.attempt_id = None
            record.pending = False
        self.live.clear()

    def next_deadline_ms(self) -> int | None:
        """The earliest lock deadline of a live attempt, or None."""
        if self.live:
            return next(iter(self.live.values())).lock_deadline_ms
        return None

    def not_live(self, attempt_id: str) -> LedgerError:
        """Tell an id we issued and retired (expired) from one we never issued (unknown)."""
        prefix = self._id_prefix
        if attempt_id.startswith(prefix):
            offset_text, sep, seq_text = attempt_id[len(prefix) :].partition(self._id_epoch)
            if (
                sep
                and offset_text.isdigit()
                and seq_text.isdigit()
                and int(seq_text) < self._next_seq
            ):
                return ExpiredAttempt(
                    f"attempt {attempt_id} is no longer live (lock expired, superseded, "
                    f"already answered or partition revoked)"
                )
        return UnknownAttempt(f"attempt {attempt_id} was not issued by {prefix}{self._epoch}")
