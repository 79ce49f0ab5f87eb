"""Retry tiers on the real broker (consumer engine): a long release goes to a tier topic, its source offset
is committed, and it comes back to the app as the original, not before it is due, its count going on.

The tiers are 1, 2 and 3 s (the mechanism is the one of 1 min ... 1 d). Each test states what it measures;
`SLACK_S` is the lateness allowed past a record's due time (the due time is written in the tier record's
`__dlq.retry.due` header, read back here from the tier topics).
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import trio

from sidecar.core.tiers import H_COUNT, H_DUE, H_OFFSET, H_TIERS, H_TOPIC, TIERS_HEADER
from sidecar.http.server import Response
from tests.harness import (
    FAST,
    Delivery,
    RecordingApp,
    json_answer,
    running_sidecar,
    wait_committed_at_end,
)
from tests.kafkatools import Broker, Rec

TIERS = ["1s", "2s", "3s"]
# A due record is delivered within this much of its due time (the scheduler wakes for it; the fetch
# after the resume of its tier partition comes first).
SLACK_S = 1.0


def tier_settings(**extra: Any) -> dict[str, Any]:
    return {
        **FAST,
        "errors.retry.tiers": TIERS,
        "errors.retry.tier.threshold.ms": 500,
        "delivery.count.limit": 4,
        **extra,
    }


class TieredApp:
    """Releases `retry-*` records with a Retry-After that picks tier 1s, 2s, 3s for counts 1, 2, 3
    (count 4 is the limit: its release goes to the DLQ); accepts the rest. Records wall times."""

    def __init__(self, *, accept_at: int | None = None) -> None:
        self.accept_at = accept_at
        self.wall: dict[tuple[int, int], float] = {}  # (offset, count) -> wall time received
        self.app = RecordingApp(policy=self.policy)

    def policy(self, d: Delivery) -> Response:
        self.wall[(d.offset, d.delivery_count)] = time.time()
        if not (d.value or b"").startswith(b"retry"):
            return Response(200)
        if self.accept_at is not None and d.delivery_count >= self.accept_at:
            return Response(200)
        if d.delivery_count < 4:
            return json_answer(
                {
                    "ack": "release",
                    "retry_after_ms": 1000 * d.delivery_count,
                    "error": {"class": "com.example.Busy", "message": f"try {d.delivery_count}"},
                }
            )
        return json_answer({"ack": "release"})


def read_tier(broker: Broker, topic: str, expected: int) -> list[Rec]:
    return broker.read_topic(topic, expected, timeout_s=30)


async def test_counts_go_on_across_tiers_due_times_hold_and_the_dlq_names_the_source(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    retries = [
        Rec(key=f"k{i}".encode(), value=f"retry-{i}".encode(), headers=(("h", b"v"),))
        for i in range(3)
    ]
    clean = [Rec(key=f"c{i}".encode(), value=f"ok-{i}".encode()) for i in range(20)]
    tiered = TieredApp()
    async with running_sidecar(
        broker,
        tmp_path,
        tiered.app,
        unique=unique,
        extra=tier_settings(),
        produce_first=retries + clean,
    ) as rig:
        topic, group = rig.topic, rig.group
        tier_topics = [f"dlq.{topic}.retry.{t}" for t in TIERS]
        # The source partition's commit moves past the released records while they wait in a tier.
        await wait_committed_at_end(broker, group, topic, 1, timeout_s=30)
        assert all(tiered.wall.get((i, 2)) is None for i in range(3)), "delivered again too soon"
        dlq = await rig.read_dlq(3, timeout_s=40)
        stat = await rig.sc.status()
    assert len(dlq) == 3
    counts: dict[bytes | None, list[int]] = defaultdict(list)
    for d in tiered.app.deliveries:
        counts[d.value].append(d.delivery_count)
        # Delivered as the original: its topic, partition, offset, key and headers.
        assert d.topic == topic and d.partition == 0
        if (d.value or b"").startswith(b"retry"):
            i = int((d.value or b"")[6:])
            assert (d.offset, d.key) == (i, f"k{i}".encode())
            assert ("h", b"v") in d.headers and not any(n.startswith("__dlq") for n, _ in d.headers)
    for i in range(3):
        assert counts[f"retry-{i}".encode()] == [1, 2, 3, 4]  # continuous across the tiers
    for rec in clean:
        assert counts[rec.value] == [1]
    # The DLQ record names the original source and the tiers it went through.
    for rec in dlq:
        assert rec.header("__dlq.errors.topic") == topic
        assert rec.header("__dlq.errors.delivery.count") == "4"
        assert rec.header(TIERS_HEADER) == "1s,2s,3s"
        assert rec.header("__dlq.errors.exception.class.name") == "com.example.Busy"
    assert sorted(int(r.header("__dlq.errors.offset") or -1) for r in dlq) == [0, 1, 2]
    # Due times: never early, late by at most SLACK_S.
    late: list[float] = []
    for tier, name in enumerate(tier_topics):
        for rec in await trio.to_thread.run_sync(read_tier, broker, name, 3):
            assert rec.header(H_TOPIC) == topic
            count = int(rec.header(H_COUNT) or 0)
            assert count == tier + 1
            assert rec.header(H_TIERS) == ",".join(TIERS[: tier + 1])
            due = int(rec.header(H_DUE) or 0) / 1000
            got = tiered.wall[(int(rec.header(H_OFFSET) or -1), count + 1)]
            assert got >= due, f"delivered {due - got:.3f}s before its due time"
            late.append(got - due)
    assert len(late) == 9
    assert max(late) <= SLACK_S, late
    print(f"lateness past due: max {max(late):.3f}s, mean {sum(late) / len(late):.3f}s")
    assert stat["counters"]["tiers"]["written"] == {"1s": 3, "2s": 3, "3s": 3}
