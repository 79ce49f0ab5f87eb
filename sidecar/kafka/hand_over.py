"""The poll thread's hand-over of batches to trio's thread (a part of `KafkaSource`).

Owns `HandOver`: the batches handed over and not yet taken (with their values' bytes), the thread's
end, the one wake-up of trio queued for them, the backpressure that holds the thread while more than
`HANDED_OVER_MAX_BYTES` wait, and what the listener raised while taking them.
Must not import the ledger, the engines or the HTTP modules.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque

import trio
from confluent_kafka import Message

from sidecar.kafka.source_port import PollEnd, SourceListener

# The poll thread polls again before the listener has taken what it handed over only while that is
# at most this many bytes of values: a record at a time at ordinary rates, so trio need not wake
# the thread after each one; otherwise at most one batch (plus this) is outside librdkafka's queue
# and the ledgers, which the byte budget bounds, as when the thread waited for every batch.
HANDED_OVER_MAX_BYTES = 64 * 1024


class HandOver:
    """Batches from the poll thread to trio's thread, in order, then the thread's end.

    Everything is under one plain lock (entered from C, not through the condition's Python
    methods); the condition on it holds the poll thread while it has handed over too much
    (`wait_room`). `put` runs on the poll thread; `take`, `woken` and `start` on trio's thread.
    """

    def __init__(self, listener: SourceListener) -> None:
        self._listener = listener
        self._items: deque[tuple[list[Message], int]] = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._full = False  # the poll thread waits for room
        self._queued = False  # a wake-up of trio is queued that will take what is handed over
        self.end: PollEnd | None = None  # the thread's end, once handed over
        self.error: BaseException | None = None  # what the listener raised
        self.ended = trio.Event()  # an end or a listener error, for the poll loop
        self.stopping = False  # trio left the poll loop (cancelled): the thread ends too

    def start(self) -> None:
        """Before the poll thread starts (trio's thread)."""
        self.end = None
        self.error = None
        self.ended = trio.Event()
        self.stopping = False
        with self._lock:
            self._queued = False

    def stop(self) -> None:
        """The poll loop is left: the thread ends, also when it waits for room."""
        with self._cond:
            self.stopping = True
            self._cond.notify()

    def wait_room(self, timeout_s: float) -> None:
        """Poll thread: wait while more than HANDED_OVER_MAX_BYTES are handed over (or a stop)."""
        with self._cond:
            while self._bytes > HANDED_OVER_MAX_BYTES and not self.stopping:
                self._full = True
                self._cond.wait(timeout_s)
            self._full = False

    def put(self, token: trio.lowlevel.TrioToken, item: list[Message] | PollEnd, size: int) -> None:
        """One poll's records (or the thread's end) to trio: one append, and one wake-up unless
        one is queued already (at saturation many polls share a wake-up)."""
        with self._lock:
            if isinstance(item, list):
                self._items.append((item, size))
                self._bytes += size
            else:
                self.end = item
            if self._queued:
                return
            self._queued = True
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(self.woken)

    def woken(self) -> None:
        """The poll thread's wake-up (trio's thread, via `run_sync_soon`): take what it handed."""
        with self._lock:
            # Cleared before taking: a batch handed over from now on queues a wake-up of its own.
            self._queued = False
        self.take()

    def take(self) -> None:
        """Give the batches handed over so far to the listener (trio's thread, synchronously);
        then, once the thread's end came and nothing precedes it, wake the poll loop to end."""
        lock = self._lock
        taken = False
        while self.error is None:
            with lock:
                if not self._items:
                    break
                batch, size = self._items.popleft()
            try:
                self._listener.on_messages(batch)
            # A bug in the listener: the poll loop raises it, as it would have from its own call.
            except BaseException as exc:
                self.error = exc
                self.ended.set()
                return
            taken = True
            # Only now is the batch in the listener's accounting (the ledgers' byte budget).
            with lock:
                self._bytes -= size
                if self._full:
                    self._cond.notify()
        if taken:
            try:
                self._listener.messages_taken()
            except BaseException as exc:
                self.error = exc
                self.ended.set()
                return
        with lock:
            ended = self.end is not None and not self._items
        if ended:
            self.ended.set()


__all__ = ["HANDED_OVER_MAX_BYTES", "HandOver"]
