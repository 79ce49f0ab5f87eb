"""The DLQ circuit breaker's defaults end to end: it stops a broken deploy on a small topic, and one
poison pill in a thousand never trips it.

Real broker, real HTTP apps, the sidecar as a subprocess with the breaker's keys left at their
defaults (only `enable: true` is named, which is its default too: tests/harness.py turns the
breaker off for the tests that dead-letter on purpose unless one of its keys is named).
"""

from __future__ import annotations

from pathlib import Path

from sidecar.http.server import Response
from tests.harness import BREAKER_KEY, FAST, Delivery, RecordingApp, running_sidecar, wait_until
from tests.kafkatools import Broker, Rec

DEFAULTS = {**FAST, BREAKER_KEY + "enable": True}


async def test_a_broken_deploy_on_a_twenty_record_topic_stops_after_four_dlq_records(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    app = RecordingApp(lambda _d: Response(422))  # the new version rejects everything
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        extra=DEFAULTS,
        produce_first=[Rec(key=f"k{i}".encode(), value=b"order") for i in range(20)],
    ) as r:
        # The fifth dead-letter trips it; the four admitted before it may still be on their way to
        # the broker when it opens, so the count is read once they are written.
        st = await r.sc.wait_status(
            lambda s: (
                (s["circuit_breaker"] or {}).get("state") == "open"
                and s["counters"]["dlq_written"] >= 4
            ),
            60,
            "the breaker open, the records before it written",
        )
        code, ready = await r.sc.get("/readyz")
        assert code == 503 and ready["checks"]["circuit_breaker_closed"] is False, ready
        assert "circuit breaker is open" in ready["reason"]
        assert st["counters"]["dlq_written"] == 4, st["counters"]
        assert await r.sc.stop() == 0
    dlq = f"dlq.{r.topic}"
    assert broker.count_records(dlq) == 4


async def test_one_poison_pill_in_a_thousand_never_trips_it(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    def policy(d: Delivery) -> Response:
        return Response(422) if d.value == b"poison" else Response(200)

    app = RecordingApp(policy)
    # The pill first: the window holds nothing else yet.
    recs = [
        Rec(key=f"k{i % 50}".encode(), value=b"poison" if i == 0 else b"ok") for i in range(1000)
    ]
    async with running_sidecar(
        broker, tmp_path, app, unique=unique, extra=DEFAULTS, produce_first=recs
    ) as r:
        await wait_until(lambda: len(app.deliveries) >= 1000, 120, "every record")
        await r.committed_at_end()
        st = await r.sc.status()
        assert await r.sc.stop() == 0
    breaker = st["circuit_breaker"]
    assert breaker["state"] == "closed" and breaker["trips"] == 0, breaker
    assert st["counters"]["dlq_written"] == 1
    assert len(app.deliveries) == 1000  # nothing held, nothing delivered twice
