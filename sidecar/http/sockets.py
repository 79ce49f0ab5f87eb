"""The listening side of the HTTP server: sockets, accepting, and idle connections' first byte.

Owns what :mod:`sidecar.http.server` does with sockets below HTTP: opening a Unix-socket listener
(removing a stale socket file first), accepting connections in bursts, telling whose connection
it is (the peer), and waiting for an idle connection's first byte outside trio's own epoll set
(:class:`IdleWatch`). Knows nothing of HTTP. Imports :mod:`sidecar.http.seating` only.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import logging
import math
import os
import select
import socket
import stat
from collections.abc import Awaitable, Callable

import trio

from sidecar.http.seating import UNIX_PEER

__all__ = ["IdleWatch", "accept_loop", "open_unix_listener", "peer_of"]

log = logging.getLogger(__name__)

_ACCEPT_BURST = 256
_ACCEPT_TRANSIENT = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})
_ACCEPT_CAPACITY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class IdleWatch:
    """Waits for the first byte of many idle connections, at no cost to trio's other work.

    Why not ``receive_some`` with a deadline on each: trio asks the kernel for up to as many
    events as it has descriptors registered, on every turn of its loop, and keeps every deadline
    in one heap that each cancel scope of the delivery path pushes into; 5,000 idle connections
    waiting that way made every turn about a fifth dearer. Here an idle connection is registered
    in this watcher's own epoll set, whose descriptor is the only one trio waits on for all of
    them, and its deadline in this watcher's own heap, of which trio sees only the earliest. A
    connection leaves when its client sends a byte (or closes) or its deadline passes, and reads
    through trio from then on.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._waiting: dict[int, _Idle] = {}
        self._deadlines: list[tuple[float, int, _Idle]] = []
        self._seq = 0
        self._sleep: trio.CancelScope | None = None

    def close(self) -> None:
        self._epoll.close()

    async def run(self) -> None:
        while True:
            deadline = self._deadlines[0][0] if self._deadlines else math.inf
            with trio.CancelScope(deadline=deadline) as self._sleep:
                await trio.lowlevel.wait_readable(self._epoll.fileno())
            self._sleep = None
            for fd, _ in self._epoll.poll(0, 256):
                idle = self._waiting.get(fd)
                if idle is not None:
                    idle.readable = True
                    self._leave(fd, idle)
            now = trio.current_time()
            while self._deadlines and self._deadlines[0][0] <= now:
                _, _, idle = heapq.heappop(self._deadlines)
                if not idle.event.is_set():
                    self._leave(idle.fd, idle)  # timed out: readable stays False

    async def wait_readable(self, stream: trio.abc.Stream, deadline: float) -> bool:
        """True once ``stream`` has a byte (or EOF) to read, False at ``deadline``."""
        if not isinstance(stream, trio.SocketStream):
            return True  # not a socket: its receive_some waits
        fd = stream.socket.fileno()
        ready = select.poll()
        ready.register(fd, select.POLLIN | select.POLLRDHUP)
        if ready.poll(0):
            return True  # already there (a fresh request, the next pipelined one, an EOF)
        idle = self._waiting[fd] = _Idle(fd)
        self._seq += 1
        heapq.heappush(self._deadlines, (deadline, self._seq, idle))
        if self._sleep is not None and deadline < self._sleep.deadline:
            self._sleep.deadline = deadline
        try:
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP)
            await idle.event.wait()
            return idle.readable
        finally:
            if not idle.event.is_set():  # cancelled (the connection was closed to make room)
                self._leave(fd, idle)

    def _leave(self, fd: int, idle: _Idle) -> None:
        idle.event.set()
        if self._waiting.get(fd) is idle:
            del self._waiting[fd]
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)
        if len(self._deadlines) > 2 * len(self._waiting) + 64:
            # Entries of connections that left early: drop them now and then (bounded heap).
            self._deadlines = [e for e in self._deadlines if not e[2].event.is_set()]
            heapq.heapify(self._deadlines)


class _Idle:
    __slots__ = ("event", "fd", "readable")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.event = trio.Event()
        self.readable = False


async def accept_loop(
    listener: trio.SocketListener,
    nursery: trio.Nursery,
    serve_one: Callable[[trio.SocketStream], Awaitable[None]],
) -> None:
    """Accept connections in bursts of up to :data:`_ACCEPT_BURST` per wake-up.

    ``trio.serve_listeners`` accepts one connection per turn of the scheduler; with thousands of
    connections trickling bytes a turn takes long, the kernel's accept queue fills and a probe's
    SYN is dropped (the client retries after 1 s, then 2 s...). Accepting what is queued at once
    keeps the queue short, and the room (not the queue) decides who stays.
    """
    sock = listener.socket
    # A second descriptor for the same listening socket: accepted from without a trio checkpoint
    # per connection, while trio waits on the first.
    raw = socket.socket(sock.family, sock.type, fileno=os.dup(sock.fileno()))
    raw.setblocking(False)
    try:
        while True:
            await trio.lowlevel.wait_readable(sock)
            for _ in range(_ACCEPT_BURST):
                try:
                    conn, _ = raw.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    if exc.errno in _ACCEPT_TRANSIENT:
                        continue  # that client is gone already
                    if exc.errno not in _ACCEPT_CAPACITY:
                        raise
                    log.error("accept failed: %s; retrying in 0.1 s", os.strerror(exc.errno))
                    await trio.sleep(0.1)
                    break
                nursery.start_soon(
                    serve_one, trio.SocketStream(trio.socket.from_stdlib_socket(conn))
                )
    finally:
        raw.close()


def peer_of(stream: trio.SocketStream, via_unix: bool) -> str:
    """Whose connection this is, for the per-peer cap and the cut log: the client's IP address
    over TCP; every Unix-socket client is one peer."""
    if via_unix:
        return UNIX_PEER
    try:
        return str(stream.socket.getpeername()[0])
    except OSError:
        return "unknown"  # reset before we asked


async def open_unix_listener(path: str, backlog: int) -> trio.SocketListener:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise FileExistsError(errno.EEXIST, "exists and is not a socket", path)
        probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody answers: a leftover from a process that died
        else:
            raise OSError(errno.EADDRINUSE, "a live server already listens on", path)
        finally:
            probe.close()
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(path)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)
