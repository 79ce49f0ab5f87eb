"""A sidecar pointed at a broker it cannot reach, through the installed command: a few log lines,
not hundreds; the sidecar's own plain line first (which broker, what failed, what it does), and
librdkafka's repeats summarised; a SIGTERM before the broker was reached logs no "running"."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.test_cli import GOOD, _script

WATCH_S = 6.0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


def _run_for(tmp_path: Path, bootstrap: str) -> list[dict[str, object]]:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    doc["kafka"]["bootstrap.servers"] = bootstrap
    doc["api"] = {"listen": "127.0.0.1:0"}
    doc["logging"] = {"format": "json"}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(doc))
    err = tmp_path / "err.log"
    with err.open("w") as out:
        proc = subprocess.Popen([_script(), "run", "-c", str(config)], stderr=out)
        try:
            time.sleep(WATCH_S)
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            assert proc.wait(timeout=40) == 0, err.read_text()[-3000:]
            # The start-up check in progress ends with the stop (it used to run out its 10 s).
            assert time.monotonic() - signalled < 5, err.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = err.read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize(
    ("bootstrap", "said"),
    [
        (f"127.0.0.1:{_closed_port()}", "refuses connections"),
        ("no-such-broker.invalid:9092", "does not resolve (DNS)"),
    ],
    ids=["refused", "dns"],
)
def test_an_unreachable_broker_gives_a_few_plain_lines(
    tmp_path: Path, bootstrap: str, said: str
) -> None:
    lines = _run_for(tmp_path, bootstrap)
    text = "\n".join(json.dumps(line) for line in lines)
    # Before: about 20 librdkafka ERROR lines a second (some 120 in 6 s), the sidecar's own after 10 s.
    assert len(lines) <= 12, text
    kafka = [
        i for i, line in enumerate(lines) if str(line["logger"]).startswith("sidecar.librdkafka")
    ]
    own = [i for i, line in enumerate(lines) if line["logger"] == "sidecar.kafka"]
    assert own and kafka, text
    assert own[0] < kafka[0], text
    first = lines[own[0]]
    host = bootstrap.rsplit(":", 1)[0]
    assert host in str(first["msg"]) and said in str(first["msg"]), first
    assert "not ready" in str(first["msg"]) and "retries" in str(first["msg"]), first
    assert first["level"] == "warning"
    assert all(lines[i]["level"] == "warning" for i in kafka), text
    assert len(kafka) <= 2, text  # one per distinct condition in the interval
    assert not any("dlq-sidecar running" in str(line["msg"]) for line in lines), text
    listening = next(line for line in lines if "listening on" in str(line["msg"]))
    assert "127.0.0.1:" in str(listening["msg"]), listening
