"""`errors.deadletterqueue.circuit.breaker.*`: defaults, values, and bad values naming their key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import ConfigError, load_config
from sidecar.core.breaker import BreakerPolicy

KEY = "errors.deadletterqueue.circuit.breaker."
MINIMAL: dict[str, Any] = {
    "kafka": {"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"},
    "source": {"topics": ["orders"]},
    "app": {"url": "http://127.0.0.1:8080/records"},
}


def load(tmp_path: Path, extra: dict[str, Any]) -> Any:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, **extra}), encoding="utf-8")
    return load_config(path, {})


def test_off_by_default_with_conservative_values(tmp_path: Path) -> None:
    dlq = load(tmp_path, {}).errors.dlq
    assert dlq.circuit_breaker_enable is False
    assert (
        dlq.circuit_breaker_ratio,
        dlq.circuit_breaker_window_ms,
        dlq.circuit_breaker_min_records,
        dlq.circuit_breaker_cooldown_ms,
    ) == (0.5, 60_000, 100, 30_000)


def test_values_are_read_and_make_a_valid_policy(tmp_path: Path) -> None:
    dlq = load(
        tmp_path,
        {
            KEY + "enable": True,
            KEY + "ratio": 0.25,
            KEY + "window.ms": 5000,
            KEY + "min.records": 7,
            KEY + "cooldown.ms": 2000,
        },
    ).errors.dlq
    assert dlq.circuit_breaker_enable is True
    policy = BreakerPolicy(
        dlq.circuit_breaker_ratio,
        dlq.circuit_breaker_window_ms,
        dlq.circuit_breaker_min_records,
        dlq.circuit_breaker_cooldown_ms,
    )
    assert (policy.ratio, policy.window_ms, policy.min_records, policy.cooldown_ms) == (
        0.25,
        5000,
        7,
        2000,
    )


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("enable", "yes please", "expected"),
        ("ratio", 1.0, "must be below 1"),
        ("ratio", 1.5, "a number in 0.0..1.0"),
        ("ratio", -0.1, "a number in 0.0..1.0"),
        ("window.ms", 999, "1000..86400000"),
        ("min.records", 0, "1..10000000"),
        ("cooldown.ms", "soon", "expected an integer"),
        ("cooldown.ms", 0, "1000..86400000"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, key: str, value: object, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, {KEY + key: value})
    assert info.value.path == KEY + key
    assert reason in info.value.reason


def test_check_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**MINIMAL, KEY + "ratio": 1.0}), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "sidecar", "check-config", "-c", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert KEY + "ratio" in done.stderr
