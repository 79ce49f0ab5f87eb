"""Batch mode at a low rate, on the real broker: a batch leaves when its linger is over (issue 19, item 4).

Records trickle in one every 100 ms with a 1 s linger, so each batch should carry the records that
arrived within one linger and leave with far fewer than `batch.max.records`. Before the fix each record
went to its own worker and waited for the previous worker's linger: twenty requests of one record, the
last record about twenty lingers late.

What is asserted is the sidecar's own rule, with margins a loaded machine does not eat: the number of
requests (a batch per linger, not per record), that no unfilled batch leaves before its linger (a lower
bound: load makes things later, not earlier), and, generously, that no record took more than the
linger plus 5 s from its produce time to the app.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
from confluent_kafka import Producer

from sidecar.http.server import Request, Response
from tests.harness import free_port, running_app, sidecar, wait_until, write_config
from tests.kafkatools import Broker

LINGER_MS = 1000
RECORDS = 20
GAP_S = 0.1


@contextmanager
def short_tmp() -> Iterator[Path]:
    # Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="dlqs-") as path:
        yield Path(path)


def produce_paced(bootstrap: str, topic: str, n: int, gap_s: float) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    try:
        for i in range(n):
            producer.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode())
            producer.poll(0)
            time.sleep(gap_s)
        assert producer.flush(30) == 0, "unflushed records"
    finally:
        producer.flush(30)


class BatchApp:
    """Accepts every record; notes each request's arrival (monotonic and wall clock) and records."""

    def __init__(self) -> None:
        self.requests: list[tuple[float, float, list[tuple[int, int]]]] = []

    def delivered(self) -> int:
        return sum(len(recs) for _, _, recs in self.requests)

    async def __call__(self, request: Request) -> Response:
        arrived, wall_ms = time.monotonic(), time.time() * 1000
        records = json.loads(request.body)["records"]
        self.requests.append((arrived, wall_ms, [(r["offset"], r["timestamp"]) for r in records]))
        body = json.dumps({"results": [{"id": r["id"], "ack": "accept"} for r in records]})
        return Response(200, (("Content-Type", "application/json"),), body.encode())


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_a_batch_leaves_when_its_linger_is_over(
    broker: Broker, unique: str, tmp_path: Path, transport: str
) -> None:
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"linger-{unique}"))
    app = BatchApp()
    with short_tmp() as sock_dir:
        if transport == "unix":
            listen: tuple[str, str] | tuple[str, str, int] = ("unix", str(sock_dir / "app.sock"))
            url, sock = "/records", str(sock_dir / "app.sock")
        else:
            port = free_port()
            listen, url, sock = ("tcp", "127.0.0.1", port), f"http://127.0.0.1:{port}/records", None
        async with running_app(app, listen):  # type: ignore[arg-type]
            cfg = write_config(
                tmp_path / "sidecar.yaml",
                bootstrap=broker.bootstrap,
                group=f"g-{unique}",
                topics=[topic],
                app_url=url,
                unix_socket=sock,
                app_extra={"mode": "batch", "batch.max.records": 100, "batch.linger.ms": LINGER_MS},
            )
            async with sidecar(cfg) as sc:
                await sc.wait_assigned(1)
                await trio.to_thread.run_sync(
                    produce_paced, broker.bootstrap, topic, RECORDS, GAP_S
                )
                await wait_until(lambda: app.delivered() >= RECORDS, 60, "every record")
                assert await sc.stop() == 0, sc.log_text()[-3000:]

    offsets = sorted(o for _, _, recs in app.requests for o, _ in recs)
    assert offsets == list(range(RECORDS)), offsets
    sizes = [len(recs) for _, _, recs in app.requests]
    # Twenty records over about two seconds, a one-second linger: a batch per linger (two or three;
    # five leaves room for a machine that stalls the producer), not one request per record.
    assert len(sizes) <= 5, f"requests of {sizes} records"
    assert max(sizes) < 100  # every one left on its linger, not full
    # A batch that is not full never leaves before its linger: the next one opens only after the
    # previous left, so requests are at least a linger apart (half of it, for the transit's jitter).
    gaps = [b[0] - a[0] for a, b in zip(app.requests, app.requests[1:], strict=False)]
    assert all(g >= LINGER_MS / 2000 for g in gaps), gaps
    # Generously bounded: from produce (earlier than the sidecar's fetch) to the app.
    waits_ms = [wall - ts for _, wall, recs in app.requests for _, ts in recs]
    assert max(waits_ms) <= LINGER_MS + 5000, waits_ms
