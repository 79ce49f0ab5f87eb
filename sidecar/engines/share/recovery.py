"""The share engine's account of deaths: counts that leave out what a death charged, and recovery.

Owns `DeathAccount`: a record's count at each acquisition, every outcome (kept in the journal,
`sidecar.engines.share.journal`), and the recovery after a death (told in its docstring). Without a
journal every count is the broker's.

Runs in trio; no Kafka client here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import trio

from sidecar.engines.share.journal import (
    ALONE,
    ANSWERED,
    DEFERRED,
    DONE,
    HELD,
    RELEASED,
    UNSENT,
    Coord,
    Entry,
    ShareJournal,
    counted,
)

log = logging.getLogger("sidecar.share")

# How long a dead member keeps its records at most before their locks start to run (the broker's
# group.share.session.timeout.ms default, 45 s); recovery waits that plus two locks.
DEAD_SESSION_S = 45.0
_LOCK_MAX_S = 60.0  # the broker's default group.share.max.record.lock.duration.ms (until `watch`)

_S = TypeVar("_S")


class DeathAccount:
    """What deaths charged, per record, and the recovery after one.

    The share engine (:mod:`sidecar.engines.share.group`) asks `DeathAccount` for a record's count at
    each acquisition and tells it every outcome; with `share.journal.path` set it keeps them in the
    journal (:mod:`sidecar.engines.share.journal`), so after a death:

    - a record held at the death is delivered again at the count it had, and only one alone at the app
      (an isolation turn) is charged: the counts the sidecar dead-letters on are its own, the broker's
      count only bounds them (the group's limit is raised as far as the broker allows, so the broker's
      extra charges do not archive a record the sidecar still means to deliver);
    - until the records the dead incarnation held are back and settled, one share consumer runs, not
      all: the broker charges a death once per share consumer of the dead process, so a death during
      the isolation pass then charges one acquisition only;
    - a record the dead incarnation held near the group's limit that does not come back within the
      dead members' session and two locks was archived by the broker: logged with its coordinates and
      counted in `dlq_sidecar_broker_archived_without_dlq_total`.
    """

    def __init__(self, group: str, consumers: int, on_archived: Callable[[str], None]) -> None:
        self.group = group
        self.consumers = consumers
        self.journal: ShareJournal | None = None
        self._on_archived = on_archived
        self._unsent: dict[Coord, bool] = {}  # released without an attempt (a suspect?), to note
        self.recovering: dict[Coord, Entry] = {}
        self._dead_consumers = 0
        self._allowance = 0  # see Recovery.allowance; applies until `_allowance_until` (trio time)
        self._allowance_until = 0.0
        self.recovered = trio.Event()
        self.recovered.set()

    async def open(self, path: str) -> None:
        """Read the journal (a thread: file I/O); after a death, recovery starts."""
        journal, recovery = await trio.to_thread.run_sync(
            ShareJournal.open, path, self.group, self.consumers
        )
        if not journal.active:
            return  # logged: counted by the broker, as without a journal
        self.journal = journal
        if recovery.died:
            self._allowance = recovery.allowance
            self._allowance_until = trio.current_time() + DEAD_SESSION_S + 2 * _LOCK_MAX_S
        if recovery.died and recovery.held:
            self.recovering = dict(recovery.held)
            self._dead_consumers = recovery.consumers
            self.recovered = trio.Event()
            log.warning(
                "recovery: one share consumer of %d until the %d records the last incarnation held "
                "are back and settled, so that a death meanwhile charges one acquisition only",
                self.consumers,
                len(self.recovering),
            )

    # ----------------------------------------------------------------------------- counts

    def counts_own(self) -> bool:
        """Whether `count` must see each acquisition (a journal, or a recovery under way); when
        not, the sidecar's count is the broker's and no record is a suspect on its account."""
        return self.journal is not None or bool(self.recovering)

    def count(self, coord: Coord, broker: int) -> tuple[int, bool | None]:
        """The sidecar's count for this acquisition, and whether it is a suspect (a death may have
        ended its last delivery; None: the journal does not know it)."""
        self.recovering.pop(coord, None)
        if self.journal is None:
            return max(1, broker), None
        entry = self.journal.entries.get(coord)
        if entry is None and broker > 1 and trio.current_time() < self._allowance_until:
            # Never seen by this journal, back after a death: fetched by the dead process and never
            # handed to the app (what was is in the journal). Not a suspect; the deaths' charges off.
            return max(1, broker - self._allowance), False
        return counted(entry, broker), None if entry is None else entry.suspect

    def acquired(self, items: Sequence[tuple[Coord, int, int]]) -> None:
        if self.journal is not None:
            self.journal.acquired(items)

    def unsent(self, coord: Coord, *, suspect: bool = False) -> None:
        """This record is released without an attempt: the next acquisition does not count (and a
        suspect stays one)."""
        self._unsent[coord] = suspect

    def alone(self, coords: Iterable[Coord]) -> None:
        """These go to the app alone: a death from now on is theirs."""
        if self.journal is not None:
            self.journal.settled((c, ALONE) for c in coords)

    def answered(self, coord: Coord, released: bool) -> None:
        """The app answered: whatever follows, this record did not kill the sidecar. Written with
        the journal's next write: lost in a death, the record is a suspect, as before."""
        if self.journal is not None:
            self.journal.answered(coord, RELEASED if released else ANSWERED)

    def settle(self, outcomes: Iterable[tuple[Coord, bool]]) -> None:
        """Decided (coordinates, released?), just before the acknowledgements go to the broker.

        A release counts unless the record was released unsent; an accepted or rejected record is
        forgotten only once the broker confirms it (`confirmed`): a death before that must not
        charge it.
        """
        unsent = self._unsent
        if self.journal is None:
            unsent.clear()
            return
        settled: list[tuple[Coord, str]] = []
        entries = self.journal.entries
        for c, released in outcomes:
            was = unsent.pop(c, None)
            if not released:
                if (e := entries.get(c)) is None or e.state != ANSWERED:  # else noted already
                    settled.append((c, ANSWERED))
            else:
                settled.append((c, RELEASED if was is None else DEFERRED if was else UNSENT))
        self.journal.settled(settled)

    def confirmed(self, coords: Iterable[Coord]) -> None:
        """The broker has these acknowledgements: accepted and rejected records are forgotten."""
        if self.journal is not None:
            entries = self.journal.entries
            self.journal.settled(
                (c, DONE)
                for c in coords
                if (e := entries.get(c)) is not None and e.state in (HELD, ALONE, ANSWERED)
            )

    def closed_cleanly(self) -> None:
        if self.journal is not None:
            self.journal.closed_cleanly()

    # ----------------------------------------------------------------------------- recovery

    async def wait_turn(self, index: int, stopping: Callable[[], bool]) -> bool:
        """Consumer `index` may start (False: the sidecar is stopping first). Only the first
        consumer runs while the dead incarnation's records come back."""
        while index and not self.recovered.is_set():
            if stopping():
                return False
            with trio.move_on_after(0.5):
                await self.recovered.wait()
        return not (index and stopping())

    def check(self, suspects_waiting: int) -> None:
        """Recovery is over once every record the dead incarnation held is back and settled."""
        if not self.recovering and not suspects_waiting and not self.recovered.is_set():
            log.info("recovery over: every share consumer polls again")
            self.recovered.set()

    async def watch(self, group_limit: int, lock_ms: int) -> None:
        """End the recovery at the latest when every record the dead incarnation held must have
        come back (the dead members' sessions and two locks): those still missing that were near
        the group's limit were archived by the broker without a DLQ record."""
        wait_s = DEAD_SESSION_S + 2 * lock_ms / 1000
        self._allowance_until = trio.current_time() + wait_s
        with trio.move_on_after(wait_s):
            await self.recovered.wait()
            return
        lost = 0
        for coord, entry in sorted(self.recovering.items()):
            if entry.broker + max(1, self._dead_consumers) < group_limit:
                continue  # the broker still had deliveries to give it: another replica has it
            lost += 1
            self.archived_by_broker(
                coord, entry.broker, f"held when the sidecar died, not back in {wait_s:.0f} s"
            )
        log.info(
            "recovery over after %.0f s: %d records the last incarnation held did not come back "
            "(%d of them near the group's limit)",
            wait_s,
            len(self.recovering),
            lost,
        )
        self.recovering.clear()
        self.recovered.set()

    def archived_by_broker(self, coord: Coord, broker: int, how: str) -> None:
        """A record the sidecar still meant to deliver that the broker archived: no DLQ record."""
        topic, partition, offset = coord
        self._on_archived(topic)
        log.error(
            "%s[%d]@%d: archived by the broker without a DLQ record (%s, at the broker's delivery "
            "count %d, on or near the group's share.delivery.count.limit); it is not in the DLQ",
            topic,
            partition,
            offset,
            how,
            broker,
        )

    def status(self) -> dict[str, Any]:
        return {
            "journal": self.journal is not None and self.journal.active,
            "recovering": len(self.recovering),
        }


__all__ = ["DEAD_SESSION_S", "DeathAccount"]
