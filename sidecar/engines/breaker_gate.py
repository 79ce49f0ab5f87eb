"""The pipeline's side of the DLQ circuit breaker: what it holds, its probe, its timer, its status.

Owns `BreakerGate`: the pure `sidecar.core.breaker.CircuitBreaker` and what around it needs trio
(told in its docstring). All of it runs in the trio thread, between two awaits; it calls no adapter.

Must not import either engine, the pipeline, the ledger, or confluent-kafka.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import trio

from sidecar.config import Config
from sidecar.core.breaker import BreakerPolicy, BreakerState, CircuitBreaker, Transition
from sidecar.engines.interfaces import Delivery, Settled

log = logging.getLogger("sidecar.engine")  # the engine's messages, whichever adapter runs


def breaker_for(config: Config) -> CircuitBreaker | None:
    """`errors.deadletterqueue.circuit.breaker.*` (see sidecar.core.breaker); None: disabled."""
    dlq = config.errors.dlq
    if not dlq.circuit_breaker_enable:
        return None
    policy = BreakerPolicy(
        ratio=dlq.circuit_breaker_ratio,
        window_ms=dlq.circuit_breaker_window_ms,
        min_records=dlq.circuit_breaker_min_records,
        cooldown_ms=dlq.circuit_breaker_cooldown_ms,
    )
    return CircuitBreaker(policy, 0)  # may be built before trio runs


class BreakerGate:
    """One enabled circuit breaker between the pipeline and the DLQ.

    Owns the :class:`~sidecar.core.breaker.CircuitBreaker` (pure: the decisions) and everything around
    it that needs trio: the half-open probe (the first delivery issued while half-open), the cool-down
    timer task, the events the adapters wait on for room, and the log line of each transition. The
    pipeline and its outlet tell it what happens (`issued`, `retired`, `answered`, `admits` for a
    record on its way to the DLQ); it tells whoever built it that it moved (`on_change`, given to its
    constructor: a transition, or None when only its room changed), and the pipeline tells the adapter
    what follows (held records may go, intake changed, wake). It calls no adapter.
    """

    def __init__(
        self,
        breaker: CircuitBreaker,
        on_change: Callable[[Transition | None], None],
    ) -> None:
        self.breaker = breaker
        self._on_change = on_change
        # Read by the outlet to skip `issued`/`retired` on the record's path; written here only.
        self.probe: Delivery[Any] | None = None  # the half-open probe (its attempt)
        self._changed = trio.Event()  # the timer re-reads the breaker's deadline
        self._moved = trio.Event()  # set (and replaced) whenever `room` may change
        self._since_wall = time.time()  # when it entered its state (wall clock)
        self.held = 0  # dead-letters held (counted once per hold)
        # The per-record path reads plain fields: whether it is closed (no limit on room, acceptances
        # count), whether the next attempt issued is the probe (half-open), and the acceptances not
        # yet in the window. These go in once a bucket (the timer), and before any verdict or status
        # reads the window. Written here only (at a transition).
        self.closed = breaker.state is BreakerState.CLOSED
        self.half_open = breaker.state is BreakerState.HALF_OPEN
        self._accepted = 0
        self._timer_asleep = False  # the timer waits for the next acceptance
        self._fold_s = breaker.policy.bucket_ms / 1000

    # -- what the pipeline tells it -----------------------------------------------------------

    def issued(self, delivery: Delivery[Any]) -> None:
        """A new attempt: with the breaker half-open, the first one issued is its probe."""
        if self.half_open and self.breaker.room() == 1:
            self.breaker.probe_sent(_now_ms())
            self.probe = delivery

    def retired(self, delivery: Delivery[Any]) -> None:
        """An attempt is over without an answer that counts (expired, fenced, not sent)."""
        if delivery is self.probe:
            self._probe_ended(None)

    def answered(self, delivery: Delivery[Any], settled: Settled) -> None:
        """An answer that ends an attempt, as the adapter decided it: the probe's verdict, or an
        accepted record counted."""
        if delivery is self.probe:
            self._probe_ended(settled)
        elif settled is Settled.ACCEPTED and self.closed:
            self._accepted += 1
            if self._timer_asleep:
                self._timer_asleep = False
                self._changed.set()

    def admits(self) -> bool:
        """A record is on its way to the DLQ: whether to write it (False: hold it)."""
        now = _now_ms()
        self._fold(now)
        verdict = self.breaker.dead_letter(now)
        if verdict.transition is not None:
            self.transition(verdict.transition)
        if not verdict.write:
            self.held += 1
        return verdict.write

    # -- what the adapters and the API see ----------------------------------------------------

    def room(self) -> int | None:
        """How many more records may go to the app now: None (no limit), 1 (a probe) or 0."""
        return self.breaker.room()

    @property
    def open(self) -> bool:
        """Open (not half-open): intake stops."""
        return self.breaker.state is BreakerState.OPEN

    async def wait_room(self, deadline: float) -> bool:
        """Wait (until the trio time `deadline`) for the breaker to let a record out; whether it
        does (at once when it is closed)."""
        with trio.move_on_at(deadline):
            while self.breaker.room() == 0:
                await self._moved.wait()
        return self.breaker.room() != 0

    def close(self, reason: str) -> bool:
        """Close the breaker (the control API); False when it was closed already."""
        transition = self.breaker.close(_now_ms(), reason)
        if transition is None:
            return False
        self.probe = None
        self.transition(transition)
        return True

    def status(self) -> dict[str, Any]:
        """The breaker and its window for `/v1/status` and the API."""
        now = _now_ms()
        self._fold(now)
        st = self.breaker.status(now)
        policy = self.breaker.policy
        ratio = st.observed_ratio
        return {
            "state": st.state.value,
            "since": _iso(self._since_wall),
            "reason": st.reason,
            "finished": st.finished,
            "dead_lettered": st.dead_lettered,
            "ratio": None if ratio is None else round(ratio, 4),
            "trips": st.trips,
            "held": self.held,
            "probe_out": st.probe_out,
            "half_open_in_ms": None
            if st.half_open_at_ms is None
            else max(0, st.half_open_at_ms - now),
            "policy": {
                "ratio": policy.ratio,
                "window_ms": policy.window_ms,
                "min_records": policy.min_records,
                "cooldown_ms": policy.cooldown_ms,
            },
        }

    # -- state changes --------------------------------------------------------------------------

    def _probe_ended(self, settled: Settled | None) -> None:
        """The probe's attempt is over: accepted closes, on its way to the DLQ re-opens, else
        (redelivered, or no answer) void."""
        self.probe = None
        now = _now_ms()
        if settled is Settled.ACCEPTED:
            self.transition(self.breaker.probe_succeeded(now))
        elif settled is Settled.DEAD_LETTERED:
            self.transition(self.breaker.probe_failed(now))
        else:
            self.breaker.probe_void(now)
            self._room_changed()
            self._on_change(None)

    def _fold(self, now_ms: int) -> None:
        """The acceptances counted since the last fold go into the window (at `now_ms`: at most a
        bucket late, which the window's buckets round to anyway)."""
        if self._accepted:
            count, self._accepted = self._accepted, 0
            self.breaker.succeeded(now_ms, count)

    def _room_changed(self) -> None:
        self._moved.set()
        self._moved = trio.Event()

    def transition(self, t: Transition) -> None:
        """Log it (one line when it trips, one when it closes), and say so (`on_change`)."""
        self.probe = None  # any state change ends the probe: its answer no longer counts
        self._since_wall = time.time()
        self.closed = t.after is BreakerState.CLOSED
        self.half_open = t.after is BreakerState.HALF_OPEN
        self._accepted = 0  # counted while closed only, and folded before any trip
        self._changed.set()
        self._room_changed()
        if t.before is BreakerState.CLOSED:
            log.warning(
                "DLQ circuit breaker open: %s; dead-lettering and intake stop, held records stay "
                "uncommitted; a probe record in %d ms",
                t.reason,
                self.breaker.policy.cooldown_ms,
            )
        elif t.after is BreakerState.CLOSED:
            log.warning(
                "DLQ circuit breaker closed (%s): held records go to the app again", t.reason
            )
        elif t.after is BreakerState.HALF_OPEN:
            log.info("DLQ circuit breaker %s", t.reason)
        else:
            log.info("DLQ circuit breaker still open: %s", t.reason)
        self._on_change(t)

    async def run_timer(self) -> None:
        """Half-open once the cool-down is over (the breaker says when), and the acceptances into
        the window once a bucket while there are any (the timer task)."""
        while True:
            self._changed = trio.Event()
            deadline = self.breaker.next_deadline_ms()
            if deadline is None:
                if self._accepted:
                    with trio.move_on_after(self._fold_s):
                        await self._changed.wait()
                    self._fold(_now_ms())
                else:
                    self._timer_asleep = True
                    await self._changed.wait()
                    self._timer_asleep = False
                continue
            with trio.move_on_after(max(0.0, (deadline - _now_ms()) / 1000)):
                await self._changed.wait()
            transition = self.breaker.tick(_now_ms())
            if transition is not None:
                self.transition(transition)


def _now_ms() -> int:
    # The breaker's clock: trio's (monotonic; the cool-down timer sleeps on it too).
    return int(trio.current_time() * 1000)


def _iso(wall_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall_s))


__all__ = ["BreakerGate", "breaker_for"]
