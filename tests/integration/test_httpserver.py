"""sidecar.http.server over real TCP and Unix sockets, driven by raw clients."""

from __future__ import annotations

import errno
import functools
import os
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import pytest
import trio

from sidecar.http.server import (
    Handler,
    Limits,
    PeerClosed,
    Request,
    Response,
    ServerStats,
    serve_http,
)


async def echo(request: Request) -> Response:
    if request.path == "/boom":
        raise RuntimeError("handler bug")
    if request.path == "/not-latin-1":
        return Response(200, (("X-Price", "5 \u20ac"),))
    if request.path == "/split":
        return Response(200, (("X-Next", "a\r\nSet-Cookie: injected=1"),))
    if request.path == "/slow":
        await trio.sleep(0.2)
    body = b"%s %s ?%s len=%d" % (
        request.method.encode(),
        request.path.encode(),
        request.query.encode(),
        len(request.body),
    )
    headers = (("X-Seen", ",".join(request.header_values("x-rep"))),)
    return Response(200, headers, body)


@asynccontextmanager
async def running(
    transport: str, tmp_path: Path, handler: Handler = echo, **kwargs: object
) -> AsyncIterator[trio.abc.Stream]:
    """Start the server, yield a raw client stream connected to it."""
    async with trio.open_nursery() as nursery:
        if transport == "tcp":
            port = await nursery.start(
                lambda task_status: serve_http(
                    handler,
                    ("tcp", "127.0.0.1", 0),
                    task_status=task_status,
                    **kwargs,  # type: ignore[arg-type]
                )
            )
            stream: trio.abc.Stream = await trio.open_tcp_stream("127.0.0.1", port)
        else:
            path = str(tmp_path / "s.sock")
            await nursery.start(
                lambda task_status: serve_http(
                    handler,
                    ("unix", path),
                    task_status=task_status,
                    **kwargs,  # type: ignore[arg-type]
                )
            )
            stream = await trio.open_unix_socket(path)
        try:
            yield stream
        finally:
            await trio.aclose_forcefully(stream)
            nursery.cancel_scope.cancel()


@pytest.fixture(params=["tcp", "unix"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def read_until_closed(stream: trio.abc.Stream, timeout_s: float = 5) -> bytes:
    data = b""
    with trio.fail_after(timeout_s):
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def read_responses(stream: trio.abc.Stream, count: int) -> list[bytes]:
    """Read ``count`` Content-Length framed responses."""
    buffer = b""
    responses: list[bytes] = []
    with trio.fail_after(5):
        while len(responses) < count:
            if b"\r\n\r\n" in buffer:
                head, _, rest = buffer.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(rest) >= length:
                    responses.append(head + b"\r\n\r\n" + rest[:length])
                    buffer = rest[length:]
                    continue
            chunk = await stream.receive_some(65536)
            assert chunk, f"closed after {len(responses)} responses"
            buffer += chunk
    return responses


async def test_keep_alive_serves_many_requests_on_one_connection(
    transport: str, tmp_path: Path
) -> None:
    async with running(transport, tmp_path) as stream:
        for index in range(5):
            await stream.send_all(b"POST /p?i=%d HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc" % index)
            [response] = await read_responses(stream, 1)
            assert response.startswith(b"HTTP/1.1 200 OK\r\n")
            assert response.endswith(b"POST /p ?i=%d len=3" % index)
            assert b"Connection: close" not in response


async def test_pipelined_requests_answered_in_order(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path) as stream:
        await stream.send_all(
            b"GET /a HTTP/1.1\r\n\r\nGET /slow HTTP/1.1\r\n\r\nGET /c HTTP/1.1\r\n\r\n"
        )
        responses = await read_responses(stream, 3)
        assert [r.rsplit(b"\r\n\r\n", 1)[1] for r in responses] == [
            b"GET /a ? len=0",
            b"GET /slow ? len=0",
            b"GET /c ? len=0",
        ]


async def test_chunked_request_body(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path) as stream:
        await stream.send_all(b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nab")
        await trio.sleep(0.01)
        await stream.send_all(b"cd\r\n3\r\nefg\r\n0\r\n\r\n")
        [response] = await read_responses(stream, 1)
        assert response.endswith(b"len=7")


async def test_repeated_headers_are_kept_apart(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path) as stream:
        await stream.send_all(b"GET / HTTP/1.1\r\nX-Rep: a\r\nx-rep: b,c\r\n\r\n")
        [response] = await read_responses(stream, 1)
        assert b"X-Seen: a,b,c\r\n" in response


async def test_body_over_the_cap_is_413(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path, max_request_bytes=100) as stream:
        await stream.send_all(b"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n")
        response = await read_until_closed(stream)
        assert response.startswith(b"HTTP/1.1 413 ")
        assert b"Connection: close" in response


async def test_chunked_body_over_the_cap_is_413(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path, max_request_bytes=100) as stream:
        await stream.send_all(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
        await stream.send_all(b"40\r\n" + b"x" * 64 + b"\r\n" + b"40\r\n" + b"x" * 64 + b"\r\n")
        response = await read_until_closed(stream)
        assert response.startswith(b"HTTP/1.1 413 ")


async def test_garbage_is_400(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path) as stream:
        await stream.send_all(b"\x16\x03\x01 TLS hello, not HTTP\r\n\r\n")
        response = await read_until_closed(stream)
        assert response.startswith(b"HTTP/1.1 400 ")


async def test_huge_header_block_is_431(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path) as stream:
        await stream.send_all(b"GET / HTTP/1.1\r\n")
        with trio.move_on_after(2):
            for _ in range(100):
                await stream.send_all(b"X-Filler: " + b"y" * 1000 + b"\r\n")
        response = await read_until_closed(stream)
        assert response.startswith(b"HTTP/1.1 431 ")


async def test_expect_100_continue(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path) as stream:
        await stream.send_all(
            b"POST / HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
        )
        with trio.fail_after(5):
            interim = await stream.receive_some(65536)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        await stream.send_all(b"hi")
        [response] = await read_responses(stream, 1)
        assert response.endswith(b"len=2")


async def test_handler_exception_is_500_and_the_connection_survives(
    transport: str, tmp_path: Path
) -> None:
    async with running(transport, tmp_path) as stream:
        await stream.send_all(b"GET /boom HTTP/1.1\r\n\r\nGET /ok HTTP/1.1\r\n\r\n")
        first, second = await read_responses(stream, 2)
        assert first.startswith(b"HTTP/1.1 500 ")
        assert second.startswith(b"HTTP/1.1 200 ")


async def test_a_response_that_cannot_be_written_is_500_and_the_connection_survives(
    transport: str, tmp_path: Path
) -> None:
    """A handler's header that is not latin-1, or carries CR/LF (it would split the response), is
    the handler's bug: one 500, never an injected header or a crashed server."""
    async with running(transport, tmp_path) as stream:
        await stream.send_all(
            b"GET /not-latin-1 HTTP/1.1\r\n\r\nGET /split HTTP/1.1\r\n\r\nGET /ok HTTP/1.1\r\n\r\n"
        )
        first, second, third = await read_responses(stream, 3)
        assert first.startswith(b"HTTP/1.1 500 ")
        assert second.startswith(b"HTTP/1.1 500 ")
        assert b"injected" not in second
        assert third.startswith(b"HTTP/1.1 200 ")


async def test_head_has_no_body(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path) as stream:
        await stream.send_all(b"HEAD /h HTTP/1.1\r\nConnection: close\r\n\r\n")
        response = await read_until_closed(stream)
        assert response.startswith(b"HTTP/1.1 200 ")
        assert b"Content-Length: 15\r\n" in response  # of "HEAD /h ? len=0"
        assert response.endswith(b"\r\n\r\n")


async def test_connection_close_and_http_1_0(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path) as stream:
        await stream.send_all(b"GET /x HTTP/1.0\r\n\r\n")
        response = await read_until_closed(stream)
        assert b"Connection: close\r\n" in response
        assert response.endswith(b"GET /x ? len=0")


async def test_idle_connections_are_closed(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path, idle_timeout_s=0.1) as stream:
        assert await read_until_closed(stream, timeout_s=2) == b""


async def test_port_zero_reports_the_bound_port() -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(serve_http, echo, ("tcp", "127.0.0.1", 0))
        assert isinstance(port, int) and port > 0
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
            assert (await read_until_closed(stream)).startswith(b"HTTP/1.1 200 ")
        nursery.cancel_scope.cancel()


async def test_stale_unix_socket_is_replaced_and_removed_on_exit(tmp_path: Path) -> None:
    path = str(tmp_path / "app.sock")
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(path)  # a socket file nobody listens on, as a killed process leaves it
    leftover.close()
    async with trio.open_nursery() as nursery:
        assert await nursery.start(serve_http, echo, ("unix", path)) == path
        async with await trio.open_unix_socket(path) as stream:
            await stream.send_all(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
            assert (await read_until_closed(stream)).startswith(b"HTTP/1.1 200 ")
        nursery.cancel_scope.cancel()
    assert not os.path.exists(path)


async def test_live_unix_socket_and_regular_file_are_not_replaced(tmp_path: Path) -> None:
    path = str(tmp_path / "app.sock")
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_http, echo, ("unix", path))
        with pytest.raises(OSError) as caught:
            await nursery.start(serve_http, echo, ("unix", path))
        assert caught.value.errno == errno.EADDRINUSE
        nursery.cancel_scope.cancel()
    regular = tmp_path / "file"
    regular.write_text("keep me")
    with pytest.raises(FileExistsError):
        await serve_http(echo, ("unix", str(regular)))
    assert regular.read_text() == "keep me"


async def test_cancel_with_a_request_in_flight_is_clean(transport: str, tmp_path: Path) -> None:
    started = trio.current_time()
    with trio.move_on_after(0.1):
        async with running(transport, tmp_path) as stream:
            await stream.send_all(b"GET /slow HTTP/1.1\r\n\r\n")
            await trio.sleep(10)
    assert trio.current_time() - started < 5  # not the 10 s the client waits
    if transport == "unix":
        assert not (tmp_path / "s.sock").exists()


async def test_upgrade_request_is_answered_then_closed(transport: str, tmp_path: Path) -> None:
    # curl --http2 on plain http asks for h2c; we answer in HTTP/1.1 and do not switch.
    async with running(transport, tmp_path) as stream:
        await stream.send_all(
            b"GET /u HTTP/1.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
        )
        response = await read_until_closed(stream)
        assert response.startswith(b"HTTP/1.1 200 ")
        assert response.endswith(b"GET /u ? len=0")


# ---------------------------------------------------------------------------------------------
# Hard limits (docs/security.md): trailers, the header cap, connections, slow requests, slow readers


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def send_until_refused(stream: trio.abc.Stream, head: bytes, piece: bytes, total: int) -> int:
    """Send ``head`` then ``piece`` until ``total`` bytes went out or the server stops reading."""
    sent = 0
    with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await stream.send_all(head)
        while sent < total:
            await stream.send_all(piece)
            sent += len(piece)
    return sent


@pytest.mark.parametrize("shape", ["many trailer lines", "one endless trailer value"])
async def test_400_mib_of_trailers_is_431_without_growing_memory(
    transport: str, tmp_path: Path, shape: str
) -> None:
    head = b"POST /t HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"
    if shape == "many trailer lines":
        piece = b"".join(b"X-T%d: %s\r\n" % (i, b"v" * 1000) for i in range(64))
    else:
        head += b"X-Endless: "
        piece = b"v" * 65536
    before = rss_bytes()
    async with running(transport, tmp_path) as stream:
        results: dict[str, object] = {}

        async def send() -> None:
            results["sent"] = await send_until_refused(stream, head, piece, 400 * 1024 * 1024)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            results["response"] = await read_until_closed(stream, timeout_s=30)
    response = results["response"]
    assert isinstance(response, bytes)
    assert response.startswith(b"HTTP/1.1 431 "), response[:80]
    assert rss_bytes() - before < 64 * 1024 * 1024


async def test_small_trailers_are_accepted(transport: str, tmp_path: Path) -> None:
    async with running(transport, tmp_path) as stream:
        await stream.send_all(
            b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\nX-Checksum: 1234\r\nX-Other: 5\r\n\r\n"
        )
        [response] = await read_responses(stream, 1)
        assert response.startswith(b"HTTP/1.1 200 ")
        assert response.endswith(b"len=3")


async def test_header_cap_holds_when_the_last_piece_completes_the_head(
    transport: str, tmp_path: Path
) -> None:
    # 60 KiB of headers, then 60 KiB more and the end of the head: 120 KiB in all.
    lines = b"".join(b"X-F%d: %s\r\n" % (i, b"y" * 1000) for i in range(60))
    async with running(transport, tmp_path) as stream:
        await stream.send_all(b"GET / HTTP/1.1\r\n" + lines)
        with suppress(trio.BrokenResourceError):
            await stream.send_all(lines.replace(b"X-F", b"X-G") + b"\r\n")
        response = await read_until_closed(stream)
        assert response.startswith(b"HTTP/1.1 431 "), response[:80]


@pytest.mark.parametrize(("filler_kib", "status"), [(62, b"200"), (65, b"431")])
async def test_header_cap_is_64_kib(
    transport: str, tmp_path: Path, filler_kib: int, status: bytes
) -> None:
    lines = b"".join(b"X-F%03d: %s\r\n" % (i, b"y" * 1014) for i in range(filler_kib))
    async with running(transport, tmp_path) as stream:
        with suppress(trio.BrokenResourceError):
            await stream.send_all(b"GET / HTTP/1.1\r\nConnection: close\r\n" + lines + b"\r\n")
        response = await read_until_closed(stream)
        assert response.startswith(b"HTTP/1.1 " + status + b" "), response[:80]


async def test_pipelined_small_requests_are_not_charged_to_each_other(
    transport: str, tmp_path: Path
) -> None:
    # 300 requests of ~600 header bytes each in one send: 180 KiB, each far below the cap.
    one = b"GET /p HTTP/1.1\r\nX-Pad: " + b"p" * 570 + b"\r\n\r\n"
    async with running(transport, tmp_path) as stream:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(stream.send_all, one * 300)
            responses = await read_responses(stream, 300)
        assert all(r.startswith(b"HTTP/1.1 200 ") for r in responses)


async def test_a_request_trickling_in_gets_408(transport: str, tmp_path: Path) -> None:
    # One byte every 0.8 s resets any per-receive timeout; the whole request has a deadline.
    limits = Limits(request_timeout_s=2.0, idle_timeout_s=60.0)
    async with running(transport, tmp_path, limits=limits) as stream:

        async def trickle() -> None:
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                for byte in b"GET / HTTP/1.1\r\nX-Slow: " + b"z" * 1000:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(0.8)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle)
            response = await read_until_closed(stream, timeout_s=30)
            nursery.cancel_scope.cancel()
        assert response.startswith(b"HTTP/1.1 408 "), response[:80]


async def test_a_slow_body_gets_408(transport: str, tmp_path: Path) -> None:
    limits = Limits(request_timeout_s=1.0)
    async with running(transport, tmp_path, limits=limits) as stream:
        await stream.send_all(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc")
        response = await read_until_closed(stream, timeout_s=30)
        assert response.startswith(b"HTTP/1.1 408 "), response[:80]


async def test_keep_alive_idle_time_is_not_a_request_timeout(
    transport: str, tmp_path: Path
) -> None:
    # Between requests only the idle timeout applies: a request after a pause still works.
    limits = Limits(request_timeout_s=0.2, idle_timeout_s=30.0)
    async with running(transport, tmp_path, limits=limits) as stream:
        for _ in range(2):
            await stream.send_all(b"GET /k HTTP/1.1\r\n\r\n")
            [response] = await read_responses(stream, 1)
            assert response.startswith(b"HTTP/1.1 200 ")
            await trio.sleep(0.4)


async def test_keep_alive_answers_say_how_long_an_idle_connection_stays(
    transport: str, tmp_path: Path
) -> None:
    limits = Limits(keep_alive_timeout_s=2.5)
    async with running(transport, tmp_path, limits=limits) as stream:
        await stream.send_all(b"GET /k HTTP/1.1\r\n\r\n")
        [kept] = await read_responses(stream, 1)
        assert b"\r\nKeep-Alive: timeout=2\r\n" in kept
        await stream.send_all(b"GET /c HTTP/1.1\r\nConnection: close\r\n\r\n")
        closing = await read_until_closed(stream)
        assert b"Keep-Alive" not in closing and b"Connection: close" in closing


async def test_a_connection_that_sends_nothing_is_closed_after_the_idle_timeout(
    transport: str, tmp_path: Path
) -> None:
    stats = ServerStats()
    limits = Limits(idle_timeout_s=0.3, request_timeout_s=30.0)
    async with running(transport, tmp_path, limits=limits, stats=stats) as stream:
        started = trio.current_time()
        assert await read_until_closed(stream) == b""  # closed without a word
        assert 0.3 <= trio.current_time() - started < 5
        assert stats.cuts == {"idle": 1}


async def test_a_slow_header_is_cut_at_the_header_deadline_not_the_request_one(
    transport: str, tmp_path: Path
) -> None:
    stats = ServerStats()
    limits = Limits(header_timeout_s=0.5, request_timeout_s=30.0)
    async with running(transport, tmp_path, limits=limits, stats=stats) as stream:
        await stream.send_all(b"GET / HTTP/1.1\r\nX-Slow: a")
        started = trio.current_time()
        response = await read_until_closed(stream)
        assert response.startswith(b"HTTP/1.1 408 "), response[:80]
        assert trio.current_time() - started < 5
        assert stats.cuts == {"header_timeout": 1}


async def big_answer(request: Request) -> Response:
    return Response(200, (), b"b" * 256 * 1024)


async def test_a_client_that_never_reads_is_dropped(transport: str, tmp_path: Path) -> None:
    stats = ServerStats()
    limits = Limits(send_timeout_s=0.5)
    async with trio.open_nursery() as nursery:
        if transport == "tcp":
            port = await nursery.start(
                functools.partial(
                    serve_http, big_answer, ("tcp", "127.0.0.1", 0), limits=limits, stats=stats
                )
            )
            sock = trio.socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await sock.connect(("127.0.0.1", port))
        else:
            path = str(tmp_path / "s.sock")
            await nursery.start(
                functools.partial(
                    serve_http, big_answer, ("unix", path), limits=limits, stats=stats
                )
            )
            sock = trio.socket.socket(socket.AF_UNIX)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await sock.connect(path)
        with sock:
            await sock.send(b"GET / HTTP/1.1\r\n\r\n" * 50)  # pipelined, never read
            with trio.fail_after(30):
                while stats.cuts.get("send_timeout", 0) == 0 or stats.open_connections:
                    await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert stats.cuts == {"send_timeout": 1}
    assert stats.refused == {}


async def test_a_full_listener_closes_its_oldest_idle_connection_and_refuses_only_when_all_answer(
    transport: str, tmp_path: Path
) -> None:
    stats = ServerStats()
    # Idle connections are this test's subject: closed only to make room, never for idleness (the
    # default first-byte timeout, 5 s, passed on a busy machine before the last assertion).
    limits = Limits(max_connections=3, idle_timeout_s=300.0)
    opened: list[trio.abc.Stream] = []  # closed whatever happens: no socket outlives the test
    release = trio.Event()
    holding = [0]

    async def app(request: Request) -> Response:
        if request.path == "/hold":
            holding[0] += 1
            await release.wait()
        return await echo(request)

    async with trio.open_nursery() as nursery:
        if transport == "tcp":
            port = await nursery.start(
                functools.partial(
                    serve_http, app, ("tcp", "127.0.0.1", 0), limits=limits, stats=stats
                )
            )

            async def connect() -> trio.abc.Stream:
                opened.append(await trio.open_tcp_stream("127.0.0.1", port))
                return opened[-1]
        else:
            path = str(tmp_path / "s.sock")
            await nursery.start(
                functools.partial(serve_http, app, ("unix", path), limits=limits, stats=stats)
            )

            async def connect() -> trio.abc.Stream:
                opened.append(await trio.open_unix_socket(path))
                return opened[-1]

        try:
            # One at a time, each seated before the next connects: the server's oldest is held[0]
            # (connections accepted together start their tasks in no set order).
            held = []
            for n in range(1, 4):
                held.append(await connect())
                with trio.fail_after(10):
                    while stats.open_connections < n:
                        await trio.sleep(0.01)
            # Full of idle connections: a new one is served, the oldest idle one is closed for it.
            async with await connect() as extra:
                await extra.send_all(b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\n")
                assert (await read_until_closed(extra)).startswith(b"HTTP/1.1 200 ")
            assert await read_until_closed(held[0]) == b""
            assert stats.cuts == {"evicted": 1}
            assert stats.refused == {}
            # The others still work.
            await held[1].send_all(b"GET /h HTTP/1.1\r\n\r\n")
            [ok] = await read_responses(held[1], 1)
            assert ok.startswith(b"HTTP/1.1 200 ")
            # Every seat busy answering: nobody to close, the new connection gets a 503.
            busy = [await connect() for _ in range(3)]
            for stream in busy:
                await stream.send_all(b"GET /hold HTTP/1.1\r\n\r\n")
            with trio.fail_after(10):
                while holding[0] < 3:
                    await trio.sleep(0.01)
            assert stats.cuts == {"evicted": 3}
            async with await connect() as refused:
                response = await read_until_closed(refused)
            assert response.startswith(b"HTTP/1.1 503 "), response[:80]
            assert stats.refused == {"connections": 1}
            release.set()
            for stream in busy:
                [ok] = await read_responses(stream, 1)
                assert ok.startswith(b"HTTP/1.1 200 ")
        finally:
            for stream in opened:
                await stream.aclose()
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------- watched waits


class Hold:
    """A handler whose ``/hold`` waits, watched (Request.watch_peer), until ``release`` is set;
    ``/hold-raise`` raises inside the watched wait. Other paths are `echo`."""

    def __init__(self) -> None:
        self.waiting = trio.Event()
        self.release = trio.Event()
        self.done = trio.Event()
        self.ended: list[str] = []  # how each watched wait ended
        self.requests: list[Request] = []

    async def __call__(self, request: Request) -> Response:
        if request.path == "/hold-raise":

            async def fail() -> str:
                raise KeyError("from the wait")

            try:
                await request.watch_peer(fail)
            except KeyError:  # as the wait raised it: not wrapped in an ExceptionGroup
                return Response(200, (), b"caught")
        if request.path != "/hold":
            return await echo(request)
        self.requests.append(request)

        async def wait() -> str:
            self.waiting.set()
            await self.release.wait()
            return "released"

        try:
            result = await request.watch_peer(wait)
        except PeerClosed:
            self.ended.append("closed")
            raise
        finally:
            self.done.set()
        self.ended.append(result)
        return Response(200, (), result.encode())


async def wait_pending(request: Request, n: int) -> None:
    """Wait until the server has read `n` bytes on `request`'s connection during its watch."""
    peer = request._peer
    assert peer is not None
    with trio.fail_after(5):
        while len(peer.pending) < n:
            await trio.sleep(0.01)


# A Unix socket has no reset: that pair is not generated (nothing skipped).
@pytest.mark.parametrize(
    ("transport", "close"), [("tcp", "eof"), ("tcp", "reset"), ("unix", "eof")]
)
async def test_a_watched_wait_is_cancelled_when_its_client_closes(
    transport: str, tmp_path: Path, close: str
) -> None:
    hold = Hold()
    stats = ServerStats()
    async with running(transport, tmp_path, handler=hold, stats=stats) as stream:
        await stream.send_all(b"GET /hold HTTP/1.1\r\n\r\n")
        with trio.fail_after(5):
            await hold.waiting.wait()
        assert isinstance(stream, trio.SocketStream)
        if close == "reset":
            stream.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()
        with trio.fail_after(5):
            await hold.done.wait()
            while stats.open_connections:  # and the server closed its side
                await trio.sleep(0.01)
        assert hold.ended == ["closed"]


async def test_requests_pipelined_during_a_watched_wait_are_kept_and_answered_after_it(
    transport: str, tmp_path: Path
) -> None:
    hold = Hold()
    async with running(transport, tmp_path, handler=hold) as stream:
        await stream.send_all(b"GET /hold HTTP/1.1\r\n\r\n")
        with trio.fail_after(5):
            await hold.waiting.wait()
        pipelined = b"GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nab"
        await stream.send_all(pipelined)
        await wait_pending(hold.requests[0], len(pipelined))  # read while the wait went on
        hold.release.set()
        await stream.send_all(b"c")  # the rest of the body, after the watch
        responses = await read_responses(stream, 3)
        assert [r.rsplit(b"\r\n\r\n", 1)[1] for r in responses] == [
            b"released",
            b"GET /a ? len=0",
            b"POST /b ? len=3",
        ]
        assert hold.ended == ["released"]


async def test_a_client_that_shuts_its_side_during_a_watched_wait_is_gone(
    transport: str, tmp_path: Path
) -> None:
    """EOF after a pipelined request: taken for a client that left (nothing answered)."""
    hold = Hold()
    async with running(transport, tmp_path, handler=hold) as stream:
        await stream.send_all(b"GET /hold HTTP/1.1\r\n\r\n")
        with trio.fail_after(5):
            await hold.waiting.wait()
        await stream.send_all(b"GET /a HTTP/1.1\r\n\r\n")
        await wait_pending(hold.requests[0], 1)
        assert isinstance(stream, trio.SocketStream)
        await stream.send_eof()
        assert await read_until_closed(stream) == b""
        assert hold.ended == ["closed"]


async def test_an_unwatched_handler_still_answers_a_client_that_shut_its_side(
    transport: str, tmp_path: Path
) -> None:
    async with running(transport, tmp_path, handler=Hold()) as stream:
        await stream.send_all(b"GET /slow HTTP/1.1\r\n\r\n")
        assert isinstance(stream, trio.SocketStream)
        await stream.send_eof()
        response = await read_until_closed(stream)
        assert response.startswith(b"HTTP/1.1 200 ")
        assert response.endswith(b"GET /slow ? len=0")


async def test_a_watched_wait_raises_what_it_raises_and_a_hand_made_request_just_waits(
    transport: str, tmp_path: Path
) -> None:
    async with running(transport, tmp_path, handler=Hold()) as stream:
        await stream.send_all(b"GET /hold-raise HTTP/1.1\r\n\r\n")
        [response] = await read_responses(stream, 1)
        assert response.endswith(b"\r\n\r\ncaught")

    async def value() -> int:
        await trio.lowlevel.checkpoint()
        return 7

    assert await Request("GET", "/", "", (), b"").watch_peer(value) == 7
