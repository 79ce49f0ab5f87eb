"""The pipeline's outlet: the one object an adapter is given of the pipeline (the `Outlet` interface).

Owns `PipelineOutlet`: the deliveries handed to `send` whose request has not finished, the app's
reachability (`Reachability`), and the way out it was built with (live deliveries, the batch
assembler or pull mode's queue, the breaker's gate, the DLQ step, the pipeline's `PipelineFlags`).
It calls no adapter: what an adapter hears comes from the pipeline.

Must not import either engine, the ledger, or confluent-kafka.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from sidecar.core.deadletter import ArchiveOutcome
from sidecar.core.outcome import ArchiveReason, ErrorInfo
from sidecar.core.record import LiveIds, Tracked
from sidecar.engines.batching import BatchAssembler
from sidecar.engines.breaker_gate import BreakerGate
from sidecar.engines.dlq_step import DlqStep
from sidecar.engines.interfaces import Counters, Delivery, DlqSink, Room, Until
from sidecar.engines.pull import PullQueue
from sidecar.kafka.source import SourceError


@dataclass(slots=True)
class PipelineFlags:
    """The pipeline's shutdown state, as `Outlet.room` reports it (changed by the pipeline only)."""

    draining: bool = False
    stopping: bool = False
    intake_stopped: bool = False
    failure: str | None = None
    dlq_ready: bool = False


class Reachability:
    """Whether the app is reachable: the answers say when it is not, the probe when it is back."""

    __slots__ = ("_back", "down_since", "reachable")

    def __init__(self) -> None:
        self.reachable = True
        self.down_since: float | None = None  # time.monotonic() it went away
        self._back = trio.Event()  # set while the app is reachable
        self._back.set()

    def lost(self) -> bool:
        """Not reachable; whether that is news."""
        if not self.reachable:
            return False
        self.reachable = False
        self.down_since = time.monotonic()
        self._back = trio.Event()
        return True

    def back(self) -> None:
        self.reachable = True
        self.down_since = None
        self._back.set()

    async def wait(self, deadline: float) -> bool:
        """Wait (until the trio time `deadline`) for the app to be reachable; whether it is."""
        if self.reachable:
            return True
        with trio.move_on_at(deadline):
            await self._back.wait()
        return self.reachable


class PipelineOutlet:
    """The `Outlet` an adapter is given."""

    def __init__(
        self,
        live: LiveIds[Delivery[Any]],
        counters: Counters,
        flags: PipelineFlags,
        reachability: Reachability,
        *,
        batches: BatchAssembler[Delivery[Any]],
        pull: PullQueue | None,
        send_capacity: int,
        gate: BreakerGate | None,
        dlq_step: DlqStep,
        fail: Callable[[str], None],
        registry: Reachability | None = None,
    ) -> None:
        self._live = live
        self._counters = counters
        self._flags = flags
        self._reachability = reachability
        self._batches = batches
        self._pull = pull
        # Deliveries the open requests can carry at once (push mode; see `room`).
        self._send_capacity = send_capacity
        self._gate = gate
        self._dlq_step = dlq_step
        self._fail = fail
        # The schema registry's reachability (records with schemas): intake waits for it as for the app.
        self._registry = registry
        self.sending = 0  # deliveries handed over by `send` whose request has not finished

    # ------------------------------------------------------------------------- the Outlet face

    def issue(
        self, tracked: Tracked, delivery_count: int, ref: Any, *, lock_deadline: float | None = None
    ) -> Delivery[Any]:
        """A new live attempt (see `Outlet.issue`). With the breaker half-open, the first one
        issued is its probe."""
        delivery = self._live.issue(
            lambda i: Delivery(i, tracked, delivery_count, ref, lock_deadline=lock_deadline)
        )
        gate = self._gate
        if gate is not None and gate.half_open:
            gate.issued(delivery)
        return delivery

    def send(self, delivery: Delivery[Any]) -> None:
        """Hand a delivery to the app: it leaves in the next request (batch mode: see
        :class:`~sidecar.engines.batching.BatchAssembler` for when); pull mode: to the polls
        (:class:`~sidecar.engines.pull.PullQueue`)."""
        if self._pull is not None:
            self._pull.put(delivery)
            return
        self.sending += 1
        self._batches.add(delivery)

    def retire(self, delivery: Delivery[Any]) -> None:
        """The attempt is over (expired, fenced, not sent): its id answers `expired` from now on."""
        self._live.retire(delivery.id, delivery)
        gate = self._gate
        if gate is not None and gate.probe is delivery:
            gate.retired(delivery)

    def lock_expired(self, topic: str, delivery: Delivery[Any] | None, outcome: str) -> None:
        """No answer in time (`lock_expired`), or none before the sidecar stopped (`abandoned`)."""
        if delivery is not None:
            self.retire(delivery)
        self._counters.outcome(topic, outcome)

    async def dead_letter(
        self,
        tracked: Tracked,
        delivery_count: int,
        reason: ArchiveReason,
        error: ErrorInfo | None,
        *,
        consequence: str,
        sink: DlqSink,
        may_hold: bool = True,
    ) -> ArchiveOutcome:
        return await self._dlq_step.dead_letter(
            tracked,
            delivery_count,
            reason,
            error,
            consequence=consequence,
            sink=sink,
            may_hold=may_hold,
        )

    def room(self) -> Room:
        flags, gate = self._flags, self._gate
        pull = self._pull
        registry = self._registry
        # A closed breaker (the usual state) limits nothing: its plain field, not its calls.
        if gate is None or gate.closed:
            breaker_open, breaker_room = False, None
        else:
            breaker_open, breaker_room = gate.open, gate.room()
        return Room(
            self._reachability.reachable and (registry is None or registry.reachable),
            flags.draining,
            flags.stopping,
            flags.intake_stopped,
            flags.failure is not None,
            flags.dlq_ready,
            breaker_open,
            len(self._live),
            self.sending,
            # Free request capacity (push mode), or what the waiting polls still take (pull
            # mode: records are acquired only for a poll).
            pull.demand() if pull is not None else self._send_capacity - self.sending,
            breaker_room,
        )

    async def wait(self, until: Until, deadline: float) -> bool:
        if until is Until.BREAKER_ROOM:
            # At once when the breaker is closed or disabled.
            return True if self._gate is None else await self._gate.wait_room(deadline)
        pull = self._pull
        if until is Until.APP_REACHABLE or pull is None:
            reachable = await self._reachability.wait(deadline)
            if reachable and self._registry is not None:
                reachable = await self._registry.wait(deadline)
            return reachable
        with trio.move_on_at(deadline):
            await pull.wait_demand()
        return pull.demand() > 0

    async def run_source(self, poll: Callable[[], Awaitable[None]]) -> None:
        try:
            await poll()
        except SourceError as exc:
            self._fail(str(exc))

    # ------------------------------------------------------------------------- the pipeline's

    def request_done(self, n: int) -> None:
        """A request carrying `n` deliveries finished (answered, or given up)."""
        self.sending -= n
        self._batches.slot_free()


__all__ = ["PipelineFlags", "PipelineOutlet", "Reachability"]
