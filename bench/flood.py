"""Idle connections held open on the sidecar's observability listener during a throughput run (issue 27).

``python -m bench --idle-connections N`` gives every sidecar throughput run an observability
listener (``api.observability.listen`` on a free loopback port, ``api.max.connections`` and
``api.max.connections.per.peer`` above N, ``api.idle.timeout.ms`` one hour so that they stay) and,
while the sidecar runs, a child process (this module run again) that opens N TCP connections to
it from 127.0.0.2-9, sends nothing, and holds them. The run's figures then carry
``idle_connections`` (open when the run ended) and ``flood_ready_before_first_record``. Compare
with a run without the option; the machine's load is the same for both only when runs alternate.

The child: ``python -m bench.flood --port P --connections N`` prints one JSON line once all N are
open and the sidecar's ``dlq_sidecar_http_open_connections`` counts them (``{"open": N,
"ready_ns": ...}``, CLOCK_MONOTONIC), and on SIGTERM one more with how many are still open.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_connections = 0
_port = 0


def set_idle_connections(n: int) -> None:
    """Every throughput run from now on holds ``n`` idle connections (0: none)."""
    global _connections
    _connections = n


def configure(config_text: str) -> str:
    """The sidecar config with an observability listener that lets the connections stay."""
    global _port
    if not _connections:
        return config_text
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        _port = probe.getsockname()[1]
    cap = _connections + 100
    extra = (
        f"  observability.listen: 127.0.0.1:{_port}\n"
        f"  max.connections: {cap}\n"
        f"  max.connections.per.peer: {cap}\n"
        "  idle.timeout.ms: 3600000\n"
    )
    head, sep, rest = config_text.partition("api:\n")
    assert sep, "the sidecar config has no api: section"
    line, nl, tail = rest.partition("\n")
    return head + sep + line + nl + extra + tail


@dataclass
class Held:
    ready_ns: int = 0
    open_at_end: int = 0

    def figures(self, first_ns: int) -> dict[str, Any]:
        if not _connections:
            return {}
        return {
            "idle_connections": self.open_at_end,
            "flood_ready_before_first_record": 0 < self.ready_ns <= first_ns,
            "flood_ready_s_before_first_record": (first_ns - self.ready_ns) / 1e9,
        }


@contextlib.contextmanager
def holding() -> Iterator[Held]:
    """The flood child, for as long as the block runs (nothing when no connections are asked).

    Entered right after the sidecar is spawned: the child connects as soon as the listener is
    up, in the second or so the sidecar takes to join its group, and the block starts once the
    sidecar has seated them all (``flood_ready_before_first_record`` says whether that was
    before the first record was delivered).
    """
    held = Held()
    if not _connections:
        yield held
        return
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.flood",
            "--port",
            str(_port),
            "--connections",
            str(_connections),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        # The measurement starts once every connection is seated: what it shows is the cost of
        # holding them, not of accepting them (the first records may already be flowing).
        line = child.stdout.readline()
        with contextlib.suppress(ValueError, KeyError):
            held.ready_ns = int(json.loads(line)["ready_ns"])
        yield held
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            out, _ = child.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            out, _ = child.communicate()
        for line in out.splitlines():
            with contextlib.suppress(ValueError, KeyError):
                report = json.loads(line)
                held.ready_ns = int(report.get("ready_ns", held.ready_ns))
                held.open_at_end = int(report["open"])


def _seated(port: int) -> float:
    """The sidecar's own count of open connections on its observability listener (this GET's
    connection included)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    for line in data.decode(errors="replace").splitlines():
        if line.startswith('dlq_sidecar_http_open_connections{listener="observability"}'):
            return float(line.rsplit(" ", 1)[1]) - 1
    return 0.0


def _hold(port: int, n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < n + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n + 64, hard), hard))
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    socks: list[socket.socket] = []
    deadline = time.monotonic() + 120
    while len(socks) < n and not stop:
        sock = socket.socket()
        sock.bind((f"127.0.0.{2 + len(socks) % 8}", 0))
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:  # the sidecar is not listening yet
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
            continue
        socks.append(sock)
    # Connected is not yet seated: wait until the sidecar has taken every one of them.
    while not stop and _seated(port) < len(socks):
        time.sleep(0.05)
    print(json.dumps({"open": len(socks), "ready_ns": time.monotonic_ns()}), flush=True)
    selector = selectors.DefaultSelector()
    for sock in socks:
        selector.register(sock, selectors.EVENT_READ)
    open_ = len(socks)
    while not stop and open_:
        for key, _ in selector.select(timeout=0.2):
            selector.unregister(key.fileobj)
            open_ -= 1  # the server closed it (no byte is ever sent to us otherwise)
    print(json.dumps({"open": open_}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.flood")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, required=True)
    args = parser.parse_args()
    _hold(args.port, args.connections)
