"""`dlq replay --dry-run` reads each record back from its source topic one at a time
(`OffsetFetcher`): 20 records must not take 20 of librdkafka's fetch waits (500 ms each by default;
a dry run of 20 records took 10.1 s, the replay itself 1.8 s)."""

from __future__ import annotations

import time

from sidecar.kafka.tools import OffsetFetcher
from tests.kafkatools import Broker, Rec

N = 20


def test_twenty_records_read_back_one_at_a_time_take_well_under_a_fetch_wait_each(
    broker: Broker, unique: str
) -> None:
    topic = broker.create_topic(f"fetch-{unique}", partitions=1)
    broker.produce(topic, [Rec(key=None, value=f"v{i}".encode()) for i in range(N)])
    fetcher = OffsetFetcher({"bootstrap.servers": broker.bootstrap}, timeout_s=10)
    try:
        fetcher.fetch(topic, 0, 0)  # the connection and the metadata, once
        started = time.monotonic()
        values = [fetcher.fetch(topic, 0, offset).record for offset in range(N)]
        elapsed = time.monotonic() - started
    finally:
        fetcher.close()
    assert [r.value if r else None for r in values] == [f"v{i}".encode() for i in range(N)]
    # 0.5 s a record before (the fetch wait, 11.7 s in all); well under a second now.
    assert elapsed < N * 0.5 / 4, f"{elapsed:.1f} s for {N} records"
