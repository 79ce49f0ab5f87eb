"""The share engine's isolation of suspects (a part of `ShareGroupEngine`): one at a time, alone.

Owns `Isolation`: how many suspects wait (no consumer acquires meanwhile), the isolation turns
(one suspect at the app with nothing else the sidecar holds unsettled, never past the lock) and
how long a turn takes. Which records are suspects is `KnownOutcomes`'s
(`sidecar.engines.share.known`); their answers are decided by `Decisions`, through ports.

Must not import the ledger, the consumer engine, or confluent-kafka.
"""

from __future__ import annotations

import functools
import logging
import math

import trio

from sidecar.core.outcome import Ack
from sidecar.engines.interfaces import Outlet
from sidecar.engines.share.batch import Acquired, Batch, SuspectRun, coordinates
from sidecar.engines.share.ports import Batches, ConsumerFlags, Deaths, Deciding
from sidecar.kafka.message import Message
from sidecar.kafka.share import Step

log = logging.getLogger("sidecar.share")

ISOLATION_POLL_S = 0.02  # how often a waiting suspect checks that nothing else is unsettled


class Isolation:
    """The isolation of :class:`~sidecar.engines.share.group.ShareGroupEngine`'s suspects."""

    def __init__(
        self,
        outlet: Outlet[Acquired],
        source: ConsumerFlags,
        deaths: Deaths,
        batches: Batches,
        decisions: Deciding,
    ) -> None:
        self._outlet = outlet
        self._source = source
        self._deaths = deaths
        self._batches = batches
        self._decisions = decisions
        # The suspects acquired and not yet settled; set once none waits.
        self._suspects_waiting = 0
        self._over = trio.Event()
        self._over.set()
        self._lock = trio.Lock()
        self.isolated_deliveries = 0
        self._runs = 0  # batches whose suspects wait for (or have) an isolation turn
        self._turn_s = 0.05  # how long one turn takes (the app's answer and the flush)

    @property
    def waiting(self) -> int:
        """The suspects acquired and not yet settled (no new acquisitions meanwhile)."""
        return self._suspects_waiting

    def found(self, n: int) -> None:
        """`n` suspects acquired in a batch: they wait for their turns."""
        if not self._suspects_waiting:
            self._over = trio.Event()
            log.warning(
                "isolation: %d records acquired again whose last delivery ended without an "
                "outcome (the sidecar died, or its lock expired): each goes to the app alone",
                n,
            )
        self._suspects_waiting += n

    def done(self, n: int) -> None:
        """`n` suspects settled (or released unsent, or cut short at a stop)."""
        self._suspects_waiting -= n
        if self._suspects_waiting <= 0:
            self._suspects_waiting = 0
            self._over.set()
            self._deaths.check(self._suspects_waiting)

    async def wait_over(self) -> bool:
        """Wait (up to 0.5 s) until no suspect waits; True when none does."""
        with trio.move_on_after(0.5):
            await self._over.wait()
        return not self._suspects_waiting

    async def next_suspect(self, run: SuspectRun) -> Step:
        """Deliver the batch's next suspect, alone: nothing else the sidecar holds is unsettled.

        Every other record's outcome has reached the broker, and no consumer polls, so a death now
        charges this record and the suspects still waiting only; the journal (if any) notes it alone
        first, so that the next incarnation charges it and not them. One at a time, never past the
        lock: the suspects that cannot have their turn before it expires (a turn takes about
        `_turn_s`, and the batches with suspects take turns) are released unsent at once, not held
        meanwhile; they come back as suspects (the journal does not count that release).
        """
        outlet = self._outlet
        decisions: list[tuple[Message, Ack]] = []
        done = False
        self._runs += 1
        try:
            async with self._lock:
                quiet = False
                with trio.move_on_at(run.deadline):
                    while not self._source.stop_requested and not outlet.room().stopping:
                        if not self._batches.delivering and not self._source.unflushed(
                            besides=run.consumer
                        ):
                            quiet = True
                            break
                        await trio.sleep(ISOLATION_POLL_S)
                fit, take = len(run.remaining), 1
                turns = (run.deadline - trio.current_time()) / (self._turn_s * max(1, self._runs))
                if not quiet:
                    fit = 0
                elif self._deaths.journal is None:
                    # No journal: a release unsent is charged as surely as a death, so the fewest
                    # at a time that still fit in the lock rather than releases.
                    take = max(1, math.ceil(len(run.remaining) / max(1.0, turns)))
                else:
                    fit = math.floor(turns)
                if fit < len(run.remaining):
                    # Stopping, or no turn left for these before the lock expires: release them
                    # undelivered now (they stay suspects for whoever acquires them next).
                    keep = max(0, fit)
                    decisions = [(m, Ack.RELEASE) for m, _t, _c in run.remaining[keep:]]
                    for m, _t, _c in run.remaining[keep:]:
                        self._deaths.unsent(coordinates(m), suspect=True)
                    if quiet:
                        log.info(
                            "isolation: %d suspects released unsent (no turn left within the "
                            "lock); they come back as suspects",
                            len(decisions),
                        )
                    del run.remaining[keep:]
                    done = not run.remaining
                    next_ = None if done else functools.partial(self.next_suspect, run)
                    return self._decisions.step(decisions, flush=True, next=next_)
                chunk, run.remaining[:take] = run.remaining[:take], []
                self._deaths.alone(coordinates(m) for m, _t, _c in chunk)
                batch = Batch(run.consumer, run.deadline)
                ds = [
                    outlet.issue(
                        t, c, Acquired(m, batch, coordinates(m)), lock_deadline=run.deadline
                    )
                    for m, t, c in chunk
                ]
                batch.expect(len(ds))
                self._batches.add(batch)
                self.isolated_deliveries += len(ds)
                started = trio.current_time()
                try:
                    with batch.hard:
                        await self._decisions.wait_answers(batch, ds)
                        async with trio.open_nursery() as nursery:
                            self._decisions.decide_all(nursery, ds, decisions)
                finally:
                    self._batches.discard(batch)
                    for d in ds:
                        outlet.retire(d)
                took = trio.current_time() - started + ISOLATION_POLL_S
                # Up at once, down slowly: a slow answer must not leave the next ones past the lock.
                self._turn_s = max(took, 0.5 * self._turn_s + 0.5 * took)
            done = not run.remaining
            return self._decisions.step(
                decisions,
                flush=True,
                next=None if done else functools.partial(self.next_suspect, run),
            )
        except BaseException:
            done = True
            raise
        finally:
            self._runs -= 1
            if done:
                self.done(run.total)
                self._batches.release(run.held)


__all__ = ["ISOLATION_POLL_S", "Isolation"]
