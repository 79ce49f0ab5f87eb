"""The Prometheus text exposition (`GET /metrics`) read back by the tests."""

from __future__ import annotations


def prometheus_values(text: str) -> dict[str, float]:
    """`GET /metrics` text as {'name{labels}': value} (labels as the exposition writes them)."""
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
