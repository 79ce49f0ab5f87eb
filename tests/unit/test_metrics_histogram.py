"""The latency histograms (sidecar.service.metrics.LatencyHistogram): written as prometheus-client's own
`Histogram` writes the same observations, bucket for bucket."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from sidecar.service.metrics import LatencyHistogram

BUCKETS = (0.0005, 0.001, 0.0025, 0.01, 0.5, 1.0, 30.0)


def _samples(registry: CollectorRegistry) -> list[str]:
    """The exposition's sample lines without `_created` (prometheus-client's own extra series)."""
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if line and "_created" not in line]


def _both(values: list[float]) -> tuple[list[str], list[str]]:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    histogram = LatencyHistogram("h_seconds", "test", BUCKETS)
    ours.register(histogram)
    reference = Histogram("h_seconds", "test", buckets=BUCKETS, registry=theirs)
    for v in values:
        histogram.observe(v)
        reference.observe(v)
    return _samples(ours), _samples(theirs)


def test_an_observation_on_a_bound_counts_in_that_bucket() -> None:
    ours, theirs = _both([0.001, 0.0005, 30.0, 31.0, 0.0])
    assert ours == theirs
    assert 'h_seconds_bucket{le="0.001"} 3.0' in ours
    assert 'h_seconds_bucket{le="+Inf"} 5.0' in ours
    assert "h_seconds_count 5.0" in ours


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=100.0, allow_nan=False), max_size=50))
def test_the_same_exposition_as_prometheus_clients_histogram(values: list[float]) -> None:
    ours, theirs = _both(values)
    assert ours == theirs
