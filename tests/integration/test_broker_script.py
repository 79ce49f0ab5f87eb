"""scripts/kafka: start, status, stop, and a second start that uses the cache only."""

from __future__ import annotations

import os
import socket
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


@pytest.mark.slow
# In process, the launcher's Popen of the JVM (left running on purpose, as `scripts/kafka start` does) warns
# when it is collected while the broker still runs.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("taken", ["broker", "controller"])
def test_a_port_taken_between_the_pick_and_the_bind_means_a_start_on_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], taken: str
) -> None:
    # The launcher picks free ports, and the JVM binds them seconds later; on a busy machine another
    # process can take one in between. Here one is taken on purpose: the first pick (the broker's
    # listener) or the second (the controller's) is a port this test already listens on.
    from sidecar.ops.broker import process as kafka_broker

    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("DLQ_KAFKA_STATE_DIR", str(tmp_path / "state"))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        held_port = held.getsockname()[1]
        picks = iter([held_port] if taken == "broker" else [kafka_broker.free_port(), held_port])
        real = kafka_broker.free_port
        monkeypatch.setattr(kafka_broker, "free_port", lambda: next(picks, None) or real())
        try:
            assert kafka_broker.start() == 0
            out, err = capsys.readouterr()
            addr = out.strip().splitlines()[-1]
            assert "was taken before it could listen; starting on new ports" in err, err
            assert addr != f"127.0.0.1:{held_port}"
            Broker(addr).create_topic("port-retry-check", partitions=1)  # a working broker
        finally:
            assert kafka_broker.stop() == 0
