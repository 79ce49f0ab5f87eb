"""Floods of idle, slow and half-open connections on both listeners (docs/security.md), the sidecar as a subprocess.

For each flood, on the control API and the observability listener, over TCP and over a Unix
socket: more connections than ``api.max.connections`` (1,024) are opened; as soon as they are
connected a fresh ``GET /healthz`` and ``GET /readyz`` must answer 200 within 1 s, and every
flood connection must be closed by the sidecar within its limit (short limits here) plus slack:

    idle         connects and sends nothing                         api.idle.timeout.ms
    slow_header  a header block, one byte every 0.5 s              api.header.timeout.ms
    slow_body    a header block with Content-Length: 1000, then      api.body.timeout.ms plus
                 one body byte every 0.25 s                          1 s per min-rate bytes
    half_open    a whole request, then FIN; reads nothing until      at once (EOF is a close)
                 the probes were answered

Over TCP the idle and half-open floods come from one peer (127.0.0.2: the per-peer cap makes
room within it), the slow ones from eight (127.0.0.2-9: the listener's cap makes room). The
figures (time to the probes' answers, time until the flood was cut) are printed: run with
``-s`` to see them. ``test_5000_connections_cost_bounded_memory`` measures the sidecar's RSS
with 5,000 idle connections open, then with each of them holding 1 KiB of an unfinished header.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
import trio
import yaml

from tests.harness import Sidecar, free_port, running_sidecar
from tests.kafkatools import Broker
from tests.promtext import prometheus_values

pytestmark = [pytest.mark.broker, pytest.mark.slow]

Kind = Literal["idle", "slow_header", "slow_body", "half_open"]
KINDS: tuple[Kind, ...] = ("idle", "slow_header", "slow_body", "half_open")

FLOOD = 1200  # above api.max.connections (1,024, the default)
TICK_S = 0.5
PROBE_DEADLINE_S = 1.0
SLACK_S = 4.0  # accepting and closing over a thousand connections on a shared, loaded machine
LIMITS_MS = {
    "idle.timeout.ms": 1000,
    "keep.alive.timeout.ms": 1000,
    "header.timeout.ms": 1000,
    "body.timeout.ms": 1000,
    "body.min.rate.bytes.per.s": 1000,
    "request.timeout.ms": 10_000,  # far above the cuts: a cut in time is the phase limit
    "send.timeout.ms": 1000,
}
# How long after the flood is connected its last connection may still be open (before slack).
CUT_WITHIN_S: dict[Kind, float] = {
    "idle": 1.0,
    "slow_header": 1.0,
    "slow_body": 1.0 + 100 / 1000,  # body timeout, plus 1 s per 1000 bytes (at most ~20 sent)
    "half_open": 0.0,
}


def raise_fd_limit(needed: int) -> None:
    """This process holds the flood's client sockets: raise its open-file limit if it must."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        assert target >= needed, f"needs {needed} open files, the hard limit is {hard}"


def _address(where: str) -> tuple[int, Any]:
    if where.startswith("unix:"):
        return socket.AF_UNIX, where[len("unix:") :]
    host, _, port = where.rpartition(":")
    return socket.AF_INET, (host, int(port))


async def connect(where: str, source: str | None = None) -> trio.socket.SocketType:
    family, address = _address(where)
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        if source is not None:
            await sock.bind((source, 0))
        await sock.connect(address)
    except BaseException:
        sock.close()
        raise
    return sock


_PROBE = """
import socket, sys, time
where, path = sys.argv[1], sys.argv[2]
started = time.monotonic()
if where.startswith("unix:"):
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(where[5:])
else:
    host, _, port = where.rpartition(":")
    sock = socket.create_connection((host, int(port)))
sock.sendall(f"GET {path} HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n".encode())
data = b""
while chunk := sock.recv(65536):
    data += chunk
print(data.split(b" ", 2)[1].decode(), time.monotonic() - started)
"""


async def probe(where: str, path: str) -> tuple[int, float]:
    """A fresh connection's ``GET path``, from a process of its own as the kubelet's is (this
    one is busy with the flood): the status and the seconds from connect to the answer."""
    done = await trio.run_process(
        [sys.executable, "-c", _PROBE, where, path], capture_stdout=True, check=True
    )
    status, seconds = done.stdout.split()
    return int(status), float(seconds)


def _head(kind: Kind, listener: str) -> bytes:
    if kind == "idle":
        return b""
    if kind == "slow_header":
        return b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: "
    if kind == "slow_body":
        path = b"/v1/acks" if listener == "control" else b"/healthz"
        return (
            b"POST " + path + b" HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
        )
    return b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"


@dataclass
class Flood:
    """``n`` connections of one kind, each watched until the server closes it."""

    where: str
    kind: Kind
    listener: str
    n: int
    sources: list[str | None]
    socks: list[trio.socket.SocketType] = field(default_factory=list)
    closed_at: list[float] = field(default_factory=list)
    connected_at: float = 0.0

    async def open(self) -> None:
        limiter = trio.CapacityLimiter(64)
        head = _head(self.kind, self.listener)

        async def one(i: int) -> None:
            async with limiter:
                sock = await connect(self.where, self.sources[i % len(self.sources)])
                if head:
                    await sock.send(head)
                if self.kind == "half_open":
                    sock.shutdown(socket.SHUT_WR)
                self.socks.append(sock)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(self.n):
                    nursery.start_soon(one, i)
        self.connected_at = trio.current_time()

    async def trickle(self) -> None:
        """One more byte on every open slow connection each tick."""
        if self.kind not in ("slow_header", "slow_body"):
            return
        live = list(self.socks)
        while live:
            await trio.sleep(TICK_S)
            still = []
            for sock in live:
                try:
                    await sock.send(b"a")
                    still.append(sock)
                except OSError:
                    pass  # closed by the server: the watcher records when
            live = still

    async def watch(self, sock: trio.socket.SocketType) -> None:
        """Until the server closes ``sock``: EOF or a reset (after whatever it answered)."""
        with contextlib.suppress(OSError):
            while await sock.recv(65536):
                pass
        self.closed_at.append(trio.current_time())

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


async def run_flood(
    sc: Sidecar, where: str, listener: str, kind: Kind, *, metrics: Callable[[], Awaitable[str]]
) -> dict[str, float]:
    tcp = not where.startswith("unix:")
    if not tcp:
        sources: list[str | None] = [None]
    elif kind in ("idle", "half_open"):
        sources = ["127.0.0.2"]
    else:
        sources = [f"127.0.0.{i}" for i in range(2, 10)]
    flood = Flood(where, kind, listener, FLOOD, sources)
    start = trio.current_time()
    try:
        await flood.open()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(flood.trickle)
            if kind != "half_open":
                for sock in flood.socks:
                    nursery.start_soon(flood.watch, sock)
            health, health_s = await probe(where, "/healthz")
            ready, ready_s = await probe(where, "/readyz")
            if kind == "half_open":  # it read nothing so far; now see that the server closed
                for sock in flood.socks:
                    nursery.start_soon(flood.watch, sock)
            limit = CUT_WITHIN_S[kind] + SLACK_S
            with trio.move_on_at(flood.connected_at + limit + 5):
                while len(flood.closed_at) < flood.n:
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    finally:
        flood.close()
    what = f"{kind} flood on the {listener} listener ({where})"
    assert (health, ready) == (200, 200), what
    assert max(health_s, ready_s) < PROBE_DEADLINE_S, (what, health_s, ready_s)
    assert len(flood.closed_at) == flood.n, f"{what}: {flood.n - len(flood.closed_at)} left open"
    cut_s = max(flood.closed_at) - flood.connected_at
    assert cut_s < CUT_WITHIN_S[kind] + SLACK_S, (what, cut_s)
    figures = {
        "connect_s": flood.connected_at - start,
        "healthz_s": health_s,
        "readyz_s": ready_s,
        "cut_s": cut_s,
    }
    print(
        f"{kind:11} {listener:13} {'tcp' if tcp else 'unix':4} "
        + " ".join(f"{k}={v:.3f}" for k, v in figures.items())
    )
    # Every connection is gone from the listener, and counted.
    with trio.fail_after(10):
        while True:
            values = prometheus_values(await metrics())
            if not values.get(f'dlq_sidecar_http_open_connections{{listener="{listener}"}}', 1):
                break
            await trio.sleep(0.05)
    return figures


@contextlib.asynccontextmanager
async def sidecar_with_listeners(
    broker: Broker, unique: str, tmp_path: Path, control: str, observability: str, **api: Any
) -> AsyncIterator[Sidecar]:
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    async with running_sidecar(
        broker, tmp_path, unique=unique, topic=topic, api_listen=control, start=False
    ) as rig:
        data = yaml.safe_load(rig.config_path.read_text())
        data["api"].update({"observability.listen": observability, **api})
        rig.config_path.write_text(yaml.safe_dump(data))
        async with rig.sidecar(wait_api=False) as sc:
            with trio.fail_after(60):
                for where in (control, observability):
                    while True:
                        with contextlib.suppress(OSError, subprocess.CalledProcessError):
                            if (await probe(where, "/readyz"))[0] == 200:
                                break
                        assert sc.proc.poll() is None, sc.log_text()[-3000:]
                        await trio.sleep(0.1)
            yield sc


async def get_metrics(where: str) -> str:
    sock = await connect(where)
    with sock:
        await sock.send(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := await sock.recv(65536):
            data += chunk
    return data.partition(b"\r\n\r\n")[2].decode()


@pytest.mark.parametrize("layout", ["control-tcp", "control-unix"])
async def test_probes_are_answered_and_floods_cut_on_both_listeners(
    broker: Broker, unique: str, tmp_path: Path, layout: str
) -> None:
    raise_fd_limit(FLOOD + 256)
    # A socket path must fit sun_path (108 bytes): pytest's tmp_path may not.
    sockets = Path(os.environ.get("TMPDIR", "/tmp")) / f"fl-{os.getpid()}-{unique[-8:]}"
    sockets.mkdir()
    tcp, unix = f"127.0.0.1:{free_port()}", f"unix:{sockets / 'l.sock'}"
    control, observability = (tcp, unix) if layout == "control-tcp" else (unix, tcp)
    try:
        async with sidecar_with_listeners(
            broker, unique, tmp_path, control, observability, **LIMITS_MS
        ) as sc:
            for listener, where, other in (
                ("control", control, observability),
                ("observability", observability, control),
            ):
                for kind in KINDS:
                    await run_flood(
                        sc, where, listener, kind, metrics=lambda other=other: get_metrics(other)
                    )
            values = prometheus_values(await get_metrics(control))
            for listener in ("control", "observability"):
                for reason in ("evicted", "idle", "header_timeout", "body_too_slow"):
                    key = f'dlq_sidecar_http_cut_total{{listener="{listener}",reason="{reason}"}}'
                    assert values.get(key, 0) > 0, key
            assert await sc.stop() == 0
        # Thousands of cuts, a bounded log: once per peer per 10 s, at most 20 lines per 10 s.
        cut_lines = [ln for ln in sc.log_lines() if "closed a connection from" in ln.get("msg", "")]
        assert 0 < len(cut_lines) < 200, len(cut_lines)
    finally:
        with contextlib.suppress(OSError):
            (sockets / "l.sock").unlink()
        sockets.rmdir()


def unread_bytes(port: int) -> int:
    """Bytes waiting in the receive queues of the IPv4 TCP sockets bound to local ``port``."""
    total = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rpartition(":")[2], 16) == port:
            total += int(fields[4].partition(":")[2], 16)
    return total


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


# What one open connection may cost the sidecar, measured on 5,000 (module docstring of
# sidecar.http.server): idle, and holding 1 KiB of an unfinished header block.
IDLE_KIB_PER_CONNECTION = 16
HEADER_KIB_PER_CONNECTION = 16 + 4


async def test_5000_connections_cost_bounded_memory(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    n = 5000
    raise_fd_limit(n + 256)
    control, observability = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    long_ms = {key: 600_000 for key in LIMITS_MS if key.endswith(".ms")}
    async with sidecar_with_listeners(
        broker,
        unique,
        tmp_path,
        control,
        observability,
        **{**long_ms, "max.connections": 5100, "max.connections.per.peer": 5100},
    ) as sc:
        pid = sc.proc.pid
        key = 'dlq_sidecar_http_open_connections{listener="observability"}'

        async def wait_open(count: int) -> None:
            with trio.fail_after(60):
                while prometheus_values(await get_metrics(control)).get(key) != count:
                    await trio.sleep(0.1)

        await wait_open(0)
        before = rss_kib(pid)
        flood = Flood(
            observability, "idle", "observability", n, [f"127.0.0.{i}" for i in range(2, 10)]
        )
        try:
            await flood.open()
            await wait_open(n)
            idle = rss_kib(pid)
            health, health_s = await probe(observability, "/healthz")
            assert health == 200 and health_s < PROBE_DEADLINE_S
            head = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"p" * 1024
            for sock in flood.socks:
                await sock.send(head)
            port = int(observability.rpartition(":")[2])
            with trio.fail_after(60):
                while unread_bytes(port):  # until the sidecar has read what was sent
                    await trio.sleep(0.1)
            reading = rss_kib(pid)
            ready, ready_s = await probe(observability, "/readyz")
            assert ready == 200 and ready_s < PROBE_DEADLINE_S
        finally:
            flood.close()
        per_idle = (idle - before) / n
        per_reading = (reading - before) / n
        print(
            f"RSS: {before} KiB before, {idle} KiB with {n} idle connections ({per_idle:.1f} KiB "
            f"each), {reading} KiB with 1 KiB of header each ({per_reading:.1f} KiB each); "
            f"probes {health_s:.3f} s, {ready_s:.3f} s"
        )
        assert per_idle < IDLE_KIB_PER_CONNECTION, per_idle
        assert per_reading < HEADER_KIB_PER_CONNECTION, per_reading
