"""A misrouted app is not a failing record: a real app serving the wrong path, then the right one.

Real broker, a real HTTP app, the sidecar as a subprocess, both engines, single and batch mode. While
the app answers the configured URL with a framework's 404/405/415, nothing is counted or
dead-lettered, `/readyz` names the URL and the status, one log line and a metric say so; once the
app serves the path, every record arrives with delivery count 1. A 404 that carries a JSON answer is
read as that answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from sidecar.http.server import Request, Response, json_response
from tests.harness import FAST, running_sidecar, wait_until
from tests.kafkatools import Broker, Rec
from tests.promtext import prometheus_values

N = 12
LIMIT = 2  # a misroute that counted would dead-letter every record after two tries


class RedeployedApp:
    """An app that serves `path` only once it is redeployed (`fix`); before, it answers what a web
    framework answers for a path, method or content type it does not serve."""

    def __init__(self, path: str, wrong: int, *, batch: bool = False) -> None:
        self.path = path
        self.wrong = wrong
        self.batch = batch
        self.fixed = False
        self.misrouted = 0  # requests answered with `wrong`
        self.counts: dict[int, list[int]] = {}  # offset -> delivery counts seen once fixed

    def fix(self) -> None:
        self.fixed = True

    async def __call__(self, request: Request) -> Response:
        if not self.fixed:
            self.misrouted += 1
            if self.wrong == 404:  # Go's net/http
                return Response(404, (("Content-Type", "text/plain"),), b"404 page not found\n")
            if self.wrong == 405:  # a framework's JSON error page: JSON, but no answer
                return json_response({"detail": "Method Not Allowed"}, 405)
            return Response(415, (("Content-Type", "text/html"),), b"<h1>Unsupported</h1>")
        assert request.path == self.path
        if not self.batch:
            offset = int(request.header("kafka-offset") or -1)
            count = int(request.header("kafka-delivery-count") or 0)
            self.counts.setdefault(offset, []).append(count)
            return Response(200)
        results = []
        for rec in json.loads(request.body)["records"]:
            self.counts.setdefault(rec["offset"], []).append(rec["delivery_count"])
            results.append({"id": rec["id"], "ack": "accept"})
        return json_response({"results": results})


CASES = [
    pytest.param("consumer", "single", 404, id="consumer-single-404"),
    pytest.param("consumer", "batch", 405, id="consumer-batch-405"),
    pytest.param("share", "single", 415, id="share-single-415"),
    pytest.param("share", "batch", 404, id="share-batch-404"),
]


@pytest.mark.parametrize(("engine", "mode", "wrong"), CASES)
async def test_wrong_path_pauses_intake_and_counts_nothing_until_the_app_serves_it(
    broker: Broker, unique: str, tmp_path: Path, engine: str, mode: str, wrong: int
) -> None:
    app = RedeployedApp("/records", wrong, batch=mode == "batch")
    extra: dict[str, Any] = {**FAST, "delivery.count.limit": LIMIT}
    if engine == "share":
        extra |= {"engine": "share", "ordering": "none"}
    app_extra: dict[str, Any] = {"connect.backoff.initial.ms": 100, "connect.backoff.max.ms": 300}
    if mode == "batch":
        app_extra |= {"mode": "batch", "batch.max.records": 4}
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        extra=extra,
        app_extra=app_extra,
        produce_first=[Rec(key=f"k{i}".encode(), value=f"v{i}".encode()) for i in range(N)],
    ) as r:
        sc = r.sc
        # Tried again and again, far past the delivery count limit, and nothing counted.
        await wait_until(lambda: app.misrouted >= 4 * LIMIT, 60, "misrouted requests")
        code, ready = await sc.get("/readyz")
        assert code == 503, ready
        assert ready["checks"]["app_route_found"] is False
        assert ready["checks"]["app_reachable"] is True  # it answers; the URL is wrong
        url = r.endpoint.url("/records")
        assert f"HTTP {wrong} at {url}" in ready["reason"], ready
        st = await sc.status()
        c = st["counters"]
        assert c["attempts"] == 0 and c["not_attempted"] > 0, c
        assert c["archived"] == {} and c["dlq_written"] == 0, c
        _code, metrics = await sc.get("/metrics")
        assert prometheus_values(metrics)["dlq_sidecar_app_route_missing"] == 1

        app.fix()
        await wait_until(lambda: len(app.counts) == N, 90, "every record once the app serves it")
        with trio.fail_after(30):
            while (await sc.get("/readyz"))[0] != 200:
                await trio.sleep(0.1)
        _code, metrics = await sc.get("/metrics")
        assert prometheus_values(metrics)["dlq_sidecar_app_route_missing"] == 0
        st = await sc.status()
        assert await sc.stop() == 0
    assert sorted(app.counts) == list(range(N))
    assert all(counts[0] == 1 for counts in app.counts.values()), app.counts
    assert st["counters"]["archived"] == {} and st["counters"]["dlq_written"] == 0
    dlq = f"dlq.{r.topic}"
    assert not broker.topic_exists(dlq) or broker.count_records(dlq) == 0
    said = [line for line in sc.log_lines() if "no such route" in str(line.get("msg", ""))]
    assert len(said) == 1, said  # one line, however many requests were turned away


async def test_a_404_with_a_json_answer_is_that_answer(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """An app may reject a record with 404 on purpose: its JSON answer is read, the record dead-lettered."""

    async def app(request: Request) -> Response:
        if request.body == b"gone":
            answer = {"ack": "reject", "error": {"class": "app.NoSuchOrder", "message": "gone"}}
            return json_response(answer, 404)
        return Response(200)

    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        extra=FAST,
        produce_first=[Rec(key=None, value=v) for v in (b"ok", b"gone", b"ok")],
    ) as r:
        await r.sc.wait_status(lambda s: s["counters"]["dlq_written"] == 1, 60, "a DLQ record")
        dlq = await r.read_dlq(1)
        code, ready = await r.sc.get("/readyz")
        assert code == 200 and ready["checks"]["app_route_found"] is True, ready
        assert await r.sc.stop() == 0
    headers = dlq[0].headers_by_name()
    assert headers["__dlq.errors.exception.class.name"] == [b"app.NoSuchOrder"]


class SlowMisroute:
    """An app that answers 404 (no such route), each answer after `hold_s`, until `fix`; it notes
    how many requests are open at the app when each one arrives."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.fixed = False
        self.open = 0
        self.first_answer_at: float | None = None
        self.arrivals: list[tuple[float, int]] = []  # (trio time, requests open with it)
        self.counts: dict[int, list[int]] = {}  # offset -> delivery counts seen once fixed

    def fix(self) -> None:
        self.fixed = True

    async def __call__(self, request: Request) -> Response:
        if self.fixed:
            offset = int(request.header("kafka-offset") or -1)
            count = int(request.header("kafka-delivery-count") or 0)
            self.counts.setdefault(offset, []).append(count)
            return Response(200)
        self.open += 1
        self.arrivals.append((trio.current_time(), self.open))
        try:
            await trio.sleep(self.hold_s)  # a slow 404: requests sent together overlap here
        finally:
            self.open -= 1
        if self.first_answer_at is None:
            self.first_answer_at = trio.current_time()
        return Response(404, (("Content-Type", "text/plain"),), b"404 page not found\n")


@pytest.mark.parametrize("engine", ["consumer", "share"])
async def test_each_retry_while_the_route_is_missing_is_one_request(
    broker: Broker, unique: str, tmp_path: Path, engine: str
) -> None:
    """With `app.max.in.flight` 8 and records waiting, the first round sends up to 8 requests before
    any answer; every retry after the backoff is one request (the probe), the others wait for its
    answer: the app never sees two open at once. Once it serves the path, every record arrives with
    delivery count 1."""
    app = SlowMisroute(hold_s=0.1)
    extra: dict[str, Any] = {**FAST, "delivery.count.limit": LIMIT}
    if engine == "share":
        extra |= {"engine": "share", "ordering": "none"}
    app_extra = {
        "max.in.flight": 8,
        "connect.backoff.initial.ms": 500,
        "connect.backoff.max.ms": 500,
    }
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        extra=extra,
        app_extra=app_extra,
        produce_first=[Rec(key=f"k{i}".encode(), value=f"v{i}".encode()) for i in range(N)],
    ) as r:

        def retries() -> list[int]:
            # Requests sent after the first round was answered (it was sent before any answer;
            # the retry comes a backoff of 500 ms after the answers).
            first = app.first_answer_at
            if first is None:
                return []
            return [n_open for at, n_open in app.arrivals if at > first + 0.3]

        await wait_until(lambda: len(retries()) >= 4, 60, "four retries of the missing route")
        assert max(retries()) == 1, app.arrivals
        app.fix()
        await wait_until(lambda: len(app.counts) == N, 90, "every record once the app serves it")
        st = await r.sc.status()
    assert all(counts[0] == 1 for counts in app.counts.values()), app.counts
    assert st["counters"]["attempts"] >= N and st["counters"]["dlq_written"] == 0
