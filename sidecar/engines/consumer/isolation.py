"""The consumer-group engine's isolation passes (horizon mode): the scheduler's exclusivity step.

Owns `IsolationStep` (a part of `ConsumerGroupEngine`): a suspect goes out alone in the whole
process, so a death charges only the isolated record; the ledger keeps each partition's pass
(`sidecar.core.ledger.horizon`), this step the other partitions. The scheduler calls `step` at the
start of each turn; an isolated record leaves once its count is committed.

Must not import the pipeline, the share engine, or confluent-kafka.
"""

from __future__ import annotations

import logging

from sidecar.core import ledger as L
from sidecar.engines.consumer.partitions import PartitionRef, Partitions, PartitionState
from sidecar.engines.consumer.ports import CommitWanted, SourcePort
from sidecar.engines.interfaces import Outlet

log = logging.getLogger("sidecar.engine")


class IsolationStep:
    """The isolation step of :class:`~sidecar.engines.consumer.group.ConsumerGroupEngine`."""

    def __init__(
        self,
        outlet: Outlet[PartitionRef],
        source: SourcePort,
        partitions: Partitions,
        committer: CommitWanted,
    ) -> None:
        self._outlet = outlet
        self._source = source
        self._states = partitions.by_key
        self._committer = committer

    def step(self, now: int) -> bool:
        """Horizon mode: run the isolation passes; True while no partition may acquire.

        The exclusivity rule the ledger cannot see: while any partition's suspect is ready,
        charged, in flight or settling, nothing is acquired anywhere (a death must charge only
        the isolated record), and a suspect is isolated only with nothing in flight in the whole
        process and no other partition's isolated outcome waiting for its commit.
        """
        blocking = False
        candidates: list[PartitionState] = []
        for state in self._states.values():
            if state.suspect_top is None:
                continue
            ledger = state.ledger
            if not ledger.statistics().isolation_active:
                if state.in_pass:
                    self._pass_over(state)
                if ledger.committable_offset() > state.suspect_top:
                    state.suspect_top = None  # every suspect is done: nothing more to isolate
                continue
            status = ledger.horizon_status()
            if not state.in_pass and status.pass_active:
                state.in_pass = True
                log.info(
                    "isolation pass on %s[%d]: %d suspects (records that may have been in flight "
                    "at an unclean stop) delivered one at a time",
                    ledger.topic,
                    ledger.partition,
                    status.suspects_left,
                )
            elif state.in_pass and not status.pass_active:
                self._pass_over(state)
            phase = status.isolation
            if phase is L.IsolationPhase.WAITING or phase is L.IsolationPhase.NONE:
                continue
            blocking = True
            if ledger.wants_isolation and not state.revoking:
                candidates.append(state)
        if not blocking:
            return False
        # Commits are on the isolated records' path: keep the poll thread's timeouts short.
        self._source.mark_busy()
        room = self._outlet.room()
        idle = room.in_flight == 0 and room.sending == 0
        if not candidates or not idle or not room.app_reachable or room.draining:
            return True
        if room.send_room <= 0:
            return True  # pull mode with no poll waiting: charge a suspect only for a poll
        if room.breaker_room == 0:
            return True  # the DLQ circuit breaker is open (or its probe is out)
        for state in candidates:
            others_busy = any(
                o is not state
                and o.ledger.horizon_status().isolation
                in (L.IsolationPhase.CHARGED, L.IsolationPhase.IN_FLIGHT, L.IsolationPhase.SETTLING)
                for o in self._states.values()
            )
            if others_busy:
                continue
            if any(o.ledger.in_flight for o in self._states.values()):
                break
            state.ledger.isolate(now)
            self._committer.want_commit()
            break
        return True

    def _pass_over(self, state: PartitionState) -> None:
        state.in_pass = False
        status = state.ledger.horizon_status()
        log.info(
            "isolation pass over on %s[%d]: %d suspects, %d isolated deliveries; normal delivery",
            state.ledger.topic,
            state.ledger.partition,
            status.suspects_total,
            status.isolated_total,
        )


__all__ = ["IsolationStep"]
