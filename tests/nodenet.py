"""The test node's network namespace and the relays that cross it, without touching the host's network.

:func:`network_namespace` makes a namespace bound on a file of the node's folder (``unshare --net=<file>``:
nothing under /run/netns), with loopback up and the node IP on one end of a veth pair whose other end is inside
too and has no address (this kernel has no dummy interfaces): the default route leads there, so a packet for
anywhere else is dropped and nothing leaves the machine. :class:`Relay` accepts TCP connections in one
namespace and opens the other side in another (``setns`` on the relay's own threads): the tests reach the API
server inside, the pods reach the broker's listener outside, and no interface, route or rule is added to the
host.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def setns(fd: int) -> None:
    """Move the calling thread into the network namespace open at ``fd``."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def in_netns(path: Path, *command: str) -> list[str]:
    return ["nsenter", f"--net={path}", "--", *command]


@contextmanager
def network_namespace(path: Path, node_ip: str) -> Iterator[Path]:
    """A network namespace bound on ``path`` with ``node_ip``/24 on ``node0``, routes ending inside."""
    path.touch()
    subprocess.run(["unshare", f"--net={path}", "true"], check=True)
    try:
        for command in (
            ["ip", "link", "set", "lo", "up"],
            # A veth pair with both ends inside (this kernel has no dummy interfaces): what is sent out of
            # node0 arrives at node0-sink, which has no address and drops it.
            ["ip", "link", "add", "node0", "type", "veth", "peer", "name", "node0-sink"],
            ["ip", "addr", "add", f"{node_ip}/24", "dev", "node0"],
            ["ip", "link", "set", "node0-sink", "up"],
            ["ip", "link", "set", "node0", "up"],
            # The kubelet and the API server want a default route; this one ends at the sink.
            ["ip", "route", "add", "default", "dev", "node0"],
        ):
            subprocess.run(in_netns(path, *command), check=True)
        yield path
    finally:
        # The namespace goes when its last process and this mount are gone (with its bridge and veths).
        subprocess.run(["umount", str(path)], check=False)
        path.unlink(missing_ok=True)


class Relay:
    """TCP from ``listen`` in the namespace open at ``listen_ns`` to ``target`` in the one at ``target_ns``."""

    def __init__(
        self,
        listen_ns: int,
        listen: tuple[str, int],
        target_ns: int,
        target: tuple[str, int],
    ) -> None:
        self.target_ns = target_ns
        self.target = target
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        ready = threading.Event()
        failure: list[BaseException] = []

        def bind() -> None:
            try:
                setns(listen_ns)
                self.server = socket.create_server(listen, reuse_port=False)
            except BaseException as exc:  # reported to the constructor's caller
                failure.append(exc)
            finally:
                ready.set()

        # A thread of its own: its namespace is the listener's; the accepting thread keeps it.
        binder = threading.Thread(target=bind, daemon=True)
        binder.start()
        ready.wait()
        binder.join()
        if failure:
            raise failure[0]
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name=f"relay {listen}")
        self._acceptor.start()

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._sockets.add(sock)
            return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if not self._track(client):
                client.close()
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            setns(self.target_ns)
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        if not self._track(upstream):
            upstream.close()
            client.close()
            return
        threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()
        self._pump(client, upstream)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            source.close()
            sink.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets = list(self._sockets)
        with suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.server.close()
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._acceptor.join(5)
