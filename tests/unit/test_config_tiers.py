"""`errors.retry.tiers`, `errors.retry.tier.*`: values, the tier chosen for a delay, bad values naming their key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import ConfigError, dump_config, load_config, parse_config

MINIMAL: dict[str, Any] = {
    "kafka": {"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"},
    "source": {"topics": ["orders"]},
    "app": {"url": "http://127.0.0.1:8080/records"},
}


def load(tmp_path: Path, extra: dict[str, Any]) -> Any:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, **extra}), encoding="utf-8")
    return load_config(path, {})


def test_none_by_default(tmp_path: Path) -> None:
    tiers = load(tmp_path, {}).errors.tiers
    assert not tiers.enabled
    assert tiers.tier_for(10**9) is None


def test_durations_labels_topics_and_the_tier_of_a_delay(tmp_path: Path) -> None:
    tiers = load(
        tmp_path,
        {
            "errors.retry.tiers": [1500, "1m", "10m", "1h", "6h", "1d"],
            "errors.retry.tier.threshold.ms": 30000,
        },
    ).errors.tiers
    assert tiers.delays_ms == (1500, 60_000, 600_000, 3_600_000, 21_600_000, 86_400_000)
    assert [tiers.label(i) for i in range(6)] == ["1500ms", "1m", "10m", "1h", "6h", "1d"]
    assert tiers.topic("orders", 2) == "dlq.orders.retry.10m"
    assert tiers.tier_for(30_000) is None  # at the threshold: in memory
    assert tiers.tier_for(30_001) == 1  # the smallest tier that covers it
    assert tiers.tier_for(600_000) == 2
    assert tiers.tier_for(600_001) == 3
    assert tiers.tier_for(10**10) == 5  # beyond them all: the longest


def test_dump_reads_back_equal(tmp_path: Path) -> None:
    config = load(
        tmp_path, {"errors.retry.tiers": ["2s", "1h"], "errors.retry.tier.threshold.ms": 1000}
    )
    assert parse_config(dump_config(config, mask_secrets=False), {}) == config


@pytest.mark.parametrize(
    ("extra", "path", "reason"),
    [
        ({"errors.retry.tiers": "1m"}, "errors.retry.tiers", "expected a list of durations"),
        ({"errors.retry.tiers": ["1m", "fast"]}, "errors.retry.tiers[1]", "expected a duration"),
        (
            {"errors.retry.tiers": ["1h", "10m"]},
            "errors.retry.tiers[1]",
            "longer than the one before (1h)",
        ),
        (
            {"errors.retry.tiers": ["1m", "1m"]},
            "errors.retry.tiers[1]",
            "longer than the one before",
        ),
        ({"errors.retry.tiers": [50]}, "errors.retry.tiers[0]", "between 100ms and 30d"),
        ({"errors.retry.tiers": [True]}, "errors.retry.tiers[0]", "expected a duration"),
        (
            {"errors.retry.tiers": ["1m"], "errors.retry.tier.threshold.ms": 60000},
            "errors.retry.tier.threshold.ms",
            "must be below the longest tier",
        ),
        (
            {"errors.retry.tiers": ["1h"], "errors.retry.tier.topic.name": "retry.{topic}.{tier}"},
            "errors.retry.tier.topic.name",
            "must start with 'dlq.' (errors.deadletterqueue.topic.name.prefix)",
        ),
        (
            {"errors.retry.tiers": ["1h"], "errors.retry.tier.topic.name": "dlq.{topic}"},
            "errors.retry.tier.topic.name",
            "must contain '{tier}'",
        ),
        (
            {
                "errors.retry.tiers": ["1h"],
                "errors.retry.tier.topic.name": "dlq.{tier}",
                "source": {"topics": ["a", "b"]},
            },
            "errors.retry.tier.topic.name",
            "must contain '{topic}'",
        ),
        (
            {
                "errors.retry.tiers": ["1h"],
                "errors.retry.tier.topic.name": "dlq.{topic}.{tier}.{x}",
            },
            "errors.retry.tier.topic.name",
            "only '{topic}' and '{tier}' are substituted",
        ),
        (
            {
                "errors.retry.tiers": ["1h"],
                "errors.retry.tier.topic.name": "dlq.{topic}{tier}",
                "errors.deadletterqueue.topic.name": "dlq.orders1h",
            },
            "errors.retry.tier.topic.name",
            "is a source or DLQ topic",
        ),
    ],
)
def test_bad_values_name_their_key(
    tmp_path: Path, extra: dict[str, Any], path: str, reason: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, extra)
    assert err.value.path == path
    assert reason in str(err.value)


def test_the_command_exits_2_with_the_key(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        yaml.safe_dump({**MINIMAL, "errors.retry.tiers": ["10m", "1m"]}), encoding="utf-8"
    )
    run = subprocess.run(
        [sys.executable, "-m", "sidecar", "check-config", "-c", str(path)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert "errors.retry.tiers[1]" in run.stderr
