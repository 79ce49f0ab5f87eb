"""The consumer engine's flow control: which partitions fetch, and which are paused.

:class:`FlowControl` is a part of :class:`~sidecar.engines.consumer.group.ConsumerGroupEngine`,
built by it with the source's pause and resume (`SourcePort`), the partitions, the byte budget
(`sidecar.core.budget`) and the ledgers' limits. A partition pauses when its ledger says so
(`should_pause`: records, bytes, locks, metadata) or intake is closed (draining, the app away, the
DLQ circuit breaker open), and resumes with hysteresis (`may_resume`). It owns what it decided
last of each partition (`PartitionState.flow_seen`). Must not import the pipeline, the share
engine, or confluent-kafka.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from collections.abc import Set as AbstractSet

from sidecar.core import ledger as L
from sidecar.core.budget import ByteBudget
from sidecar.engines.consumer.partitions import PartitionRef, Partitions, PartitionState
from sidecar.engines.consumer.ports import SourcePort
from sidecar.engines.interfaces import Counters, Outlet, PartitionKey

log = logging.getLogger("sidecar.engine")


class FlowControl:
    """Pause and resume of fetching per partition (see the module docstring)."""

    def __init__(
        self,
        outlet: Outlet[PartitionRef],
        source: SourcePort,
        partitions: Partitions,
        budget: ByteBudget,
        ledger_config: L.LedgerConfig,
        counters: Counters,
        *,
        tier_topics: AbstractSet[str] = frozenset(),
    ) -> None:
        """`tier_topics`: the retry tiers' topics, whose partitions pause while nothing is due."""
        self._outlet = outlet
        self._source = source
        self._states = partitions.by_key
        self._budget = budget
        self._ledger_config = ledger_config
        self._counters = counters
        self._tier_topics = tier_topics
        self._flow_shared: tuple[int, bool, int] | None = None  # see apply

    def apply(self, busy: Sequence[PartitionState] | None = None) -> None:
        """Pause or resume fetching per partition. With ``busy`` (a scheduler turn's partitions
        that changed), only those and the ones a decision is pending for are looked at, unless
        the conditions every partition shares (its byte share, intake closed) changed."""
        to_pause: list[PartitionKey] = []
        to_resume: list[PartitionKey] = []
        room = self._outlet.room()
        intake_closed = room.draining or not room.app_reachable or room.breaker_open
        # Each assigned partition's share of the byte budget. A partition over it is paused, and
        # resumed at half of it; what was fetched is always taken (`sidecar.core.budget.ByteBudget`),
        # so a record larger than a share is delivered and the partition resumes once it is done.
        share = self._budget.share_bytes(len(self._source.assigned) or len(self._states))
        source_paused = self._source.paused
        shared = (share, intake_closed, len(self._states))
        if busy is None or shared != self._flow_shared:
            self._flow_shared = shared
            looked_at = list(self._states.items())
        else:
            # An unchanged partition under unchanged shared conditions decides what it decided
            # (`flow_seen`): only the changed ones, and those with a decision not yet applied.
            looked_at = [((s.ledger.topic, s.ledger.partition), s) for s in busy]
            looked_at += [
                ((s.ledger.topic, s.ledger.partition), s)
                for s in self._states.values()
                if s.flow_seen is None and s not in busy
            ]
        for key, state in looked_at:
            paused = key in source_paused
            # The same ledger under the same conditions decides the same: nothing to do again.
            seen = (state.ledger.changes, share, intake_closed, paused)
            if state.flow_seen == seen:
                continue
            decided = len(to_pause) + len(to_resume)
            if intake_closed:
                if not paused:
                    to_pause.append(key)
            elif not paused and state.ledger.should_pause(share):
                to_pause.append(key)
                st = state.ledger.statistics()
                lc = self._ledger_config
                if (
                    st.buffered < lc.max_buffered_records
                    and st.buffered_bytes < share
                    and st.in_flight < lc.max_record_locks
                ):
                    if key[0] in self._tier_topics:
                        # The normal state of a retry tier: what it holds is not due yet.
                        log.debug(
                            "retry tier %s[%d]: %d records wait for their due time; read on "
                            "when the first is due",
                            key[0],
                            key[1],
                            st.buffered,
                        )
                    else:
                        # Neither record limit: the delivery state nears offset.metadata.max.bytes.
                        self._counters.metadata_pauses += 1
                        log.warning(
                            "pausing %s[%d]: its delivery state nears offset.metadata.max.bytes",
                            key[0],
                            key[1],
                        )
            elif paused and state.ledger.may_resume(share):
                to_resume.append(key)
            # Remembered only when it decided nothing: a pause or resume is looked at again
            # until the source has applied it.
            state.flow_seen = seen if len(to_pause) + len(to_resume) == decided else None
        if to_pause:
            self._source.pause(to_pause)
        if to_resume:
            self._source.resume(to_resume)


__all__ = ["FlowControl"]
