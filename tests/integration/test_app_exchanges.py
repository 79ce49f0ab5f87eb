"""The app client's pool (sidecar.http.exchanges) against real servers on TCP and Unix sockets:
many requests in flight on one reader task, answers handed to callbacks, idle connections the app
closes dropped at once, requests larger than a socket buffer, and a callback that raises."""

from __future__ import annotations

import trio

from sidecar.core.wire import Answer
from sidecar.http.appclient import AppClient, AppNotReachable, AppTarget
from sidecar.http.exchanges import RawResponse, Result
from tests.harness import wait_until
from tests.integration.test_appclient import (
    OK,
    REQUEST,
    RequestReader,
    Stats,
    answer_ok_forever,
    make_record,
    raw_server,
    transport,
)

__all__ = ["transport"]  # the fixture, imported for the tests below


async def test_many_requests_share_one_reader_and_each_callback_runs_once(transport: str) -> None:
    async with raw_server(answer_ok_forever, transport) as server:
        client = AppClient(server.target)
        rounds: list[int] = []
        answers: dict[int, list[Answer | AppNotReachable]] = {i: [] for i in range(200)}
        client.pool.after_round = lambda: rounds.append(sum(map(len, answers.values())))
        # 20 connections' worth at a time, 10 rounds, all started from this task without awaiting.
        for base in range(0, 200, 20):
            for i in range(base, base + 20):
                client.start_single(
                    make_record(offset=i, delivery_id=f"d{i}"), 5.0, answers[i].append
                )
            await wait_until(
                lambda b=base: all(answers[i] for i in range(b, b + 20)), 10, "20 answers"
            )
        assert all(len(got) == 1 for got in answers.values())
        assert all(
            isinstance(got[0], Answer) and got[0].ack == "accept" for got in answers.values()
        )
        assert server.stats.requests == 200
        # Keep-alive: no more connections than requests at once.
        assert client.connections_opened <= 20
        # One call per wake-up that completed something, after its callbacks: never more calls
        # than answers, and the last one saw them all.
        assert 1 <= len(rounds) <= 200 and rounds[-1] == 200
        await client.aclose()


async def test_an_idle_connection_the_app_closes_leaves_the_pool_at_once(transport: str) -> None:
    async def answer_once_then_close(
        stream: trio.SocketStream, reader: RequestReader, stats: Stats
    ) -> None:
        await reader.read()
        stats.requests += 1
        await stream.send_all(OK)
        await trio.sleep(0.2)  # idle, then the app's keep-alive timeout closes it

    async with (
        raw_server(answer_once_then_close, transport) as server,
        AppClient(server.target) as client,
    ):
        response = await client.send(REQUEST, timeout_s=5)
        assert response.status == 200
        assert client.pool.idle_connections() == 1
        # No request needed to notice: the EOF is an event on the pool's epoll set.
        await wait_until(lambda: client.pool.idle_connections() == 0, 5, "the idle one dropped")
        response = await client.send(REQUEST, timeout_s=5)
        assert response.status == 200
        assert client.connections_opened == 2 and server.stats.requests == 2


async def test_a_request_larger_than_the_socket_buffers_is_sent_in_pieces(transport: str) -> None:
    body = bytes(range(256)) * (16 * 1024)  # 4 MiB
    request = (b"POST /r HTTP/1.1\r\nHost: test\r\nContent-Length: %d\r\n\r\n" % len(body)) + body

    async def read_slowly(stream: trio.SocketStream, reader: RequestReader, stats: Stats) -> None:
        received = b""
        while len(received) < len(request):
            data = await stream.receive_some(256 * 1024)
            if not data:
                return
            received += data
            await trio.sleep(0.01)  # the client's send buffer fills meanwhile
        stats.requests += 1
        stats.bodies.append(received)
        await stream.send_all(OK)

    async with raw_server(read_slowly, transport) as server, AppClient(server.target) as client:
        response = await client.send(request, timeout_s=30)
        assert (response.status, response.body) == (200, b"ok")
        assert server.stats.bodies == [request]


async def test_a_callback_that_raises_is_reported_and_the_others_still_run(transport: str) -> None:
    async with raw_server(answer_ok_forever, transport) as server:
        client = AppClient(server.target)
        errors: list[BaseException] = []
        client.pool.on_error = errors.append
        results: list[Result] = []

        def broken(_result: Result) -> None:
            raise ZeroDivisionError("a bug in the caller")

        client.pool.start(REQUEST, 5.0, broken)
        client.pool.start(REQUEST, 5.0, results.append)
        await wait_until(lambda: bool(errors) and bool(results), 10, "both callbacks")
        assert isinstance(errors[0], ZeroDivisionError)
        assert isinstance(results[0], RawResponse) and results[0].status == 200
        await client.aclose()


async def test_not_reachable_is_told_to_the_callback_later_never_inside_start() -> None:
    client = AppClient(AppTarget(port=1))  # nothing listens on port 1
    got: list[Answer | AppNotReachable] = []
    client.start_single(make_record(), 5.0, got.append)
    assert got == []  # never from inside start
    await wait_until(lambda: bool(got), 10, "the callback")
    assert isinstance(got[0], AppNotReachable)
    await client.aclose()
