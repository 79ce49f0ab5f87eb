"""The share consumers' side of status and readiness (:mod:`sidecar.engines.share_group`).

No Kafka client here: the consumers run on the engine's threads; this holds what status, readiness
and the stop sequence read and set.
"""

from __future__ import annotations

from typing import Protocol

import trio

PartitionKey = tuple[str, int]


class _PipeState(Protocol):
    @property
    def draining(self) -> bool: ...
    @property
    def app_reachable(self) -> bool: ...


class _Consumers(Protocol):
    """What this reads of the share engine (an interface, so the engine's module is not imported)."""

    @property
    def pipe(self) -> _PipeState: ...
    async def run_consumers(self) -> None: ...
    def abandon_batches(self, *, hard: bool = False) -> None: ...


class ShareSource:
    """The share consumers' side of status and readiness.

    A share consumer has no assignment the client can see; `assigned` holds the partitions records came
    from, and `paused` is all of them while intake is stopped (app unreachable, draining).
    """

    def __init__(self, engine: _Consumers) -> None:
        self._engine = engine
        self.assigned: set[PartitionKey] = set()
        self.broker_ok = True
        self.subscribed = False
        self.fatal_error: str | None = None
        self._stop_polling = False
        self._stopped = trio.Event()

    @property
    def paused(self) -> set[PartitionKey]:
        pipe = self._engine.pipe
        if pipe.draining or not pipe.app_reachable or self._stop_polling:
            return set(self.assigned)
        return set()

    @property
    def stop_requested(self) -> bool:
        return self._stop_polling

    async def run(self) -> None:
        try:
            await self._engine.run_consumers()
        finally:
            self._stopped.set()

    def stop_polling(self) -> None:
        self._stop_polling = True

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def close(self, grace_s: float = 30.0) -> None:
        """The consumers close on their own threads once polling stops; wait for that.

        DLQ writes still retrying after `grace_s` are cut short: their records are released.
        """
        self._stop_polling = True
        self._engine.abandon_batches()
        with trio.move_on_after(grace_s):
            await self._stopped.wait()
            return
        self._engine.abandon_batches(hard=True)
        await self._stopped.wait()


__all__ = ["ShareSource"]
