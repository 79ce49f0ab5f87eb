"""The console's reading, on the DLQ tools' own code against the real broker: the table's pages cover a
topic once, in (partition, offset) order, each within its size and scan budget; one record by its
coordinates; the topics found by prefix and by format; a redrive preview of all records matching a
filter (the dry run of `dlq replay`: nothing written, nothing committed)."""

from __future__ import annotations

import uuid

from sidecar.core.deadletter import FailedRecord
from sidecar.core.outcome import CAUSE_REJECTED
from sidecar.kafka.dlq.record import build_dlq_record
from sidecar.kafka.tools import ReadConsumer, TopicAdmin
from sidecar.ops.console.catalog import find_dlq_topics
from sidecar.ops.console.redrive import new_replay_name, preview
from sidecar.ops.dlq.filters import Filters
from sidecar.ops.dlq.inspect import inspect_page, read_entry
from sidecar.ops.dlq.replay import ReplayOptions
from tests.kafkatools import Broker, Rec

N = 90


def _seed(broker: Broker, dlq: str, source: str) -> None:
    records = []
    for i in range(N):
        failed = FailedRecord(
            topic=source,
            partition=i % 2,
            offset=i,
            key=f"k{i}".encode(),
            value=b"v",
            headers=(),
            group="g",
            delivery_count=1,
            cause=CAUSE_REJECTED,
            exception_class="A" if i % 3 else "B",
            exception_message=f"m{i}",
        )
        rec = build_dlq_record(failed, dlq, 2, True, 1024)
        records.append(
            Rec(key=rec.key, value=rec.value, headers=tuple(rec.headers), partition=i % 2)
        )
    broker.produce(dlq, records)


def test_pages_cover_the_topic_once_in_order_within_their_budgets(broker: Broker) -> None:
    tag = uuid.uuid4().hex[:8]
    source = broker.create_topic(f"src-{tag}", partitions=2)
    dlq = broker.create_topic(f"dlq.paging-{tag}", partitions=2)
    _seed(broker, dlq, source)
    consumer = ReadConsumer({"bootstrap.servers": broker.bootstrap})
    try:
        seen: list[tuple[int, int]] = []
        cursor = None
        pages = 0
        while True:
            page = inspect_page(consumer, dlq, Filters(), cursor=cursor, size=20)
            assert len(page.entries) <= 20
            seen += [(e.dlq_partition, e.dlq_offset) for e in page.entries]
            pages += 1
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == sorted(seen) and len(seen) == len(set(seen)) == N
        assert pages == 5
        # A filter matching one record in three; a scan budget that stops a page early.
        page = inspect_page(consumer, dlq, Filters(exception_classes=("B",)), size=100)
        assert len(page.entries) == N // 3 and page.next_cursor is None
        page = inspect_page(consumer, dlq, Filters(exception_classes=("nope",)), scan_budget=30)
        assert page.entries == [] and page.scanned == 30 and page.next_cursor == {0: 30, 1: 0}
        entry = read_entry(consumer, dlq, 1, 4)
        assert entry is not None and (entry.dlq_partition, entry.dlq_offset) == (1, 4)
        assert entry.source_offset == 9  # the fifth record of partition 1: i = 9
        assert read_entry(consumer, dlq, 1, 10_000) is None
        catalog = find_dlq_topics(
            TopicAdmin({"bootstrap.servers": broker.bootstrap}), consumer, "dlq."
        )
        found = {t.name: t for t in catalog.topics}
        assert found[dlq].found_by == "prefix" and found[dlq].records == N
        assert found[dlq].writers["dlq"] > 0 and source not in found
        catalog = find_dlq_topics(TopicAdmin({"bootstrap.servers": broker.bootstrap}), consumer, "")
        assert {t.name: t.found_by for t in catalog.topics}[dlq] == "format"
    finally:
        consumer.close()
    # The preview of all records matching a filter: where each goes; nothing written or committed.
    options = ReplayOptions(
        bootstrap=broker.bootstrap,
        dlq_topic=dlq,
        name=new_replay_name(),
        filters=Filters(exception_classes=("B",)),
    )
    summary, total = preview(options)
    assert total == N and summary.matched == N // 3 and summary.replayed_total == N // 3
    assert all(f"to {source}[" in line for line in summary.planned)
    assert summary.committed == {}
    assert broker.count_records(source) == 0


def test_a_headers_only_record_shows_its_original_while_the_source_holds_it(broker: Broker) -> None:
    from sidecar.kafka.tools import OffsetFetcher
    from sidecar.ops.console.record_view import record_view

    tag = uuid.uuid4().hex[:8]
    source = broker.create_topic(f"src-{tag}", partitions=1)
    dlq = broker.create_topic(f"dlq.headers-only-{tag}", partitions=1)
    broker.produce(
        source, [Rec(key=b"k", value=b'{"order": 7}', headers=(("h", b"1"),), partition=0)]
    )
    [original] = broker.read_topic(source, 1)
    failed = FailedRecord(
        topic=source,
        partition=0,
        offset=original.offset or 0,
        key=original.key,
        value=original.value,
        headers=original.headers,
        group="g",
        delivery_count=3,
        cause=CAUSE_REJECTED,
    )
    rec = build_dlq_record(failed, dlq, 1, False, 1024)  # copy off: headers only
    broker.produce(
        dlq, [Rec(key=rec.key, value=rec.value, headers=tuple(rec.headers), partition=0)]
    )
    consumer = ReadConsumer({"bootstrap.servers": broker.bootstrap})
    fetcher = OffsetFetcher({"bootstrap.servers": broker.bootstrap}, timeout_s=15)
    try:
        entry = read_entry(consumer, dlq, 0, 0)
        assert entry is not None and entry.headers_only
        assert entry.source_offset is not None
        view = record_view(entry, fetcher.fetch(source, 0, entry.source_offset))
        assert view.original is not None and view.original_problem is None
        key, value, headers = view.original
        assert (key.shown, value.kind) == ("k", "json") and '"order": 7' in value.shown
        assert [(h.name, h.value) for h in headers] == [("h", "1")]
        gone = record_view(entry, fetcher.fetch(source, 0, 5))
        assert gone.original is None and "beyond the high watermark" in (
            gone.original_problem or ""
        )
    finally:
        fetcher.close()
        consumer.close()


def test_retry_tier_topics_are_not_listed_as_dlqs(broker: Broker) -> None:
    """`dlq.{topic}.retry.{tier}` matches the DLQ prefix; a tier topic is no DLQ all the same,
    whether it holds tier records or none yet."""
    tag = uuid.uuid4().hex[:8]
    dlq = broker.create_topic(f"dlq.tiers-{tag}", partitions=2)
    _seed(broker, dlq, f"tiers-{tag}")
    holding = broker.create_topic(f"dlq.tiers-{tag}.retry.1m", partitions=1)
    broker.produce(
        holding,
        [Rec(key=b"k", value=b"v", headers=(("__dlq.retry.topic", f"tiers-{tag}".encode()),))],
    )
    empty = broker.create_topic(f"dlq.tiers-{tag}.retry.10m", partitions=1)
    consumer = ReadConsumer({"bootstrap.servers": broker.bootstrap})
    try:
        catalog = find_dlq_topics(
            TopicAdmin({"bootstrap.servers": broker.bootstrap}), consumer, "dlq."
        )
    finally:
        consumer.close()
    names = {t.name for t in catalog.topics}
    assert dlq in names
    assert holding not in names and empty not in names
