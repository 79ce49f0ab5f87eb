"""Property tests of sidecar.http.server's request parsing over real TCP and Unix sockets (Hypothesis).

The server runs in its own thread (its own trio loop) for the whole module; every example opens a
real connection. Properties:

- a well-formed request (any method, path, query, headers, a content-length, chunked or empty
  body, trailers), sent in arbitrary pieces, is answered 200 with exactly what was sent: framing
  does not depend on how the bytes were segmented;
- arbitrary bytes, alone or after a valid request line, are answered with one of the server's
  own statuses (200 for what happens to parse, 400, 408, 413, 431) or a silent close, never a
  500, within a bounded time, and the server keeps serving afterwards.

Bounded: 120 + 120 examples per transport, each well under a second.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.http.server import Limits, Listen, Request, Response, ServerStats, serve_http

LIMITS = Limits(max_request_bytes=64 * 1024, request_timeout_s=5.0, send_timeout_s=5.0)
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


async def echo(request: Request) -> Response:
    body = json.dumps(
        {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "x": [[k, v] for k, v in request.headers if k.startswith("x-")],
            "length": len(request.body),
            "sha256": hashlib.sha256(request.body).hexdigest(),
        }
    ).encode()
    return Response(200, (("Content-Type", "application/json"),), body)


class ServerThread:
    """serve_http on its own trio loop in a thread, for synchronous Hypothesis tests."""

    def __init__(self, listen: Listen) -> None:
        self.listen = listen
        self.stats = ServerStats()
        self.bound: int | str = ""
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            self.bound = await nursery.start(
                functools.partial(serve_http, echo, self.listen, limits=LIMITS, stats=self.stats)
            )
            self._token = trio.lowlevel.current_trio_token()
            self._scope = nursery.cancel_scope
            self._ready.set()

    def __enter__(self) -> ServerThread:
        self._thread.start()
        assert self._ready.wait(10), "the server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._token is not None and self._scope is not None
        trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(10)

    def connect(self) -> socket.socket:
        if self.listen[0] == "tcp":
            sock = socket.create_connection(("127.0.0.1", int(self.bound)), timeout=15)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            sock = socket.socket(socket.AF_UNIX)
            sock.settimeout(15)
            sock.connect(str(self.bound))
        return sock


@pytest.fixture(scope="module", params=["tcp", "unix"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerThread]:
    with tempfile.TemporaryDirectory() as directory:
        listen: Listen
        if request.param == "tcp":
            listen = ("tcp", "127.0.0.1", 0)
        else:
            listen = ("unix", str(Path(directory) / "fuzz.sock"))
        with ServerThread(listen) as running:
            yield running


def exchange(server: ServerThread, pieces: list[bytes]) -> bytes:
    """Send ``pieces`` one by one, half-close, and read until the server closes."""
    with server.connect() as sock:
        try:
            for piece in pieces:
                sock.sendall(piece)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused early; its answer is still readable
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except ConnectionResetError:
            pass
    return data


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


def assert_still_serving(server: ServerThread) -> None:
    response = exchange(server, [b"GET /alive HTTP/1.1\r\nConnection: close\r\n\r\n"])
    assert response.startswith(b"HTTP/1.1 200 "), response[:100]


# --- well-formed requests ----------------------------------------------------------------------

TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
PATH_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~%!$&'()*+,;=:@"
VALUE_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x7E)


@dataclass(frozen=True)
class WellFormed:
    method: str
    path: str
    query: str
    headers: list[tuple[str, str]]
    body: bytes
    framing: str  # "length", "chunked" or "none"
    chunks: list[int]
    trailers: list[tuple[str, str]]

    def encode(self) -> bytes:
        target = self.path + (f"?{self.query}" if self.query else "")
        lines = [f"{self.method} {target} HTTP/1.1", "Host: fuzz", "Connection: close"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        if self.framing == "length":
            lines.append(f"Content-Length: {len(self.body)}")
        elif self.framing == "chunked":
            lines.append("Transfer-Encoding: chunked")
        head = "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n"
        if self.framing != "chunked":
            return head + self.body
        out, rest = [head], self.body
        for size in self.chunks:
            if not rest:
                break
            piece, rest = rest[: max(1, size)], rest[max(1, size) :]
            out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
        if rest:
            out.append(b"%x\r\n%s\r\n" % (len(rest), rest))
        out.append(b"0\r\n")
        out += [f"{name}: {value}\r\n".encode("latin-1") for name, value in self.trailers]
        out.append(b"\r\n")
        return b"".join(out)


def header_pairs(prefix: str) -> st.SearchStrategy[list[tuple[str, str]]]:
    name = st.text(TOKEN_CHARS, min_size=1, max_size=12).map(lambda s: prefix + s)
    value = st.text(VALUE_CHARS, max_size=40).map(str.strip)
    return st.lists(st.tuples(name, value), max_size=8)


@st.composite
def well_formed(draw: st.DrawFn) -> WellFormed:
    framing = draw(st.sampled_from(["length", "chunked", "none"]))
    body = b"" if framing == "none" else draw(st.binary(max_size=3000))
    return WellFormed(
        method=draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])),
        path="/" + draw(st.text(PATH_CHARS, max_size=30)),
        query=draw(st.text(PATH_CHARS + "?/", max_size=20)),
        headers=draw(header_pairs("x-")),
        body=body,
        framing=framing,
        chunks=draw(st.lists(st.integers(1, 700), max_size=10)),
        trailers=draw(header_pairs("t-")) if framing == "chunked" else [],
    )


@FUZZ
@given(request=well_formed(), cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_well_formed_requests_in_any_segmentation(
    server: ServerThread, request: WellFormed, cuts: list[int]
) -> None:
    response = exchange(server, split(request.encode(), cuts))
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), response[:200]
    seen: dict[str, Any] = json.loads(body)
    assert seen["method"] == request.method
    assert (seen["path"], seen["query"]) == (request.path, request.query)
    assert seen["x"] == [[name.lower(), value] for name, value in request.headers]
    assert (seen["length"], seen["sha256"]) == (
        len(request.body),
        hashlib.sha256(request.body).hexdigest(),
    )


# --- garbage -------------------------------------------------------------------------------------

SERVER_STATUSES = {b"200", b"400", b"408", b"413", b"431"}


@FUZZ
@given(
    prefix=st.sampled_from([b"", b"GET / HTTP/1.1\r\n", b"POST /x HTTP/1.1\r\nContent-Length: "]),
    junk=st.binary(max_size=4000)
    | st.lists(
        st.sampled_from([b"\r\n", b":", b" ", b"0", b"\r\n\r\n", b"chunked", b"a" * 500])
    ).map(b"".join),
    cuts=st.lists(st.integers(0, 10_000), max_size=4),
)
def test_garbage_gets_one_of_the_servers_own_answers(
    server: ServerThread, prefix: bytes, junk: bytes, cuts: list[int]
) -> None:
    response = exchange(server, split(prefix + junk, cuts))
    if response:
        assert response.startswith(b"HTTP/1.1 "), response[:100]
        statuses = [
            line.split(b" ")[1] for line in response.split(b"\r\n") if line.startswith(b"HTTP/1.1 ")
        ]
        assert set(statuses) <= SERVER_STATUSES, statuses
    assert_still_serving(server)
