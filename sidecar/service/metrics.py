"""Prometheus metrics, read from the engine at scrape time (one shape for both engines).

A custom collector keeps the hot path free of metric calls: the engine counts in plain integers and this
module turns them into Prometheus families when `/metrics` is scraped. The latency histograms are the
module's own (`LatencyHistogram`): an observation is a bisection and two additions, not prometheus-client's
`Histogram.observe` with its locks. It reads the engine only through the `sidecar.engines.pipeline.Engine` interface.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from sidecar.config import Config
    from sidecar.engines.pipeline import Engine


class EngineCollector(Collector):
    def __init__(self, engine: Engine, config: Config) -> None:
        self.engine = engine
        self.config = config

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        e = self.engine
        config = self.config
        figures = e.figures()
        health = e.health()
        c = figures.counters
        delivered = CounterMetricFamily(
            "dlq_sidecar_records_delivered",
            "Answers applied to records (and lock expiries), by topic and outcome.",
            labels=["topic", "outcome"],
        )
        for (topic, outcome), n in sorted(c.by_topic.items()):
            delivered.add_metric([topic, outcome], n)
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
        dead_lettered = CounterMetricFamily(
            "dlq_sidecar_dead_lettered",
            "DLQ records confirmed by the broker, by source topic, reason, exception class (`none`:"
            " not said; `other`: not a class name, or past the first 50 distinct classes) and the DLQ"
            " topic the routes chose.",
            labels=["topic", "reason", "exception_class", "dlq_topic"],
        )
        for (topic, reason, exception_class, dlq_topic), n in sorted(c.dead_lettered.items()):
            dead_lettered.add_metric([topic, reason, exception_class, dlq_topic], n)
        yield dead_lettered
        refused = CounterMetricFamily(
            "dlq_sidecar_dlq_route_refused",
            "DLQ records written to the default DLQ because the app's reject named a DLQ topic"
            " that errors.deadletterqueue.routes.app.allowed does not list, by source topic.",
            labels=["topic"],
        )
        # Every source topic from the start (0 until a refusal), so a rate or an alert has a series.
        for topic, n in sorted((dict.fromkeys(config.source.topics, 0) | c.route_refused).items()):
            refused.add_metric([topic], n)
        yield refused
        broker_archived = CounterMetricFamily(
            "dlq_sidecar_broker_archived_without_dlq",
            "Records the broker archived on its own, with no DLQ record (share engine; never expected).",
            labels=["topic"],
        )
        # Every source topic from 0, so the first archive is an increase Prometheus sees.
        by_topic = dict.fromkeys(config.source.topics, 0) | c.broker_archived
        for topic, n in sorted(by_topic.items()):
            broker_archived.add_metric([topic], n)
        yield broker_archived
        yield CounterMetricFamily(
            "dlq_sidecar_dlq_written", "DLQ records confirmed by the broker.", value=c.dlq_written
        )
        source_deleted = CounterMetricFamily(
            "dlq_sidecar_dlq_source_deleted",
            "Headers-only DLQ records this process wrote (no copy of the payload) whose source offset"
            " retention or delete-records has deleted since: their payload is gone and they cannot be"
            " replayed, by source topic (read every errors.deadletterqueue.source.check.interval.ms).",
            labels=["topic"],
        )
        # Every source topic from 0, so the first loss is an increase Prometheus sees.
        for topic, n in sorted((dict.fromkeys(config.source.topics, 0) | c.source_deleted).items()):
            source_deleted.add_metric([topic], n)
        yield source_deleted
        yield GaugeMetricFamily(
            "dlq_sidecar_dlq_headers_only_watched",
            "Headers-only DLQ records this process wrote whose source offset was still there at the"
            " last look (watched for dlq_sidecar_dlq_source_deleted).",
            value=c.headers_only_watched,
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
            value=figures.in_flight,
        )
        yield GaugeMetricFamily(
            "dlq_sidecar_paused_partitions",
            "Partitions whose intake is paused.",
            value=len(figures.paused),
        )
        yield GaugeMetricFamily(
            "dlq_sidecar_app_reachable",
            "1 when the app accepts connections.",
            value=1 if figures.app_reachable else 0,
        )
        yield GaugeMetricFamily(
            "dlq_sidecar_app_route_missing",
            "1 while the app answers the configured URL that it has no such route (404, 405 or 415"
            " with no JSON answer): intake is paused, nothing is counted or dead-lettered.",
            value=0 if health.app_route_missing is None else 1,
        )
        status = e.status()
        share = status.get("engine") == "share"
        lag = GaugeMetricFamily(
            "dlq_sidecar_commit_lag_records",
            "Records between the consumer's fetch position and the partition's high watermark: not yet"
            " fetched (consumer engine). Records fetched into the sidecar's buffer or in flight are not"
            " counted: dlq_sidecar_committed_lag_records counts what is not finished.",
            labels=["topic", "partition"],
        )
        share_lag = GaugeMetricFamily(
            "dlq_sidecar_share_lag_records",
            "The sidecar's estimate of the share group's lag (share engine): records past the furthest"
            " offset this process acquired, up to the high watermark, for each partition it acquired"
            " records of. The group's lag is the minimum across pods.",
            labels=["topic", "partition"],
        )
        for (topic, partition), n in sorted(figures.lag.items()):
            (share_lag if share else lag).add_metric([topic, str(partition)], n)
        yield lag
        yield share_lag
        partitions = status.get("partitions") or []
        committed_lag = GaugeMetricFamily(
            "dlq_sidecar_committed_lag_records",
            "Records between the partition's committed offset and its high watermark (consumer engine):"
            " what the group has not finished, records this pod holds (buffered, in flight, waiting"
            " for the DLQ) included; the lag the broker reports for the group.",
            labels=["topic", "partition"],
        )
        for p in partitions:
            if p.get("committed_lag") is not None:
                committed_lag.add_metric([p["topic"], str(p["partition"])], int(p["committed_lag"]))
        yield committed_lag
        yield GaugeMetricFamily(
            "dlq_sidecar_buffered_records",
            "Records fetched and held in memory, not yet handed to the app (consumer engine).",
            value=sum(int(p.get("buffered") or 0) for p in partitions),
        )
        yield GaugeMetricFamily(
            "dlq_sidecar_buffered_bytes",
            "Bytes of the records fetched and held in memory, not yet handed to the app (consumer engine).",
            value=sum(int(p.get("buffered_bytes") or 0) for p in partitions),
        )
        failing = status.get("commits_failing_s")
        yield GaugeMetricFamily(
            "dlq_sidecar_commits_failing_seconds",
            "Seconds every offset commit has been failing (0: the last one succeeded; consumer engine)."
            " At commit.stall.timeout.ms /healthz reports the sidecar stalled.",
            value=float(failing or 0.0),
        )
        yield GaugeMetricFamily(
            "dlq_sidecar_stalled",
            "1 while /healthz answers 503 (the sidecar failed, or every commit failed for"
            " commit.stall.timeout.ms).",
            value=1 if (health.failure or health.stalled) else 0,
        )
        checks = health.checks
        yield GaugeMetricFamily(
            "dlq_sidecar_ready",
            "1 when /readyz answers 200 (every readiness check passes).",
            value=1 if all(checks.values()) else 0,
        )
        check = GaugeMetricFamily(
            "dlq_sidecar_readiness_check",
            "1 for each readiness check of /readyz that passes, 0 for one that fails.",
            labels=["check"],
        )
        for name, ok in sorted(checks.items()):
            check.add_metric([name], 1 if ok else 0)
        yield check
        info = GaugeMetricFamily(
            "dlq_sidecar_source_topic_info",
            "1 per source topic, labelled with the engine and group (joins a topic into per-pod alerts).",
            labels=["topic", "engine", "group"],
        )
        for topic in config.source.topics:
            info.add_metric([topic, str(status.get("engine")), config.group_id], 1)
        yield info
        meta = GaugeMetricFamily(
            "dlq_sidecar_commit_metadata_bytes",
            "Size of the delivery state last committed in the offset metadata, per partition.",
            labels=["topic", "partition"],
        )
        for (topic, partition), size in sorted(figures.commit_metadata_bytes.items()):
            meta.add_metric([topic, str(partition)], size)
        yield meta
        yield CounterMetricFamily(
            "dlq_sidecar_commit_metadata_overflows",
            "Times a partition paused because its delivery state neared offset.metadata.max.bytes.",
            value=c.metadata_pauses,
        )
        # Crash isolation: records that may have been in flight at an unclean stop, delivered one
        # at a time (the consumer engine's fields are top level, the share engine's under "share").
        iso = status.get("share") or status
        yield GaugeMetricFamily(
            "dlq_sidecar_isolation_active",
            "1 while an isolation pass delivers suspects one at a time after an unclean stop.",
            value=1 if iso.get("isolation_active") else 0,
        )
        yield GaugeMetricFamily(
            "dlq_sidecar_isolation_suspects",
            "Suspects of the isolation pass not yet settled.",
            value=int(iso.get("suspects_left", iso.get("suspects_waiting", 0))),
        )
        yield CounterMetricFamily(
            "dlq_sidecar_isolated_deliveries",
            "Isolated deliveries that ended (answer, expiry or revoke), this assignment.",
            value=int(iso.get("isolated_total", iso.get("isolated_deliveries", 0))),
        )
        # Pull mode (app.mode: pull): the app's long polls and what waits for them (0 otherwise).
        pull = status.get("pull") or {}
        yield GaugeMetricFamily(
            "dlq_sidecar_pull_waiting_polls",
            "Pull mode: GET /v1/records polls waiting for records.",
            value=int(pull.get("waiting_polls", 0)),
        )
        yield GaugeMetricFamily(
            "dlq_sidecar_pull_queued_records",
            "Pull mode: deliveries waiting for the next poll (share engine batches a poll did not take).",
            value=int(pull.get("queued", 0)),
        )
        yield from _tier_families(c.tier_written, c.tier_delivered, status.get("retry_tiers"))
        yield from _breaker_families(status.get("circuit_breaker"))


def _tier_families(
    written: dict[str, int], delivered: dict[str, int], tiers: dict[str, Any] | None
) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """Retry tiers, by tier (its delay's label): records written, delivered back, waiting."""
    labels = sorted(set(tiers or {}) | set(written) | set(delivered))
    out_written = CounterMetricFamily(
        "dlq_sidecar_tier_written", "Records written to a retry tier.", labels=["tier"]
    )
    out_delivered = CounterMetricFamily(
        "dlq_sidecar_tier_delivered",
        "Records read back from a retry tier to be delivered when due.",
        labels=["tier"],
    )
    waiting = GaugeMetricFamily(
        "dlq_sidecar_tier_waiting",
        "Records in a retry tier not yet done (written, not yet delivered and answered).",
        labels=["tier"],
    )
    for label in labels:
        out_written.add_metric([label], written.get(label, 0))
        out_delivered.add_metric([label], delivered.get(label, 0))
        row = (tiers or {}).get(label) or {}
        waiting.add_metric([label], row.get("waiting") or 0)
    yield out_written
    yield out_delivered
    yield waiting


_BREAKER_STATES = ("closed", "open", "half_open")


def _breaker_families(
    breaker: dict[str, Any] | None,
) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """The DLQ circuit breaker: a state gauge (one series per state, 1 for the current one) and
    its trips; absent when the breaker is disabled."""
    if breaker is None:
        return
    state = GaugeMetricFamily(
        "dlq_sidecar_circuit_breaker_state",
        "The DLQ circuit breaker's state: 1 for the current one (closed, open, half_open).",
        labels=["state"],
    )
    for name in _BREAKER_STATES:
        state.add_metric([name], 1 if breaker["state"] == name else 0)
    yield state
    yield CounterMetricFamily(
        "dlq_sidecar_circuit_breaker_trips",
        "Times the DLQ circuit breaker tripped (closed to open; a failed probe is not a trip).",
        value=int(breaker["trips"]),
    )
    yield CounterMetricFamily(
        "dlq_sidecar_circuit_breaker_held",
        "Records the DLQ circuit breaker held instead of dead-lettering them (once per hold).",
        value=int(breaker["held"]),
    )


# Loopback HTTP answers take well under a millisecond to seconds; DLQ writes are broker round trips.
_APP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_DLQ_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
# Answers through /v1/acks come within a record's lock: milliseconds to the lock's minutes.
_ACK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class LatencyHistogram(Collector):
    """A latency histogram the engine observes into at the cost of one bisection (C) and two
    additions, exported as prometheus-client's `Histogram` would write it (`_bucket{le}`, `_count`,
    `_sum`): no lock, no per-observation call into prometheus-client on the record path.

    Every call runs in trio's thread (the engine observes, `/metrics` renders), so no lock.
    """

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = (*buckets, math.inf)
        # `le` as prometheus-client writes it: the float's repr, `+Inf` for the last.
        self._labels = ["+Inf" if b == math.inf else repr(float(b)) for b in self._bounds]
        self._counts = [0] * len(self._bounds)  # per bucket, not cumulative
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        # The first bucket whose upper bound is >= seconds (Prometheus buckets are `le`).
        self._counts[bisect_left(self._bounds, seconds)] += 1
        self._sum += seconds

    def collect(self) -> Iterator[HistogramMetricFamily]:
        buckets: list[tuple[str, float]] = []
        total = 0
        for label, count in zip(self._labels, self._counts, strict=True):
            total += count
            buckets.append((label, total))
        yield HistogramMetricFamily(
            self._name, self._documentation, buckets=buckets, sum_value=self._sum
        )


class Metrics:
    def __init__(self, engine: Engine, config: Config) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(EngineCollector(engine, config))
        # The process's own: CPU, memory, file descriptors (`process_*`) and the cyclic garbage
        # collector (`python_gc_*`: the record path makes no cycles, so its objects collected stay
        # flat while records flow).
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.app_latency = LatencyHistogram(
            "dlq_sidecar_app_request_duration_seconds",
            "Time from sending a delivery to the app until its answer was read.",
            _APP_BUCKETS,
        )
        self.dlq_latency = LatencyHistogram(
            "dlq_sidecar_dlq_write_duration_seconds",
            "Time from starting a DLQ write until the broker confirmed it (acks=all), retries included.",
            _DLQ_BUCKETS,
        )
        self.ack_delay = LatencyHistogram(
            "dlq_sidecar_app_ack_delay_seconds",
            "Time from handing a record to the app for a later answer (a pull, or a push answered"
            " deferred) until its accept, release or reject arrived through POST /v1/acks.",
            _ACK_BUCKETS,
        )
        for histogram in (self.app_latency, self.dlq_latency, self.ack_delay):
            self.registry.register(histogram)
        engine.observe_latencies(
            self.app_latency.observe, self.dlq_latency.observe, self.ack_delay.observe
        )

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
