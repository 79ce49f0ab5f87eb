"""The DLQ circuit breaker's state machine (sans-IO): when to stop dead-lettering, and when to resume.

Owns `CircuitBreaker` (its states drawn in its docstring), its policy and the frozen values it
returns.

Must not import trio, confluent_kafka, HTTP code or anything that performs I/O, and never reads a
clock.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass

from sidecar.core.errors import SidecarError

__all__ = [
    "BreakerPolicy",
    "BreakerState",
    "BreakerStatus",
    "CircuitBreaker",
    "DeadLetterVerdict",
    "IllegalBreakerCall",
    "Transition",
]

# The window slides in steps of this fraction of its length.
_BUCKETS = 100


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class IllegalBreakerCall(SidecarError):
    """The call does not apply to the breaker's state (e.g. a probe while one is out)."""


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """`errors.deadletterqueue.circuit.breaker.*`, validated (a bad value is a ValueError)."""

    ratio: float = 0.5  # trips when more than this share of the finished records was dead-lettered
    window_ms: int = 300_000
    min_records: int = 5  # ... and at least this many records finished within the window
    cooldown_ms: int = 30_000  # open this long before a probe record goes out

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ratio) and 0.0 <= self.ratio < 1.0):
            raise ValueError(f"ratio must be in [0, 1), got {self.ratio}")
        if self.window_ms < 1:
            raise ValueError(f"window_ms must be >= 1, got {self.window_ms}")
        if self.min_records < 1:
            raise ValueError(f"min_records must be >= 1, got {self.min_records}")
        if self.cooldown_ms < 0:
            raise ValueError(f"cooldown_ms must be >= 0, got {self.cooldown_ms}")

    @property
    def bucket_ms(self) -> int:
        return max(1, self.window_ms // _BUCKETS)

    def over(self, finished: int, dead_lettered: int) -> bool:
        """Whether a window with these counts trips the breaker."""
        return finished >= self.min_records and dead_lettered > self.ratio * finished


@dataclass(frozen=True, slots=True)
class Transition:
    """The breaker changed state: what the caller logs, counts and reacts to."""

    before: BreakerState
    after: BreakerState
    at_ms: int
    reason: str
    finished: int = 0  # the window at the transition
    dead_lettered: int = 0


@dataclass(frozen=True, slots=True)
class DeadLetterVerdict:
    """What to do with a record on its way to the DLQ: write it, or hold it (``write`` False)."""

    write: bool
    transition: Transition | None = None


@dataclass(frozen=True, slots=True)
class BreakerStatus:
    """The breaker for `/v1/status`, readiness and metrics (derived on each call)."""

    state: BreakerState
    since_ms: int  # when it entered this state
    finished: int  # records finished within the window (frozen while not closed)
    dead_lettered: int
    trips: int  # CLOSED -> OPEN transitions so far
    reason: str | None  # why it is not closed
    probe_out: bool
    half_open_at_ms: int | None  # OPEN: when the cool-down ends

    @property
    def observed_ratio(self) -> float | None:
        return self.dead_lettered / self.finished if self.finished else None


class CircuitBreaker:
    """The breaker's state and its sliding window.

    A bad deploy of the app (it rejects everything) or a downstream outage (every record times out)
    would otherwise empty the source topic into the DLQ. The breaker watches the records that
    *finished* -- accepted, or dead-lettered -- over a sliding window, and trips when more than
    ``ratio`` of them were dead-lettered, with at least ``min_records`` finished in the window::

                  dead_letter() over the ratio                  cool-down over (tick)
        CLOSED ─────────────────────────────────▶ OPEN ───────────────────────────────▶ HALF_OPEN
          ▲  ▲                                     ▲ ▲                                   │   │
          │  │                                     │ └──── probe_failed / dead_letter ───┘   │
          │  └────────────── close() (explicit, from OPEN or HALF_OPEN) ───────────────────  │
          └──────────────────────────── probe_succeeded ─────────────────────────────────────┘

    - CLOSED: records go to the app and to the DLQ as usual; ``succeeded`` and ``dead_letter`` feed
      the window. The dead-letter that takes the window over the ratio is *held* (not written): it is
      the first one the breaker no longer trusts.
    - OPEN: every dead-letter is held (the caller keeps the record uncommitted and delivers it again
      after the breaker closes); ``room()`` is 0: no new record goes to the app. ``tick`` moves to
      HALF_OPEN once ``cooldown_ms`` have passed since the breaker opened.
    - HALF_OPEN: ``room()`` is 1 until the caller sends a probe (``probe_sent``); the probe's verdict
      closes (``probe_succeeded``) or re-opens (``probe_failed``) the breaker; a probe with no verdict
      (released for a retry, not reached, its lock expired) is void (``probe_void``) and another may
      go. Any dead-letter while half-open re-opens the breaker and is held.
    - Closing (a probe's success or an explicit ``close``) empties the window: the held records get a
      fresh chance, and the dead-letters that tripped the breaker must not trip it again at once.

    The window slides in steps (buckets) of 1 % of ``window_ms``, so it holds at most 101 buckets
    whatever the throughput; a record finished at time t counts while its bucket is within the window.
    While the breaker is not closed, the window is frozen: ``status`` shows what tripped it.

    Inputs are method calls with the caller's clock (``now_ms``, monotonic milliseconds; a clock that
    steps back is read as the last value seen); outputs are small frozen values (:class:`Transition`,
    :class:`DeadLetterVerdict`, :class:`BreakerStatus`). An illegal call raises
    :class:`IllegalBreakerCall` and leaves the breaker unchanged.
    """

    def __init__(self, policy: BreakerPolicy, now_ms: int) -> None:
        self.policy = policy
        self._now = now_ms
        self._state = BreakerState.CLOSED
        self._since = now_ms
        self._reason: str | None = None  # why it is not closed (status, readiness)
        self._trip_reason: str | None = None  # why it last left CLOSED
        self._probe_out = False
        self._trips = 0
        # (bucket index, finished, dead-lettered), oldest first; the sums are kept beside.
        self._buckets: deque[list[int]] = deque()
        self._finished = 0
        self._dead = 0

    # -- inputs ----------------------------------------------------------------------------------

    def succeeded(self, now_ms: int, count: int = 1) -> None:
        """`count` records finished without the DLQ (accepted). Counted only while closed."""
        now = self._tick_clock(now_ms)
        if self._state is BreakerState.CLOSED and count > 0:
            self._add(now, failed=False, count=count)

    def dead_letter(self, now_ms: int) -> DeadLetterVerdict:
        """A record is on its way to the DLQ: write it, or hold it (and maybe trip or re-open)."""
        now = self._tick_clock(now_ms)
        state = self._state
        if state is BreakerState.OPEN:
            return DeadLetterVerdict(write=False)
        if state is BreakerState.HALF_OPEN:
            return DeadLetterVerdict(
                write=False,
                transition=self._enter(
                    BreakerState.OPEN, now, "a record was dead-lettered while half-open"
                ),
            )
        self._prune(now)
        if not self.policy.over(self._finished + 1, self._dead + 1):
            self._add(now, failed=True)
            return DeadLetterVerdict(write=True)
        # This dead-letter trips it: held, but shown in the window that tripped it.
        self._add(now, failed=True)
        self._trips += 1
        p = self.policy
        reason = (
            f"{self._dead} of the {self._finished} records finished within {p.window_ms} ms were "
            f"dead-lettered (more than {p.ratio:.0%}, at least {p.min_records} finished)"
        )
        return DeadLetterVerdict(
            write=False, transition=self._enter(BreakerState.OPEN, now, reason)
        )

    def tick(self, now_ms: int) -> Transition | None:
        """OPEN → HALF_OPEN once the cool-down is over; None when nothing changed."""
        now = self._tick_clock(now_ms)
        if self._state is not BreakerState.OPEN or now < self._since + self.policy.cooldown_ms:
            return None
        return self._enter(
            BreakerState.HALF_OPEN,
            now,
            f"half-open after a cool-down of {self.policy.cooldown_ms} ms: one probe record",
        )

    def room(self) -> int | None:
        """How many more records may go to the app now: None (no limit), 1 (a probe) or 0."""
        if self._state is BreakerState.CLOSED:
            return None
        if self._state is BreakerState.HALF_OPEN and not self._probe_out:
            return 1
        return 0

    def probe_sent(self, now_ms: int) -> None:
        """The probe record went to the app (HALF_OPEN with no probe out only)."""
        self._tick_clock(now_ms)
        if self.room() != 1:
            raise IllegalBreakerCall(
                f"no probe may go now (state {self._state.value}, probe out: {self._probe_out})"
            )
        self._probe_out = True

    def probe_succeeded(self, now_ms: int) -> Transition:
        """The probe was accepted: the breaker closes."""
        now = self._tick_clock(now_ms)
        self._require_probe()
        return self._enter(BreakerState.CLOSED, now, "the probe record was accepted")

    def probe_failed(self, now_ms: int) -> Transition:
        """The probe is on its way to the DLQ: open again for another cool-down."""
        now = self._tick_clock(now_ms)
        self._require_probe()
        return self._enter(BreakerState.OPEN, now, "the probe record was dead-lettered")

    def probe_void(self, now_ms: int) -> None:
        """The probe ended with no verdict (a retry, not reached, lock expired): another may go."""
        self._tick_clock(now_ms)
        self._require_probe()
        self._probe_out = False

    def close(self, now_ms: int, reason: str) -> Transition | None:
        """Close from OPEN or HALF_OPEN (an operator's call); None when closed already."""
        now = self._tick_clock(now_ms)
        if self._state is BreakerState.CLOSED:
            return None
        return self._enter(BreakerState.CLOSED, now, reason)

    # -- outputs ---------------------------------------------------------------------------------

    @property
    def state(self) -> BreakerState:
        return self._state

    def next_deadline_ms(self) -> int | None:
        """OPEN: when ``tick`` moves to HALF_OPEN; None otherwise."""
        if self._state is BreakerState.OPEN:
            return self._since + self.policy.cooldown_ms
        return None

    def status(self, now_ms: int) -> BreakerStatus:
        if self._state is BreakerState.CLOSED:
            self._prune(self._tick_clock(now_ms))
        return BreakerStatus(
            state=self._state,
            since_ms=self._since,
            finished=self._finished,
            dead_lettered=self._dead,
            trips=self._trips,
            reason=self._reason,
            probe_out=self._probe_out,
            half_open_at_ms=self.next_deadline_ms(),
        )

    # -- internals -------------------------------------------------------------------------------

    def _require_probe(self) -> None:
        if self._state is not BreakerState.HALF_OPEN or not self._probe_out:
            raise IllegalBreakerCall(f"no probe is out (state {self._state.value})")

    def _enter(self, state: BreakerState, now: int, reason: str) -> Transition:
        before = self._state
        transition = Transition(before, state, now, reason, self._finished, self._dead)
        self._state = state
        self._since = now
        self._probe_out = False
        if state is BreakerState.CLOSED:
            self._reason = self._trip_reason = None
            self._buckets.clear()
            self._finished = self._dead = 0
        elif before is BreakerState.CLOSED:
            self._reason = self._trip_reason = reason
        else:  # HALF_OPEN, or OPEN again after a failed probe
            self._reason = f"{reason}; first tripped because {self._trip_reason}"
        return transition

    def _tick_clock(self, now_ms: int) -> int:
        self._now = max(self._now, now_ms)
        return self._now

    def _add(self, now: int, *, failed: bool, count: int = 1) -> None:
        index = now // self.policy.bucket_ms
        buckets = self._buckets
        if buckets and buckets[-1][0] == index:
            bucket = buckets[-1]
        else:
            # A new bucket: drop those that left the window, so it holds at most 101 buckets
            # whatever the mix (only a dead-letter's decision needs it pruned to the moment).
            self._prune(now)
            bucket = [index, 0, 0]
            buckets.append(bucket)
        bucket[1] += count
        self._finished += count
        if failed:
            bucket[2] += 1
            self._dead += 1

    def _prune(self, now: int) -> None:
        """Drop the buckets that left the window: those more than window_ms old."""
        oldest = (now - self.policy.window_ms) // self.policy.bucket_ms
        buckets = self._buckets
        while buckets and buckets[0][0] <= oldest:
            _, finished, dead = buckets.popleft()
            self._finished -= finished
            self._dead -= dead
