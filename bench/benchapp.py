"""The benchmark's app: a minimal HTTP/1.1 server that answers every delivery at once.

Run as ``python -m bench.benchapp --tcp-port 0 --unix PATH``; it prints ``{"port": N}`` on
stdout once both listeners are up and serves until stdin closes. One process listens on TCP
loopback and on a Unix socket, so every scenario talks to the same app.

It is asyncio + httptools (llhttp) on purpose: the app must cost as little CPU as possible so
the figures measure the sidecar, not the app (``sidecar.http.server`` on trio is the more
general server, about three times the CPU per request). It imports nothing from ``sidecar``.

What it does per ``POST`` (any path but ``/stats`` and ``/reset``):
- counts requests and records (a batch body counts its ``"id":`` occurrences), first and last
  receive time (``time.monotonic_ns``, which is one clock for every process on Linux);
- with ``/reset?latency=1``, reads the ``bench-ts`` record header (monotonic ns at produce
  time; a ``Kafka-Header`` line in single mode, a base64 header in a batch) and keeps
  receive - produce per record;
- with ``/reset?fail=1`` (single mode), answers 422 (reject) for 5 % of offsets and 503
  (release) for another 5 % on their first delivery, 200 for the rest;
- with ``/reset?delay_ms=N``, answers N ms later (the slow app of the backlog test);
- with ``/reset?killer=1`` (single mode, the crash-isolation test), notes every delivery's
  partition, offset and ``Kafka-Delivery-Count`` (how many other records came with a count above
  1); a record whose value starts with
  ``bench-kill`` makes it SIGKILL the sidecar whose pid ``POST /killer?pid=N`` named last
  (set again after each restart; ``/killer`` keeps the counters). Without a pid it answers 200.
``GET /stats`` returns the counters as JSON; ``POST /reset?...`` clears them and sets the mode.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import signal
import sys
import time
from urllib.parse import parse_qs

import httptools

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
REJECT = b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: 0\r\n\r\n"
RELEASE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
TS_HEADER = b"bench-ts="
TS_NAME = "bench-ts"
KILL_VALUE = b"bench-kill"
FAIL_PERCENT = 5  # rejects; the same share again is released once


class Stats:
    def __init__(self) -> None:
        self.reset({})

    def reset(self, query: dict[str, list[str]]) -> None:
        self.requests = 0
        self.records = 0
        self.first_ns = 0
        self.last_ns = 0
        self.rejected = 0
        self.released = 0
        self.span_exports = 0
        self.latency = query.get("latency", ["0"])[0] == "1"
        self.fail = query.get("fail", ["0"])[0] == "1"
        self.delay_s = int(query.get("delay_ms", ["0"])[0]) / 1000
        self.latencies_ns: list[int] = []
        self.killer = query.get("killer", ["0"])[0] == "1"
        self.kill_pid = 0
        self.kills = 0
        self.killer_counts: list[int] = []  # Kafka-Delivery-Count of each delivery of the killer
        # (partition, offset) -> the highest Kafka-Delivery-Count it was delivered with
        self.seen: dict[tuple[int, int], int] = {}
        self.killer_at: tuple[int, int] | None = None
        self.deliveries = 0

    def as_json(self) -> bytes:
        return json.dumps(
            {
                "requests": self.requests,
                "records": self.records,
                "first_ns": self.first_ns,
                "last_ns": self.last_ns,
                "rejected": self.rejected,
                "released": self.released,
                "span_exports": self.span_exports,
                "latencies_ns": self.latencies_ns,
                "kills": self.kills,
                "killer_counts": self.killer_counts,
                "distinct_seen": len(self.seen),
                "innocent_counts_raised": sum(
                    1 for at, count in self.seen.items() if count > 1 and at != self.killer_at
                ),
                "deliveries": self.deliveries,
            }
        ).encode()


STATS = Stats()


def fate(partition: int, offset: int, delivery_count: int) -> bytes:
    """The answer to one record in fail mode: deterministic, so every run fails the same ones."""
    bucket = (offset * 7919 + partition * 104729) % 100
    if bucket < FAIL_PERCENT:
        STATS.rejected += 1
        return REJECT
    if bucket < 2 * FAIL_PERCENT and delivery_count == 1:
        STATS.released += 1
        return RELEASE
    return OK


class Connection(asyncio.Protocol):
    """One keep-alive connection; the sidecar sends one request at a time on it."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.partition = 0
        self.offset = 0
        self.delivery_count = 1
        self.ts_ns = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []
        self.ts_ns = 0
        self.delivery_count = 1

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # Only what a mode needs is looked at: the app must stay cheap.
        if STATS.latency and value.startswith(TS_HEADER):
            self.ts_ns = int(value[len(TS_HEADER) :])
        elif STATS.fail or STATS.killer:
            lowered = name.lower()
            if lowered == b"kafka-partition":
                self.partition = int(value)
            elif lowered == b"kafka-offset":
                self.offset = int(value)
            elif lowered == b"kafka-delivery-count":
                self.delivery_count = int(value)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        now = time.monotonic_ns()
        method = self.parser.get_method()
        path, _, query = self.url.partition(b"?")
        if path == b"/stats":
            body = STATS.as_json()
            self.reply(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            return
        if path == b"/reset":
            STATS.reset(parse_qs(query.decode()))
            self.reply(OK)
            return
        if path == b"/killer":
            STATS.kill_pid = int(parse_qs(query.decode()).get("pid", ["0"])[0])
            self.reply(OK)
            return
        if path == b"/v1/traces":
            # The OTLP/HTTP receiver of the tracing scenarios: spans are accepted and dropped
            # (an empty body is an empty ExportTraceServiceResponse).
            STATS.span_exports += 1
            self.reply(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
            )
            return
        if method != b"POST":
            self.reply(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        STATS.requests += 1
        if STATS.first_ns == 0:
            STATS.first_ns = now
        STATS.last_ns = now
        body = b"".join(self.body) if len(self.body) != 1 else self.body[0]
        if body.startswith(b'{"records"'):
            STATS.records += body.count(b'"id":')
            if STATS.latency:
                self.batch_latencies(body, now)
            answer = OK
        else:
            STATS.records += 1
            if self.ts_ns:
                STATS.latencies_ns.append(now - self.ts_ns)
            if STATS.killer:
                self.killer_delivery(body)
            answer = fate(self.partition, self.offset, self.delivery_count) if STATS.fail else OK
        if STATS.delay_s:
            asyncio.get_running_loop().call_later(STATS.delay_s, self.reply, answer)
        else:
            self.reply(answer)

    def killer_delivery(self, body: bytes) -> None:
        STATS.deliveries += 1
        at = (self.partition, self.offset)
        STATS.seen[at] = max(STATS.seen.get(at, 0), self.delivery_count)
        if not body.startswith(KILL_VALUE):
            return
        STATS.killer_at = at
        STATS.killer_counts.append(self.delivery_count)
        if STATS.kill_pid:
            # The record "crashes" the sidecar: no answer ever comes back for it, nor for
            # anything else the dead process had in flight.
            try:
                os.kill(STATS.kill_pid, signal.SIGKILL)
                STATS.kills += 1
            except ProcessLookupError:
                pass
            STATS.kill_pid = 0

    def batch_latencies(self, body: bytes, now: int) -> None:
        for record in json.loads(body)["records"]:
            for name, value in record["headers"]:
                if name == TS_NAME and value:
                    STATS.latencies_ns.append(now - int(base64.b64decode(value)))

    def reply(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


async def serve(tcp_port: int, unix_path: str | None) -> None:
    loop = asyncio.get_running_loop()
    tcp = await loop.create_server(Connection, "127.0.0.1", tcp_port, backlog=1024)
    servers = [tcp]
    if unix_path:
        if os.path.exists(unix_path):
            os.unlink(unix_path)
        servers.append(await loop.create_unix_server(Connection, unix_path, backlog=1024))
    port = tcp.sockets[0].getsockname()[1]
    print(json.dumps({"port": port}), flush=True)
    # Serve until the parent closes our stdin (it never has to signal us).
    await loop.run_in_executor(None, sys.stdin.read)
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the benchmark's app (see module docstring)")
    parser.add_argument("--tcp-port", type=int, default=0)
    parser.add_argument("--unix", default=None, help="also listen on this Unix socket path")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.tcp_port, args.unix))


if __name__ == "__main__":
    main()
