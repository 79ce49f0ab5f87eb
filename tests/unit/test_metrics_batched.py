"""The latency histograms' batched observers (sidecar.service.metrics): nothing is lost or late."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from sidecar.service.metrics import _FOLD_AT, _Batched


def _count(registry: CollectorRegistry) -> float:
    value = registry.get_sample_value("h_seconds_count")
    return 0.0 if value is None else value


def test_observations_reach_the_histogram_when_folded() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("h_seconds", "test", buckets=(0.001, 0.01), registry=registry)
    batched = _Batched(histogram)
    for seconds in (0.0005, 0.005, 0.5):
        batched.observe(seconds)
    assert _count(registry) == 0  # kept in the list until a scrape folds them in
    batched.fold()
    assert _count(registry) == 3
    assert registry.get_sample_value("h_seconds_bucket", {"le": "0.001"}) == 1
    assert registry.get_sample_value("h_seconds_bucket", {"le": "0.01"}) == 2
    assert registry.get_sample_value("h_seconds_sum") == pytest.approx(0.5055)
    batched.fold()
    assert _count(registry) == 3  # folded once, not twice


def test_without_a_scrape_the_list_is_folded_every_fold_at_observations() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("h_seconds", "test", registry=registry)
    batched = _Batched(histogram)
    for _ in range(_FOLD_AT - 1):
        batched.observe(0.001)
    assert _count(registry) == 0
    batched.observe(0.001)
    assert _count(registry) == _FOLD_AT
    assert len(batched._pending) == 0
