"""What the share engine remembers of the records it let go (a part of `ShareGroupEngine`).

Owns `KnownOutcomes`: the records this process released (acquired again, they are not suspects:
their last outcome is known) and those the DLQ circuit breaker held (acquired again past the
limit, they go to the app once more rather than to the DLQ). Both bounded, oldest forgotten first.
Plain data, no client calls.

Must not import the ledger, the consumer engine, or confluent-kafka.
"""

from __future__ import annotations

from sidecar.engines.share.batch import coordinates
from sidecar.engines.share.ports import Coord
from sidecar.kafka.message import Message

KNOWN_OUTCOMES_MAX = 100_000  # records released by this process, remembered until acquired again
HELD_REMEMBERED = 100_000  # how many held records the share engine remembers


class KnownOutcomes:
    """Records released by this process, and records the DLQ circuit breaker held."""

    def __init__(
        self, known_max: int = KNOWN_OUTCOMES_MAX, held_max: int = HELD_REMEMBERED
    ) -> None:
        self._known_max = known_max
        self._held_max = held_max
        self._known: dict[Coord, None] = {}
        # Records the DLQ circuit breaker held (released to the broker instead of dead-lettered),
        # by (topic, partition, offset): acquired again past the limit, they go to the app once
        # more rather than to the DLQ at acquisition.
        self._held: dict[Coord, None] = {}

    def is_suspect(self, topic: str, partition: int, offset: int, count: int) -> bool:
        """Acquired again, and this process did not see its last delivery end (a release, a lock
        timeout): that delivery's outcome was lost — in a death, possibly caused by this record."""
        if count <= 1:
            return False
        known = self._known
        coord = (topic, partition, offset)
        if coord in known:  # released here: its outcome is known, and forgotten now
            del known[coord]
            return False
        return True

    def outcome_known(self, msg: Message) -> None:
        """Released by this process: when it comes back, its count holds no unknown outcome."""
        known = self._known
        known[coordinates(msg)] = None
        if len(known) > self._known_max:
            del known[next(iter(known))]

    def remember_held(self, topic: str, partition: int, offset: int) -> None:
        self._held[(topic, partition, offset)] = None
        if len(self._held) > self._held_max:
            del self._held[next(iter(self._held))]

    def holds_any(self) -> bool:
        """Whether the breaker held any record (none: `take_held` is False for every record)."""
        return bool(self._held)

    def take_held(self, coord: Coord) -> bool:
        """Whether the breaker held `coord` (acquired again now: forgotten)."""
        was_held = coord in self._held
        self._held.pop(coord, None)
        return was_held


__all__ = ["HELD_REMEMBERED", "KNOWN_OUTCOMES_MAX", "KnownOutcomes"]
