"""Pull mode (``app.mode: pull``): the queue between the adapters' intake and `GET /v1/records`.

Owns :class:`PullQueue` (which poll gets which delivery, and what a cancelled poll gives back);
the outlet puts deliveries in (``PipelineOutlet.send``) and ``Pipeline.pull`` takes them for the API.
Must not import either engine, the pipeline, the ledger, or confluent-kafka.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from sidecar.core.errors import SidecarError
from sidecar.engines.interfaces import Delivery


class NotPullMode(SidecarError):
    """`GET /v1/records` on a sidecar that pushes records to the app (app.mode single/batch)."""


@dataclass(slots=True, eq=False)
class _PullWaiter:
    room: int  # how many more deliveries this poll takes
    items: list[Delivery[Any]] = field(default_factory=list)
    got: trio.Event = field(default_factory=trio.Event)


class PullQueue:
    """``app.mode: pull``: deliveries wait here for ``GET /v1/records`` instead of an app request.

    Demand drives intake: :meth:`demand` is what the waiting polls still take, minus what is
    queued, and the consumer-group engine acquires no more than that (``Room.send_room``), so
    a record is acquired — its delivery counted and its lock started — only for a poll that is
    waiting for it, and the queue stays bounded by the polls' ``max``. A share group acquires
    whole broker batches when a poll waits (``Outlet.wait(Until.INTAKE_OPEN)``); what the poll does
    not take waits here for the next one, under the broker's lock.

    Each delivery goes to exactly one poll: `put` gives it to the oldest poll with room (or the
    queue), and a poll takes what the queue holds first. A poll that is cancelled before it
    returned (shutdown, or its client closed the connection) gives its deliveries back, in
    order and uncounted, to the polls still waiting, then to the front of the queue; it wants
    nothing more. Every method runs in the trio thread; `put` never blocks.
    """

    def __init__(self) -> None:
        self._queued: deque[Delivery[Any]] = deque()
        self._waiters: deque[_PullWaiter] = deque()
        self._demand = trio.Event()  # set while a poll waits

    def queued(self) -> int:
        return len(self._queued)

    def waiting(self) -> int:
        return len(self._waiters)

    def demand(self) -> int:
        return max(0, sum(w.room for w in self._waiters) - len(self._queued))

    async def wait_demand(self) -> None:
        await self._demand.wait()

    def release_waiters(self) -> None:
        """Shutdown: every waiting poll returns now, with what it has (usually nothing)."""
        for waiter in self._waiters:
            waiter.room = 0
            waiter.got.set()

    def put(self, delivery: Delivery[Any]) -> None:
        for waiter in self._waiters:
            if waiter.room > 0:
                waiter.items.append(delivery)
                waiter.room -= 1
                waiter.got.set()
                return
        self._queued.append(delivery)

    async def take(
        self,
        max_records: int,
        wait_s: float,
        live: Callable[[Delivery[Any]], bool],
        wake: Callable[[], None],
    ) -> list[Delivery[Any]]:
        """Up to `max_records` live deliveries; waits up to `wait_s` for the first one.

        `live` drops what expired while it was queued; `wake` tells the engine there is demand.
        """
        out: list[Delivery[Any]] = []
        queued = self._queued
        while queued and len(out) < max_records:
            d = queued.popleft()
            if live(d):
                out.append(d)
        if out or wait_s <= 0:
            return out
        waiter = _PullWaiter(max_records)
        self._waiters.append(waiter)
        self._demand.set()
        try:
            wake()
            with trio.move_on_after(wait_s):
                while not waiter.items and waiter.room > 0:
                    await waiter.got.wait()
            return [d for d in waiter.items if live(d)]
        except BaseException:
            # Cancelled before the response was built (shutdown, or the client closed the
            # connection): nothing was handed out, so nothing was counted as an attempt.
            self._waiters.remove(waiter)
            self._give_back(waiter.items)
            waiter.items = []
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            if not self._waiters:
                self._demand = trio.Event()

    def _give_back(self, items: list[Delivery[Any]]) -> None:
        """A cancelled poll's deliveries, in order: to the polls still waiting with room (oldest
        first, as `put` does), the rest to the front of the queue."""
        rest = deque(items)
        for waiter in self._waiters:
            while rest and waiter.room > 0:
                waiter.items.append(rest.popleft())
                waiter.room -= 1
                waiter.got.set()
        self._queued.extendleft(reversed(rest))


__all__ = ["NotPullMode", "PullQueue"]
