"""AppClient against real servers on TCP loopback and Unix sockets.

Most servers here are hand-written on raw trio streams so that they can misbehave on purpose
(close early, reset, stall, send garbage); one test uses sidecar.http.server for a full round
trip of the wire contract.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import pytest
import trio

from sidecar.core.wire import AppError, RecordView, decode_kafka_header
from sidecar.http.appclient import (
    APP_CONNECTION_LOST,
    APP_TIMEOUT,
    MALFORMED_RESPONSE,
    AppClient,
    AppNotReachable,
    AppRequestFailed,
    AppTarget,
)
from sidecar.http.server import Request, Response, json_response, serve_http
from tests.harness import wait_until

REQUEST = b"POST /r HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n\r\nhello"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class RequestReader:
    """Reads whole requests (Content-Length framed) off a raw stream."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def read(self) -> bytes | None:
        while b"\r\n\r\n" not in self.buffer:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.buffer += data
        head, _, rest = self.buffer.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(rest) < length:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            rest += data
        self.buffer = rest[length:]
        return head + b"\r\n\r\n" + rest[:length]


Behaviour = Callable[[trio.SocketStream, RequestReader, "Stats"], Awaitable[None]]


@dataclass
class Stats:
    connections: int = 0
    requests: int = 0
    concurrent: int = 0
    max_concurrent: int = 0
    closed_by_peer: int = 0
    bodies: list[bytes] = field(default_factory=list)


@dataclass
class RawServer:
    target: AppTarget
    stats: Stats


@asynccontextmanager
async def raw_server(behaviour: Behaviour, transport: str) -> AsyncIterator[RawServer]:
    stats = Stats()

    async def handle(stream: trio.SocketStream) -> None:
        stats.connections += 1
        try:
            await behaviour(stream, RequestReader(stream), stats)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    with tempfile.TemporaryDirectory() as directory:
        if transport == "tcp":
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            port = listeners[0].socket.getsockname()[1]
            target = AppTarget(host="127.0.0.1", port=port, path="/r")
        else:
            path = os.path.join(directory, "app.sock")
            sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            await sock.bind(path)
            sock.listen(128)
            listeners = [trio.SocketListener(sock)]
            target = AppTarget(unix_path=path, path="/r")
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, handle, listeners)
            yield RawServer(target, stats)
            nursery.cancel_scope.cancel()


async def answer_ok_forever(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
    while (request := await reader.read()) is not None:
        stats.requests += 1
        stats.bodies.append(request)
        await stream.send_all(OK)
    stats.closed_by_peer += 1


@pytest.fixture(params=["tcp", "unix"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_record(**changes: object) -> RecordView:
    fields: dict[str, object] = {
        "topic": "orders",
        "partition": 1,
        "offset": 7,
        "key": b"k",
        "value": b"v",
        "timestamp_ms": 1,
        "timestamp_type": "create",
        "headers": (),
        "delivery_count": 1,
        "delivery_id": "orders-1-7-1",
    }
    fields.update(changes)
    return RecordView(**fields)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Keep-alive and framing


async def test_keep_alive_reuses_one_connection(transport: str) -> None:
    async with raw_server(answer_ok_forever, transport) as server:
        async with AppClient(server.target, max_connections=4) as client:
            for _ in range(25):
                response = await client.send(REQUEST, timeout_s=5)
                assert (response.status, response.body) == (200, b"ok")
                assert response.headers == [(b"content-length", b"2")]
            assert client.connections_opened == 1
        assert server.stats.connections == 1
        assert server.stats.requests == 25
        assert server.stats.bodies[0] == REQUEST


async def test_chunked_answer_across_many_sends(transport: str) -> None:
    async def chunked(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        while await reader.read() is not None:
            await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in (b"5\r\nhello\r\n", b"1", b"\r\n \r\n", b"5\r\nworld\r\n", b"0\r\n\r\n"):
                await trio.sleep(0.005)
                await stream.send_all(piece)

    async with raw_server(chunked, transport) as server, AppClient(server.target) as client:
        for _ in range(3):
            response = await client.send(REQUEST, timeout_s=5)
            assert response.body == b"hello world"
        assert client.connections_opened == 1


async def test_connection_close_is_honoured(transport: str) -> None:
    async def close_each(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        await stream.send_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx")
        # Keep the socket open: the client must close because of the header, not of EOF.
        await trio.sleep(10)

    async with raw_server(close_each, transport) as server, AppClient(server.target) as client:
        for _ in range(3):
            assert (await client.send(REQUEST, timeout_s=5)).body == b"x"
        assert client.connections_opened == 3
        assert server.stats.connections == 3


async def test_http_1_0_answer_is_not_reused(transport: str) -> None:
    async def http10(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        await stream.send_all(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx")
        await trio.sleep(10)

    async with raw_server(http10, transport) as server, AppClient(server.target) as client:
        for _ in range(2):
            assert (await client.send(REQUEST, timeout_s=5)).status == 200
        assert client.connections_opened == 2


async def test_body_delimited_by_eof(transport: str) -> None:
    async def eof_body(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        await stream.send_all(b"HTTP/1.1 500 Oops\r\nContent-Type: text/plain\r\n\r\nstack")
        await trio.sleep(0.01)
        await stream.send_all(b" trace")

    async with raw_server(eof_body, transport) as server, AppClient(server.target) as client:
        response = await client.send(REQUEST, timeout_s=5)
        assert (response.status, response.body) == (500, b"stack trace")
        response = await client.send(REQUEST, timeout_s=5)
        assert response.body == b"stack trace"
        assert client.connections_opened == 2


async def test_interim_100_continue_is_skipped(transport: str) -> None:
    async def interim(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        while await reader.read() is not None:
            await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n")
            await stream.send_all(b"Link: </a>\r\n\r\n" + OK)

    async with raw_server(interim, transport) as server, AppClient(server.target) as client:
        for _ in range(2):
            response = await client.send(REQUEST, timeout_s=5)
            assert (response.status, response.body) == (200, b"ok")
            assert (b"link", b"</a>") not in response.headers
        assert client.connections_opened == 1


async def test_bytes_after_the_answer_make_the_connection_unusable(transport: str) -> None:
    async def extra(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        while await reader.read() is not None:
            await stream.send_all(OK + b"HTTP/1.1 200 OK\r\n")

    async with raw_server(extra, transport) as server, AppClient(server.target) as client:
        for _ in range(2):
            assert (await client.send(REQUEST, timeout_s=5)).body == b"ok"
        assert client.connections_opened == 2


# ---------------------------------------------------------------------------------------------
# Failures after sending: attempts


async def test_reset_mid_response_is_a_failed_request(transport: str) -> None:
    async def reset(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Len")
        await trio.sleep(0.01)
        # SO_LINGER with a zero timeout turns close() into a TCP RST (plain EOF on Unix).
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stream.socket.close()

    async with raw_server(reset, transport) as server, AppClient(server.target) as client:
        with pytest.raises(AppRequestFailed) as caught:
            await client.send(REQUEST, timeout_s=5)
        assert caught.value.class_name == APP_CONNECTION_LOST
        assert server.stats.connections == 1  # no retry: a response byte had arrived


async def test_eof_before_the_full_body_is_a_failed_request(transport: str) -> None:
    async def truncated(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")

    async with raw_server(truncated, transport) as server, AppClient(server.target) as client:
        with pytest.raises(AppRequestFailed) as caught:
            await client.send(REQUEST, timeout_s=5)
        assert caught.value.class_name == APP_CONNECTION_LOST
        assert "bytes of its answer" in caught.value.message


async def test_close_without_answer_on_a_fresh_connection_is_not_retried(transport: str) -> None:
    async def hang_up(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        stats.requests += 1

    async with raw_server(hang_up, transport) as server, AppClient(server.target) as client:
        with pytest.raises(AppRequestFailed) as caught:
            await client.send(REQUEST, timeout_s=5)
        assert caught.value.class_name == APP_CONNECTION_LOST
        assert server.stats.requests == 1
        assert server.stats.connections == 1


async def test_stale_keep_alive_connection_is_retried_once_on_a_fresh_one(transport: str) -> None:
    async def one_then_hang_up(
        stream: trio.SocketStream, reader: RequestReader, stats: Stats
    ) -> None:
        # Answers one request with keep-alive, then closes the idle connection, as servers
        # with a short keep-alive timeout do.
        await reader.read()
        stats.requests += 1
        await stream.send_all(OK)

    async with raw_server(one_then_hang_up, transport) as server:
        async with AppClient(server.target) as client:
            assert (await client.send(REQUEST, timeout_s=5)).body == b"ok"
            await trio.sleep(0.05)  # let the server's close arrive
            assert (await client.send(REQUEST, timeout_s=5)).body == b"ok"
            assert client.connections_opened == 2
        assert server.stats.requests == 2


async def test_slow_server_times_out(transport: str) -> None:
    async def slow(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        while await reader.read() is not None:
            stats.requests += 1
            if stats.requests == 1:
                await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
                await trio.sleep(10)
            await stream.send_all(OK)

    async with raw_server(slow, transport) as server, AppClient(server.target) as client:
        started = trio.current_time()
        with pytest.raises(AppRequestFailed) as caught:
            await client.send(REQUEST, timeout_s=0.2)
        assert caught.value.class_name == APP_TIMEOUT
        assert 0.2 <= trio.current_time() - started < 5  # the server would answer after 10 s
        # The timed-out connection is discarded, not reused half-read.
        assert (await client.send(REQUEST, timeout_s=5)).body == b"ok"
        assert client.connections_opened == 2


async def test_a_shorter_timeout_started_later_fires_first(transport: str) -> None:
    # The watchdog sleeps until the earliest deadline it knows: a request with a sooner one wakes it.
    async def never(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        while await reader.read() is not None:
            stats.requests += 1
        await trio.sleep(30)

    async with raw_server(never, transport) as server, AppClient(server.target) as client:
        outcome: dict[str, float] = {}

        async def slow_one() -> None:
            with pytest.raises(AppRequestFailed) as caught:
                await client.send(REQUEST, timeout_s=20)
            assert caught.value.class_name == APP_TIMEOUT

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_one)
            await wait_until(lambda: server.stats.requests == 1, 5, "the first request")
            started = trio.current_time()
            with pytest.raises(AppRequestFailed) as caught:
                await client.send(REQUEST, timeout_s=0.3)
            outcome["short"] = trio.current_time() - started
            assert caught.value.class_name == APP_TIMEOUT
            nursery.cancel_scope.cancel()
        assert 0.3 <= outcome["short"] < 5


async def test_a_trickling_answer_times_out_at_the_deadline(transport: str) -> None:
    # Bytes keep coming, each before the deadline: the exchange waits again and again on its
    # socket, and the deadline still ends it.
    async def trickle(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(200):
            await trio.sleep(0.05)
            await stream.send_all(b"x")

    async with raw_server(trickle, transport) as server, AppClient(server.target) as client:
        started = trio.current_time()
        with pytest.raises(AppRequestFailed) as caught:
            await client.send(REQUEST, timeout_s=0.5)
        assert caught.value.class_name == APP_TIMEOUT
        assert 0.5 <= trio.current_time() - started < 5


def test_one_client_serves_two_trio_runs(transport: str) -> None:
    # The pool's reader (and its timeouts) belongs to a trio run: a client used in a second run
    # gets a new one, and drops the connections of the first (they cannot be waited on).
    async def once(client: AppClient) -> None:
        async def slow(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
            await reader.read()
            await trio.sleep(10)

        async with raw_server(slow, transport) as server:
            client.target = server.target
            with pytest.raises(AppRequestFailed) as caught:
                await client.send(REQUEST, timeout_s=0.2)
            assert caught.value.class_name == APP_TIMEOUT

    client = AppClient(AppTarget(port=1))
    trio.run(once, client)
    trio.run(once, client)


@pytest.mark.parametrize(
    "garbage",
    [
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
    ],
)
async def test_garbage_is_a_malformed_response(transport: str, garbage: bytes) -> None:
    async def junk(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        await stream.send_all(garbage)
        await trio.sleep(10)

    async with raw_server(junk, transport) as server, AppClient(server.target) as client:
        with pytest.raises(AppRequestFailed) as caught:
            await client.send(REQUEST, timeout_s=5)
        assert caught.value.class_name == MALFORMED_RESPONSE


async def test_oversized_body_is_a_malformed_response(transport: str) -> None:
    async def big(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(20):
            await stream.send_all(b"400\r\n" + b"x" * 1024 + b"\r\n")
        await trio.sleep(10)

    async with raw_server(big, transport) as server:
        async with AppClient(server.target, max_body_bytes=8 * 1024) as client:
            with pytest.raises(AppRequestFailed) as caught:
                await client.send(REQUEST, timeout_s=5)
        assert caught.value.class_name == MALFORMED_RESPONSE
        assert "8192" in caught.value.message


# ---------------------------------------------------------------------------------------------
# Connection failures: not attempts


async def test_nothing_listening_on_tcp_is_not_reachable() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    async with AppClient(AppTarget(port=port)) as client:
        with pytest.raises(AppNotReachable, match="cannot connect"):
            await client.send(REQUEST, timeout_s=5)
        with pytest.raises(AppNotReachable):
            await client.deliver(make_record(), timeout_s=5)


async def test_missing_or_dead_unix_socket_is_not_reachable(tmp_path: os.PathLike[str]) -> None:
    missing = os.path.join(tmp_path, "nope.sock")
    async with AppClient(AppTarget(unix_path=missing)) as client:
        with pytest.raises(AppNotReachable, match=r"nope\.sock"):
            await client.send(REQUEST, timeout_s=5)
    # A socket file left behind by a dead app: connect() is refused.
    dead = os.path.join(tmp_path, "dead.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(dead)
    sock.close()
    async with AppClient(AppTarget(unix_path=dead)) as client:
        with pytest.raises(AppNotReachable):
            await client.send(REQUEST, timeout_s=5)


async def test_connect_timeout_is_not_reachable() -> None:
    # A listener that never accepts, with its queue full: further connects hang in SYN_SENT.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            with suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        async with AppClient(AppTarget(port=port), connect_timeout_s=0.3) as client:
            started = trio.current_time()
            with pytest.raises(AppNotReachable, match="timed out"):
                await client.send(REQUEST, timeout_s=5)
            assert trio.current_time() - started < 4  # the request timeout is 5 s
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


# ---------------------------------------------------------------------------------------------
# Pool behaviour


async def test_64_in_flight_use_64_connections(transport: str) -> None:
    async def slow_ok(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        while await reader.read() is not None:
            stats.concurrent += 1
            stats.max_concurrent = max(stats.max_concurrent, stats.concurrent)
            await trio.sleep(0.05)
            stats.concurrent -= 1
            stats.requests += 1
            await stream.send_all(OK)

    async with raw_server(slow_ok, transport) as server:
        async with AppClient(server.target, max_connections=64) as client:
            results: list[int] = []

            async def one() -> None:
                for _ in range(3):
                    results.append((await client.send(REQUEST, timeout_s=10)).status)

            started = trio.current_time()
            async with trio.open_nursery() as nursery:
                for _ in range(64):
                    nursery.start_soon(one)
            elapsed = trio.current_time() - started
            assert results == [200] * 192
            assert client.connections_opened == 64
        assert server.stats.max_concurrent == 64
        assert elapsed < 6  # 192 requests x 50 ms serially would take 9.6 s


async def test_pool_bounds_in_flight_requests(transport: str) -> None:
    async def slow_ok(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        while await reader.read() is not None:
            stats.concurrent += 1
            stats.max_concurrent = max(stats.max_concurrent, stats.concurrent)
            await trio.sleep(0.02)
            stats.concurrent -= 1
            await stream.send_all(OK)

    async with raw_server(slow_ok, transport) as server:
        async with AppClient(server.target, max_connections=4) as client:
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(client.send, REQUEST, 10)
            assert client.connections_opened == 4
        assert server.stats.max_concurrent == 4


async def test_idle_connections_expire(transport: str) -> None:
    async with (
        raw_server(answer_ok_forever, transport) as server,
        AppClient(server.target, idle_timeout_s=0.05) as client,
    ):
        await client.send(REQUEST, timeout_s=5)
        await trio.sleep(0.1)
        await client.send(REQUEST, timeout_s=5)
        assert client.connections_opened == 2


async def test_aclose_closes_idle_connections(transport: str) -> None:
    async with raw_server(answer_ok_forever, transport) as server:
        client = AppClient(server.target)
        await client.send(REQUEST, timeout_s=5)
        await client.aclose()
        await wait_until(lambda: server.stats.closed_by_peer == 1, 10, "the server to see EOF")
        with pytest.raises(RuntimeError):
            await client.send(REQUEST, timeout_s=5)


async def test_cancelled_request_discards_its_connection(transport: str) -> None:
    async def slow_first(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        while await reader.read() is not None:
            stats.requests += 1
            if stats.requests == 1:
                await trio.sleep(10)  # answers after the cancel, whatever the load
            await stream.send_all(OK)

    async with raw_server(slow_first, transport) as server, AppClient(server.target) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send, REQUEST, 5)
            # Cancelled while it waits for its answer: the server has the request.
            await wait_until(lambda: server.stats.requests == 1, 10, "the first request")
            nursery.cancel_scope.cancel()
        # A late answer to the cancelled request must not be read as this request's answer.
        assert (await client.send(REQUEST, timeout_s=5)).body == b"ok"
        assert client.connections_opened == 2


# ---------------------------------------------------------------------------------------------
# deliver(): the wire contract end to end, against sidecar.http.server


@asynccontextmanager
async def http_app(
    handler: Callable[[Request], Awaitable[Response]], transport: str
) -> AsyncIterator[AppTarget]:
    with tempfile.TemporaryDirectory() as directory:
        async with trio.open_nursery() as nursery:
            if transport == "tcp":
                port = await nursery.start(serve_http, handler, ("tcp", "127.0.0.1", 0))
                yield AppTarget(port=port, path="/records", extra_headers=(("X-Token", "t"),))
            else:
                path = await nursery.start(
                    serve_http, handler, ("unix", os.path.join(directory, "a.sock"))
                )
                yield AppTarget(unix_path=path, path="/records", extra_headers=(("X-Token", "t"),))
            nursery.cancel_scope.cancel()


async def test_deliver_round_trip_through_httpserver(transport: str) -> None:
    seen: list[Request] = []

    async def app(request: Request) -> Response:
        seen.append(request)
        if request.header("kafka-value-null") == "true":
            return Response(500, body=b"cannot handle null")
        if request.body == b"poison":
            return json_response(
                {"ack": "reject", "error": {"class": "app.Poison", "message": "no"}}
            )
        return Response(204)

    record = make_record(value=b"\x00binary\xff", headers=(("h", b"1"), ("h", None)), key=b"\x01")
    async with http_app(app, transport) as target, AppClient(target) as client:
        ok = await client.deliver(record, timeout_s=5)
        rejected = await client.deliver(make_record(value=b"poison"), timeout_s=5)
        released = await client.deliver(make_record(value=None), timeout_s=5)
        assert client.connections_opened == 1
    assert ok.ack == "accept"
    assert rejected.ack == "reject"
    assert rejected.error == AppError("app.Poison", "no")
    assert released.ack == "release"
    assert released.error == AppError("sidecar.HttpStatus500", "cannot handle null")
    first = seen[0]
    assert first.method == "POST" and first.path == "/records"
    assert first.body == b"\x00binary\xff"
    assert first.header("x-token") == "t"
    assert first.header("kafka-key-encoding") == "base64"
    assert [decode_kafka_header(v) for v in first.header_values("kafka-header")] == [
        ("h", b"1"),
        ("h", None),
    ]


async def test_deliver_turns_transport_failures_into_a_release(transport: str) -> None:
    async def stall(request: Request) -> Response:
        await trio.sleep(10)
        return Response(200)

    async with http_app(stall, transport) as target, AppClient(target) as client:
        result = await client.deliver(make_record(), timeout_s=0.1)
    assert result.ack == "release"
    assert result.error is not None and result.error.class_name == APP_TIMEOUT


async def test_deliver_uses_the_status_mapping(transport: str) -> None:
    async def teapot(request: Request) -> Response:
        return Response(418)

    async with (
        http_app(teapot, transport) as target,
        AppClient(target, status_mapping={418: "reject"}) as client,
    ):
        assert (await client.deliver(make_record(), timeout_s=5)).ack == "reject"


async def test_deliver_batch_round_trip(transport: str) -> None:
    async def app(request: Request) -> Response:
        records = json.loads(request.body)["records"]
        results = [
            {"id": r["id"], "ack": "accept" if r["offset"] % 2 == 0 else "reject"}
            for r in records[:-1]
        ]
        return json_response({"results": results})

    records = [make_record(offset=o, delivery_id=f"d-{o}") for o in range(4)]
    async with http_app(app, transport) as target, AppClient(target) as client:
        answers = await client.deliver_batch(records, timeout_s=5)
    assert {k: v.ack for k, v in answers.items()} == {
        "d-0": "accept",
        "d-1": "reject",
        "d-2": "accept",
        "d-3": "release",
    }


async def test_full_unix_backlog_is_waited_out_not_counted_as_an_attempt() -> None:
    """A Unix listener with a tiny backlog that accepts late: every request still gets its answer.

    A full backlog makes connect() fail with EAGAIN; the client must not send on the half-made
    socket (that would fail after the request was "sent" and count as an attempt).
    """
    path = os.path.join(tempfile.mkdtemp(prefix="backlog-"), "app.sock")
    listener_sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await listener_sock.bind(path)
    listener_sock.listen(1)
    listener = trio.SocketListener(listener_sock)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    async def serve(stream: trio.SocketStream) -> None:
        async with stream:
            buf = b""
            while b"\r\n\r\n" not in buf:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buf += data
            head, _, body = buf.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            while len(body) < length:
                body += await stream.receive_some(65536)
            await stream.send_all(answer)

    async with trio.open_nursery() as nursery:

        async def accept_late() -> None:
            await trio.sleep(0.3)  # let the backlog overflow first
            await trio.serve_listeners(serve, [listener], handler_nursery=nursery)

        nursery.start_soon(accept_late)
        client = AppClient(
            AppTarget(unix_path=path, path="/"), max_connections=16, connect_timeout_s=5
        )
        statuses: list[int] = []

        async def one() -> None:
            resp = await client.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx", 5)
            statuses.append(resp.status)

        async with trio.open_nursery() as senders:
            for _ in range(16):
                senders.start_soon(one)
        await client.aclose()
        nursery.cancel_scope.cancel()
    assert statuses == [200] * 16


# ---------------------------------------------------------------------------------------------
# Hard limits on an answer: head plus trailers, counted on the wire


async def test_endless_trailers_are_a_malformed_response(transport: str) -> None:
    async def trailers(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n"
        )
        line = b"".join(b"X-T%d: %s\r\n" % (i, b"v" * 1000) for i in range(64))
        for _ in range(400 * 16):  # up to 400 MiB, unless the client stops reading
            await stream.send_all(line)

    async with raw_server(trailers, transport) as server, AppClient(server.target) as client:
        with pytest.raises(AppRequestFailed) as caught:
            await client.send(REQUEST, timeout_s=30)
        assert caught.value.class_name == MALFORMED_RESPONSE
        assert "trailers" in caught.value.message


async def test_one_endless_trailer_value_is_a_malformed_response(transport: str) -> None:
    async def trailer(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-E: "
        )
        for _ in range(400 * 16):
            await stream.send_all(b"v" * 65536)

    async with raw_server(trailer, transport) as server, AppClient(server.target) as client:
        with pytest.raises(AppRequestFailed) as caught:
            await client.send(REQUEST, timeout_s=30)
        assert caught.value.class_name == MALFORMED_RESPONSE


async def test_small_trailers_are_fine(transport: str) -> None:
    async def trailer(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        while await reader.read() is not None:
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"2\r\nok\r\n0\r\nX-Checksum: 1\r\n\r\n"
            )

    async with raw_server(trailer, transport) as server, AppClient(server.target) as client:
        response = await client.send(REQUEST, timeout_s=5)
        assert (response.status, response.body) == (200, b"ok")
        assert b"x-checksum" not in dict(response.headers)


@pytest.mark.parametrize(("filler_kib", "ok"), [(62, True), (65, False), (120, False)])
async def test_answer_header_cap_is_64_kib(transport: str, filler_kib: int, ok: bool) -> None:
    # The head arrives in two sends, the second completing it: the cap counts both.
    lines = b"".join(b"X-F%03d: %s\r\n" % (i, b"y" * 1014) for i in range(filler_kib))
    half = len(lines) // 2

    async def big_head(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        await reader.read()
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + lines[:half])
        await trio.sleep(0.05)
        await stream.send_all(lines[half:] + b"\r\nok")
        await trio.sleep(10)

    async with raw_server(big_head, transport) as server, AppClient(server.target) as client:
        if ok:
            assert (await client.send(REQUEST, timeout_s=5)).body == b"ok"
        else:
            with pytest.raises(AppRequestFailed) as caught:
                await client.send(REQUEST, timeout_s=5)
            assert caught.value.class_name == MALFORMED_RESPONSE
