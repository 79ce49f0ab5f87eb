"""`errors.deadletterqueue.circuit.breaker.*`: defaults, values, and bad values naming their key."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config import ConfigError, load_config
from sidecar.core.breaker import BreakerPolicy, BreakerState, CircuitBreaker
from sidecar.engines.breaker_gate import breaker_for

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


def test_on_by_default_with_values_for_small_topics(tmp_path: Path) -> None:
    dlq = load(tmp_path, {}).errors.dlq
    assert dlq.circuit_breaker_enable is True
    assert (
        dlq.circuit_breaker_ratio,
        dlq.circuit_breaker_window_ms,
        dlq.circuit_breaker_min_records,
        dlq.circuit_breaker_cooldown_ms,
    ) == (0.5, 300_000, 5, 30_000)
    assert load(tmp_path, {KEY + "enable": False}).errors.dlq.circuit_breaker_enable is False


def default_breaker(tmp_path: Path) -> CircuitBreaker:
    breaker = breaker_for(load(tmp_path, {}))
    assert breaker is not None, "the breaker is on by default"
    return breaker


@pytest.mark.parametrize("gap_ms", [100, 10_000, 50_000])
def test_default_stops_a_broken_deploy_on_a_five_record_topic(tmp_path: Path, gap_ms: int) -> None:
    """Every record of a small topic dead-lettered (at the limit, or rejected), fast or slowly:
    the breaker opens at the fifth, which it holds; four reach the DLQ."""
    breaker = default_breaker(tmp_path)
    written = [breaker.dead_letter(i * gap_ms).write for i in range(5)]
    assert written == [True, True, True, True, False]
    assert breaker.state is BreakerState.OPEN
    assert breaker.room() == 0


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("per_second", [1000.0, 1.0, 0.05])
def test_default_never_trips_on_one_poison_pill_in_a_thousand(
    tmp_path: Path, seed: int, per_second: float
) -> None:
    """10 000 records, ten of them poison at random places (the first record may be one), at a
    thousand records a second, one a second, or one every twenty seconds: never tripped."""
    rng = random.Random(seed)
    pills = set(rng.sample(range(10_000), 10)) | ({0} if seed % 2 else set())
    breaker = default_breaker(tmp_path)
    for i in range(10_000):
        now_ms = int(i * 1000 / per_second)
        if i in pills:
            assert breaker.dead_letter(now_ms).write, (seed, i)
        else:
            breaker.succeeded(now_ms)
    assert breaker.state is BreakerState.CLOSED


def test_default_never_trips_on_two_poison_pills_in_a_row_at_the_start(tmp_path: Path) -> None:
    breaker = default_breaker(tmp_path)
    assert breaker.dead_letter(0).write and breaker.dead_letter(1).write
    for i in range(2, 50):
        breaker.succeeded(i)
    assert breaker.state is BreakerState.CLOSED


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
