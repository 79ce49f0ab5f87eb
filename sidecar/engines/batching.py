"""Batch assembly: deliveries into app requests, and requests into the request slots that are free.

Owns :class:`BatchAssembler` (when a batch leaves: full, or its linger over); the pipeline's outlet
adds the deliveries it sends and says when a request is over. A *request slot* is one of the
pipeline's ``app.max.in.flight`` requests open at once (no task: a request starts in the task that
adds its last delivery or the timer's): a batch takes a slot when ``dispatch`` starts its request,
and ``slot_free`` gives the slot back once the request's answer is applied. Must not import either
engine, the pipeline, the ledger, or confluent-kafka.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class _OpenBatch(Generic[T]):
    deadline: float  # trio time: its first record's arrival plus the linger
    items: list[T]


class BatchAssembler(Generic[T]):
    """Deliveries into app requests, and requests into the request slots that are free.

    The rule (``app.mode: batch``): a batch leaves as a request when it holds ``max_records``, or
    ``linger_s`` after its first record arrived, whichever comes first — at once if a request slot
    is free, else as soon as one is. Nothing else delays it: the linger is timed from the record's
    arrival here, one timer task sleeps until the oldest open batch's deadline and only while
    there is one, and a batch never waits for another batch's linger. While every slot is taken,
    a due batch goes on filling up to ``max_records`` (what arrives meanwhile rides along instead
    of forming near-empty batches behind it).

    Records stay here until their batch leaves, so a record waits one linger at most, never the
    lingers of batches ahead of it. Single mode is ``max_records`` 1: every record is a full batch,
    and no timer runs.
    With linger 0 a batch is due at once but leaves after the adding task's next checkpoint, so
    what one hand-out adds in one go shares a request.

    Every method runs in the trio thread; `add` and `slot_free` never block.
    """

    def __init__(
        self,
        max_records: int,
        linger_s: float,
        slots: int,
        dispatch: Callable[[list[T]], None],
    ) -> None:
        self.max_records = max_records
        self.linger_s = linger_s
        self._dispatch = dispatch
        self._free = slots  # request slots neither sending nor given a batch to send
        self._open: deque[_OpenBatch[T]] = deque()
        self._timer_wake = trio.Event()

    @property
    def needs_timer(self) -> bool:
        return self.max_records > 1

    def queued(self) -> int:
        """Records waiting for their batch to leave."""
        return sum(len(b.items) for b in self._open)

    def add(self, item: T) -> None:
        batches = self._open
        if self.max_records == 1 and self._free and not batches:
            self._free -= 1  # single mode with a slot free: straight to it
            self._dispatch([item])
            return
        if batches:
            tail = batches[-1]
            if len(tail.items) < self.max_records:
                tail.items.append(item)
                if len(tail.items) == self.max_records and self._free:
                    self._dispatch_due(trio.current_time())
                return
        if self.max_records == 1:
            batches.append(_OpenBatch(0.0, [item]))
            if self._free:
                self._dispatch_due(0.0)
            return
        batches.append(_OpenBatch(trio.current_time() + self.linger_s, [item]))
        if len(batches) == 1:
            self._timer_wake.set()

    def slot_free(self) -> None:
        """A request finished: its slot takes the oldest due batch, if any."""
        self._free += 1
        batches = self._open
        if not batches:
            return
        if self.max_records == 1:  # single mode: every waiting request is due
            self._free -= 1
            self._dispatch(batches.popleft().items)
        else:
            self._dispatch_due(trio.current_time())

    def _due(self, batch: _OpenBatch[T], now: float) -> bool:
        return len(batch.items) >= self.max_records or now >= batch.deadline

    def _dispatch_due(self, now: float) -> None:
        batches = self._open
        while batches and self._free and self._due(batches[0], now):
            self._free -= 1
            self._dispatch(batches.popleft().items)
        if batches and not self._due(batches[0], now):
            self._timer_wake.set()  # a new oldest batch: the timer sleeps until its deadline

    async def run_timer(self) -> None:
        """Send each batch when its linger is over (the timer task; runs until cancelled)."""
        batches = self._open
        while True:
            now = trio.current_time()
            if not batches or (self._due(batches[0], now) and not self._free):
                # Nothing open, or the oldest batch is due and waits for a slot (`slot_free`
                # sends it): sleep until something is added or a batch left.
                self._timer_wake = trio.Event()
                await self._timer_wake.wait()
            elif self._due(batches[0], now):
                self._dispatch_due(now)
                await trio.lowlevel.checkpoint()
            else:
                await trio.sleep_until(batches[0].deadline)


__all__ = ["BatchAssembler"]
