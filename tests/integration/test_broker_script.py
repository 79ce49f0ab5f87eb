"""scripts/kafka: start, status, stop, and a second start that uses the cache only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import KAFKA_SCRIPT
from tests.kafkatools import Broker


def _run(cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(KAFKA_SCRIPT), cmd],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
def test_start_status_stop_and_cached_restart(tmp_path: Path, bootstrap: str) -> None:
    # The session broker has populated the cache already (or KAFKA_BOOTSTRAP is set, in which case
    # this test starts its own anyway: the script under test must work on its own).
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"}
    env["DLQ_KAFKA_STATE_DIR"] = str(tmp_path / "state")

    assert _run("status", env).returncode == 3

    first = _run("start", env)
    assert first.returncode == 0, first.stderr
    addr = first.stdout.strip().splitlines()[-1]
    assert addr.startswith("127.0.0.1:")
    assert addr != bootstrap  # a second, independent broker on its own free port

    status = _run("status", env)
    assert status.returncode == 0 and status.stdout.strip() == addr

    # It is a working broker: a topic can be created on it.
    Broker(addr).create_topic("script-check", partitions=1)

    # start is idempotent while running.
    again = _run("start", env)
    assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == addr

    stop = _run("stop", env)
    assert stop.returncode == 0, stop.stderr
    assert _run("status", env).returncode == 3

    second = _run("start", env)
    try:
        assert second.returncode == 0, second.stderr
        assert "fetching" not in second.stderr  # the jar cache was used: nothing downloaded
    finally:
        assert _run("stop", env).returncode == 0
    assert _run("status", env).returncode == 3


def test_external_broker_is_used_as_is(bootstrap: str) -> None:
    env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap}
    res = _run("start", env)
    assert res.returncode == 0
    assert res.stdout.strip() == bootstrap
    assert _run("status", env).returncode == 0


def test_external_broker_that_does_not_answer_fails_fast() -> None:
    env = {**os.environ, "KAFKA_BOOTSTRAP": "127.0.0.1:1"}
    res = _run("start", env)
    assert res.returncode == 1
    assert "does not answer" in res.stderr
