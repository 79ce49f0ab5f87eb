"""A TCP fault proxy on loopback (no `tc netem` here): pass, latency, blackhole, reset.

It runs its own trio loop in a background thread, so a test may block its own thread (confluent-kafka calls)
without stalling the traffic it proxies. Modes apply to bytes in both directions:

- ``pass``: forward as is;
- ``latency``: hold every chunk `latency_s` before forwarding;
- ``blackhole``: connections stay open but nothing moves (bytes are held, new connections are accepted and
  stall) — what a dead peer behind a firewall looks like; when the mode ends, held bytes flow again;
- ``reset``: close every connection with RST and refuse new ones until the mode changes;
- ``blackhole-produce``: blackhole only connections on which a producer request was seen (the proxy frames
  the client's Kafka requests), so a sidecar's DLQ producer stalls while its consumer carries on;
- ``hold-end-txn``: the first connection that sends an EndTxn request (a transaction's commit or abort)
  after the mode is set is held from that request on, both ways, while every other connection (new ones
  too) passes: the coordinator never gets that EndTxn, and a client that gives up on it (a transactional
  producer replaced by one with the same transactional.id) reaches the coordinator on a new connection.
  When the mode changes, the held connection is reset and its held bytes are dropped, never delivered.

Clients learn broker addresses from metadata, so a proxy sees all of a client's traffic only when the broker
advertises the proxy's port (tests/faults/broker.py does).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from typing import Any

import trio

PASS, LATENCY, BLACKHOLE, RESET = "pass", "latency", "blackhole", "reset"
# Blackhole only the connections of Kafka producers: the DLQ unavailable while the consumer carries on.
BLACKHOLE_PRODUCE = "blackhole-produce"
# Hold the first EndTxn request sent after the mode is set (and its connection): see the module docstring.
HOLD_END_TXN = "hold-end-txn"

# Request API keys only a producer sends: Produce, InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
# EndTxn, TxnOffsetCommit. A connection that sent one is a producer's (librdkafka never shares one).
_PRODUCER_API_KEYS = frozenset({0, 22, 24, 25, 26, 28})
_END_TXN_API_KEY = 26


class _Conn:
    """What the proxy knows of one client connection: the API keys of the requests it sends, framed as the
    bytes pass (each request is a 4-byte size and its body, which begins with the 2-byte api key), in O(1)
    memory; whether it is a producer's; and whether it is held for its EndTxn (hold-end-txn)."""

    def __init__(self) -> None:
        self.producer = False
        self.held = False
        self._head = bytearray()  # the first bytes of the request under way (up to 6)
        self._skip = 0  # the bytes of the request under way still to pass by

    def feed(self, data: bytes) -> list[int]:
        """The api keys of the requests whose first 6 bytes complete in `data`."""
        out: list[int] = []
        i, n = 0, len(data)
        while i < n:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                continue
            take = data[i : i + 6 - len(self._head)]
            self._head += take
            i += len(take)
            if len(self._head) < 6:
                break
            size = int.from_bytes(self._head[:4], "big", signed=True)
            out.append(int.from_bytes(self._head[4:6], "big", signed=True))
            self._head.clear()
            self._skip = max(0, size - 2)
        if not self.producer and any(k in _PRODUCER_API_KEYS for k in out):
            self.producer = True
        return out


class FaultProxy:
    def __init__(self, upstream: tuple[str, int], listen_port: int = 0) -> None:
        self.upstream = upstream
        self.mode = PASS
        self.latency_s = 0.0
        self.port = listen_port
        self.connections = 0
        # Chunks of a producer's requests held back (blackhole-produce): more than zero since the mode
        # was set means the fault is in effect (a producer tried to send and is stalled).
        self.held_producer_chunks = 0
        # Connections held for their EndTxn request (hold-end-txn) since the mode was set: 0 or 1.
        self.end_txn_held = 0
        self._end_txn_armed = False
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._changed: trio.Event | None = None
        self._streams: set[trio.SocketStream] = set()
        self._error: BaseException | None = None

    # -- control (any thread) ----------------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._thread_main, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"proxy did not start: {self._error}")
        if self._error is not None:
            raise RuntimeError(f"proxy did not start: {self._error}")
        return self

    def set_mode(self, mode: str, latency_s: float = 0.0) -> None:
        assert mode in (PASS, LATENCY, BLACKHOLE, RESET, BLACKHOLE_PRODUCE, HOLD_END_TXN), mode
        assert self._token is not None
        trio.from_thread.run_sync(self._apply, mode, latency_s, trio_token=self._token)

    def close(self) -> None:
        if self._token is not None and self._stop is not None:
            # run_sync_soon, not from_thread: close() may be called from another trio loop's thread.
            with contextlib.suppress(trio.RunFinishedError):
                self._token.run_sync_soon(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the proxy's own trio loop -----------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:  # reported to start(); the thread just ends
            self._error = exc
            self._ready.set()

    def _apply(self, mode: str, latency_s: float) -> None:
        self.mode, self.latency_s = mode, latency_s
        self.held_producer_chunks = 0
        self.end_txn_held = 0
        self._end_txn_armed = mode == HOLD_END_TXN
        if mode == RESET:
            for stream in list(self._streams):
                _abort(stream)
            self._streams.clear()
        assert self._changed is not None
        self._changed.set()
        self._changed = trio.Event()

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        self._changed = trio.Event()
        listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, self._handle, listeners)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def _held(self, conn: _Conn) -> bool:
        if conn.held:
            return True
        return self.mode in (BLACKHOLE, RESET) or (self.mode == BLACKHOLE_PRODUCE and conn.producer)

    async def _wait_flowing(self, conn: _Conn) -> None:
        """Return when bytes may move; raise when the connection must die (reset)."""
        while self._held(conn):
            if self.mode == RESET:
                raise trio.BrokenResourceError("reset by the fault proxy")
            if conn.held and self.mode != HOLD_END_TXN:
                raise trio.BrokenResourceError("the held EndTxn is dropped with its connection")
            assert self._changed is not None
            await self._changed.wait()

    def _watch_end_txn(self, conn: _Conn, keys: list[int]) -> None:
        """In hold-end-txn, hold this connection if `keys` (the requests it just began) hold the first
        EndTxn request since the mode was set."""
        if self.mode == HOLD_END_TXN and self._end_txn_armed and _END_TXN_API_KEY in keys:
            self._end_txn_armed = False
            conn.held = True
            self.end_txn_held += 1

    async def _handle(self, client: trio.SocketStream) -> None:
        if self.mode == RESET:
            _abort(client)
            return
        try:
            upstream = await trio.open_tcp_stream(*self.upstream)
        except OSError:
            _abort(client)
            return
        self.connections += 1
        conn = _Conn()
        self._streams.update((client, upstream))
        try:
            async with trio.open_nursery() as nursery:

                async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                    try:
                        while True:
                            data = await src.receive_some(65536)
                            if not data:
                                break
                            if src is client:
                                keys = conn.feed(data)
                                if conn.producer and self._held(conn):
                                    self.held_producer_chunks += 1
                                self._watch_end_txn(conn, keys)
                            await self._wait_flowing(conn)
                            if self.mode == LATENCY and self.latency_s > 0:
                                await trio.sleep(self.latency_s)
                            await self._wait_flowing(conn)
                            await dst.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        pass
                    # One side ended: end both, so the peer sees it.
                    nursery.cancel_scope.cancel()

                nursery.start_soon(pump, client, upstream)
                nursery.start_soon(pump, upstream, client)
        finally:
            self._streams.difference_update((client, upstream))
            for s in (client, upstream):
                if self.mode == RESET or conn.held:
                    _abort(s)
                else:
                    with trio.CancelScope(shield=True):
                        await s.aclose()


def _abort(stream: trio.SocketStream) -> None:
    """Close with RST (SO_LINGER 0), as a crashed peer or a firewall reject would."""
    try:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stream.socket.close()
    except OSError:
        pass
