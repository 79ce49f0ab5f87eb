"""HTTP hot-path benchmark: AppClient → sidecar.http.server, and wire CPU cost per request.

Run with ``python -m bench.http_bench`` (not a test). The server runs in a child process (so
client and server do not share one trio loop or one core) and answers every POST with an empty
200. For TCP loopback and a Unix socket at 1, 16 and 64 requests in flight, the client pushes
records with ``AppClient.deliver`` (format, send, parse, interpret) for ``--seconds`` per run and
reports the median of ``--runs`` runs, plus the client process's CPU per request. Then it times
the pure per-request work: ``format_single_request`` and response parsing + ``interpret_single``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from dataclasses import dataclass

import httptools
import trio

from sidecar.core.wire import RecordView, format_single_request, interpret_single
from sidecar.http.appclient import AppClient, AppTarget
from sidecar.http.server import Request, Response, serve_http

RECORD = RecordView(
    topic="orders",
    partition=3,
    offset=123_456_789,
    key=b"customer-4711",
    value=b'{"order_id": 987654, "sku": "A-1", "qty": 2, "price_cents": 1999}',
    timestamp_ms=1_700_000_000_123,
    timestamp_type="create",
    headers=(("content-type", b"application/json"), ("source", b"web")),
    delivery_count=1,
    delivery_id="orders-3-123456789-1",
    traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
)
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\n"


async def _answer_ok(request: Request) -> Response:
    return Response(200)


def serve(listen: str) -> None:
    """Child process: serve until stdin closes; print the port or path first."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            if listen == "tcp":
                bound = await nursery.start(serve_http, _answer_ok, ("tcp", "127.0.0.1", 0))
            else:
                bound = await nursery.start(serve_http, _answer_ok, ("unix", listen))
            print(bound, flush=True)
            await trio.to_thread.run_sync(sys.stdin.read)
            nursery.cancel_scope.cancel()

    trio.run(main)


@dataclass
class RunResult:
    requests_per_s: float
    cpu_us_per_request: float


async def load(target: AppTarget, in_flight: int, seconds: float) -> RunResult:
    async with AppClient(target, max_connections=in_flight) as client:
        count = 0
        for _ in range(in_flight):  # open the connections before timing
            await client.deliver(RECORD, timeout_s=10)
        deadline = trio.current_time() + seconds

        async def worker() -> None:
            nonlocal count
            while trio.current_time() < deadline:
                answer = await client.deliver(RECORD, timeout_s=10)
                assert answer.ack == "accept", answer
                count += 1

        cpu_start = time.process_time()
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(in_flight):
                nursery.start_soon(worker)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_start
    return RunResult(count / elapsed, cpu / count * 1e6)


def start_server(listen: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.http_bench", "--serve", listen],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def stop_server(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=10)


def bench_http(seconds: float, runs: int) -> None:
    print(f"requests/s, AppClient.deliver -> httpserver (median of {runs} x {seconds} s)")
    print(f"{'transport':<10}{'in flight':>10}{'req/s':>12}{'client CPU µs/req':>20}")
    with tempfile.TemporaryDirectory() as directory:
        for transport in ("tcp", "unix"):
            listen = "tcp" if transport == "tcp" else os.path.join(directory, "bench.sock")
            proc, bound = start_server(listen)
            try:
                if transport == "tcp":
                    target = AppTarget(host="127.0.0.1", port=int(bound), path="/records")
                else:
                    target = AppTarget(unix_path=bound, path="/records")
                for in_flight in (1, 16, 64):
                    results = [trio.run(load, target, in_flight, seconds) for _ in range(runs)]
                    rate = statistics.median(r.requests_per_s for r in results)
                    cpu = statistics.median(r.cpu_us_per_request for r in results)
                    print(f"{transport:<10}{in_flight:>10}{rate:>12,.0f}{cpu:>20.1f}")
            finally:
                stop_server(proc)


def _per_call_us(fn: Callable[[], object], repeat: int = 5, number: int = 20_000) -> float:
    return min(timeit.repeat(fn, repeat=repeat, number=number)) / number * 1e6


class _Collector:
    __slots__ = ("body", "headers")

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)


def bench_cpu() -> None:
    def format_request() -> None:
        format_single_request(RECORD, "127.0.0.1:8080", "/records")

    def parse_and_interpret() -> None:
        collector = _Collector()
        parser = httptools.HttpResponseParser(collector)
        parser.feed_data(RESPONSE)
        interpret_single(parser.get_status_code(), collector.headers, b"".join(collector.body))

    formatting = _per_call_us(format_request)
    parsing = _per_call_us(parse_and_interpret)
    print("per-request CPU, pure work (best of 5 x 20000)")
    print(f"  format_single_request               {formatting:6.2f} µs")
    print(f"  httptools response parse + interpret {parsing:5.2f} µs")
    print(f"  total                               {formatting + parsing:6.2f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=1.5, help="duration of one run")
    parser.add_argument("--runs", type=int, default=3, help="runs per cell; the median is shown")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    bench_cpu()
    print()
    bench_http(args.seconds, args.runs)


if __name__ == "__main__":
    main()
