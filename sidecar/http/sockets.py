"""The listening side of the HTTP server: sockets, accepting, and idle connections' first byte.

Owns what :mod:`sidecar.http.server` does with sockets below HTTP: opening a Unix-socket listener
(removing a stale socket file first), accepting connections in bursts, telling whose connection
it is (the peer), and waiting for an idle connection's first byte outside trio's own epoll set
(:class:`IdleWatch`). Knows nothing of HTTP. Imports :mod:`sidecar.http.room` only.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import stat
from collections.abc import Awaitable, Callable

import trio

from sidecar.http.room import UNIX_PEER

__all__ = ["IdleWatch", "accept_loop", "open_unix_listener", "peer_of"]

log = logging.getLogger(__name__)

_ACCEPT_BURST = 256
_ACCEPT_TRANSIENT = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})
_ACCEPT_CAPACITY = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class IdleWatch:
    """Waits for the first byte of many idle connections with one descriptor in trio's epoll.

    Why not ``receive_some`` on each: trio asks the kernel for up to as many events as it has
    descriptors registered, on every turn of its loop, so 5,000 idle connections, each with a
    task waiting to read, made every turn (and so the delivery path) about a fifth dearer. An idle
    connection is instead registered in this watcher's own epoll set, whose descriptor is the only
    one trio waits on for all of them; a connection leaves the set when its client sends a byte
    (or closes), and reads through trio from then on.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._ready: dict[int, trio.Event] = {}

    def close(self) -> None:
        self._epoll.close()

    async def run(self) -> None:
        while True:
            await trio.lowlevel.wait_readable(self._epoll.fileno())
            for fd, _ in self._epoll.poll(0, 256):
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)
                event = self._ready.pop(fd, None)
                if event is not None:
                    event.set()

    async def wait_readable(self, stream: trio.abc.Stream, deadline: float) -> bool:
        """True once ``stream`` has a byte (or EOF) to read, False at ``deadline``."""
        if not isinstance(stream, trio.SocketStream):
            return True  # not a socket: its receive_some waits
        fd = stream.socket.fileno()
        event = self._ready[fd] = trio.Event()
        try:
            self._epoll.register(fd, select.EPOLLIN | select.EPOLLRDHUP)
            with trio.move_on_at(deadline):
                await event.wait()
            return event.is_set()
        finally:
            if self._ready.pop(fd, None) is not None:
                with contextlib.suppress(OSError):
                    self._epoll.unregister(fd)


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
