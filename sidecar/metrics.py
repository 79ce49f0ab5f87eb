"""Prometheus metrics, read from the engine's counters and ledgers at scrape time.

A custom collector keeps the hot path free of metric calls: the engine counts in plain integers and this
module turns them into Prometheus families when `/metrics` is scraped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from sidecar.engine import Engine


class EngineCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        e = self.engine
        c = e.counters
        delivered = CounterMetricFamily(
            "dlq_sidecar_records_delivered",
            "Answers applied to records, by outcome.",
            labels=["outcome"],
        )
        for outcome, n in sorted(c.delivered.items()):
            delivered.add_metric([outcome], n)
        yield delivered
        yield CounterMetricFamily(
            "dlq_sidecar_attempts", "Delivery attempts sent to the app.", value=c.attempts
        )
        yield CounterMetricFamily(
            "dlq_sidecar_not_attempted",
            "Deliveries that could not be sent (app not listening); not counted as attempts.",
            value=c.not_attempted,
        )
        archived = CounterMetricFamily(
            "dlq_sidecar_records_archived", "Records archived, by reason.", labels=["reason"]
        )
        for reason, n in sorted(c.archived.items()):
            archived.add_metric([reason], n)
        yield archived
        yield CounterMetricFamily(
            "dlq_sidecar_dlq_written", "DLQ records confirmed by the broker.", value=c.dlq_written
        )
        yield CounterMetricFamily(
            "dlq_sidecar_dlq_failed", "DLQ writes that failed for good.", value=c.dlq_failed
        )
        yield CounterMetricFamily(
            "dlq_sidecar_commits", "Offset commits that succeeded.", value=c.commits
        )
        yield CounterMetricFamily(
            "dlq_sidecar_commit_failures", "Offset commits that failed.", value=c.commit_failures
        )
        yield CounterMetricFamily(
            "dlq_sidecar_rebalances", "Partition assignment changes.", value=c.rebalances
        )
        yield CounterMetricFamily(
            "dlq_sidecar_expired_answers",
            "Answers that came after their lock expired, or unknown ids.",
            value=c.expired_answers,
        )
        yield GaugeMetricFamily(
            "dlq_sidecar_in_flight_records",
            "Records handed to the app and not yet answered.",
            value=e.in_flight_records(),
        )
        yield GaugeMetricFamily(
            "dlq_sidecar_paused_partitions",
            "Partitions whose intake is paused.",
            value=len(e.source.paused),
        )
        yield GaugeMetricFamily(
            "dlq_sidecar_app_reachable",
            "1 when the app accepts connections.",
            value=1 if e.app_reachable else 0,
        )
        lag = GaugeMetricFamily(
            "dlq_sidecar_commit_lag_records",
            "Records between the committable offset and the partition's high watermark.",
            labels=["topic", "partition"],
        )
        for (topic, partition), n in sorted(e.source.lag().items()):
            lag.add_metric([topic, str(partition)], n)
        yield lag


class Metrics:
    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineCollector(engine))

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
