"""Who holds a listener's connection slots, and whom to close to make room: sans-IO, no clock.

Owns `Seating`: the seats (waiting, reading, busy) of one listener's connections, per peer and in
all, and the choice of the connection to close for a new one (told in its docstring); the server owns
the sockets, the timers and the closing. Every operation is O(1); callers pass the time.

Imports only the standard library.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["UNIX_PEER", "Seat", "SeatState", "Seating"]

UNIX_PEER = "unix"


class SeatState(enum.Enum):
    WAITING = "waiting"
    READING = "reading"
    BUSY = "busy"


@dataclass(eq=False, slots=True)
class Seat:
    """One admitted connection. ``evicted`` is set when :meth:`Seating.admit` chose it to make room:
    its owner must close it (it no longer counts against any cap)."""

    peer: str
    since: float  # when it entered its state
    state: SeatState = SeatState.WAITING
    evicted: bool = False
    seated: bool = True


class _Queues:
    """Seats waiting and reading, each in the order they entered that state (oldest first)."""

    __slots__ = ("count", "reading", "waiting")

    def __init__(self) -> None:
        self.count = 0
        self.waiting: OrderedDict[Seat, None] = OrderedDict()
        self.reading: OrderedDict[Seat, None] = OrderedDict()

    def queue(self, state: SeatState) -> OrderedDict[Seat, None] | None:
        if state is SeatState.WAITING:
            return self.waiting
        if state is SeatState.READING:
            return self.reading
        return None

    def oldest(self) -> Seat | None:
        """Of the longest waiting and the longest reading seat, the one there first."""
        waiting = next(iter(self.waiting), None)
        reading = next(iter(self.reading), None)
        if waiting is None or reading is None:
            return waiting or reading
        return waiting if waiting.since <= reading.since else reading


class Seating:
    """The seats of one listener.

    A listener takes at most ``max_connections`` connections, and at most ``max_per_peer`` from one
    peer (a TCP client's IP address; every Unix-socket client is one peer, ``unix``, and the per-peer
    cap does not apply to it). A connection is in one of three states::

        waiting  no byte of a request yet: a new connection, or a keep-alive one between requests
        reading  part of a request has arrived, not all of it
        busy     a handler runs for it, or its response is being written

    When a new connection finds its peer at its cap, or the listener full, it is not refused: one
    connection is closed to make room for it (a full listener makes room rather than refusing a
    probe: docs/security.md). The victim is, within the peer when the peer is at its cap, else among all,
    the connection that has gone longest without a request answered: of the one waiting longest
    and the one reading a request for longest, whichever entered its state first. Busy connections
    are never closed; when every one is busy, the new connection is refused (503).

    So a flood of idle or slow connections, from one peer or many, only ever pushes out its own
    oldest members: a probe (a fresh connection that sends its request at once) is the newest
    connection in the room and is answered in the time it takes. Callers pass the time (``now``).
    """

    def __init__(self, max_connections: int, max_per_peer: int) -> None:
        if max_connections < 1 or max_per_peer < 1:
            raise ValueError("max_connections and max_per_peer must be at least 1")
        self.max_connections = max_connections
        self.max_per_peer = max_per_peer
        self._all = _Queues()
        self._peers: dict[str, _Queues] = {}

    @property
    def count(self) -> int:
        """Seated connections."""
        return self._all.count

    @property
    def peers(self) -> int:
        """Peers with at least one seated connection."""
        return len(self._peers)

    def admit(self, peer: str, now: float) -> tuple[Seat | None, Seat | None]:
        """Seat a new connection from ``peer``: ``(seat, evicted)``.

        ``evicted`` is the connection to close to make room (already unseated, marked
        ``evicted``), or None. ``seat`` is None when there was no room and nobody to evict:
        refuse the connection.
        """
        held = self._peers.get(peer)
        scope: _Queues | None = None
        if peer != UNIX_PEER and held is not None and held.count >= self.max_per_peer:
            scope = held
        elif self._all.count >= self.max_connections:
            scope = self._all
        victim: Seat | None = None
        if scope is not None:
            victim = scope.oldest()
            if victim is None:
                return None, None
            self.leave(victim)
            victim.evicted = True
            held = self._peers.get(peer)
        seat = Seat(peer, now)
        if held is None:
            held = self._peers[peer] = _Queues()
        for queues in (self._all, held):
            queues.count += 1
            queues.waiting[seat] = None
        return seat, victim

    def enter(self, seat: Seat, state: SeatState, now: float) -> None:
        """``seat`` is now in ``state`` (entering the state it is in restarts its clock)."""
        if not seat.seated:
            return
        seat.since = now
        for queues in (self._all, self._peers[seat.peer]):
            old = queues.queue(seat.state)
            if old is not None:
                old.pop(seat, None)
            new = queues.queue(state)
            if new is not None:
                new[seat] = None
        seat.state = state

    def leave(self, seat: Seat) -> None:
        """The connection is closed (or evicted): free its seat. Idempotent."""
        if not seat.seated:
            return
        seat.seated = False
        held = self._peers[seat.peer]
        for queues in (self._all, held):
            queues.count -= 1
            queues.waiting.pop(seat, None)
            queues.reading.pop(seat, None)
        if not held.count:
            del self._peers[seat.peer]
