"""`dlq inspect` and `dlq replay` pointed at a broker nothing listens on, through the installed
command: a few lines on stderr before their error, not librdkafka's hundreds; the sidecar's own plain
line says which broker and what failed (its log summary is the one every client gets)."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.e2e.test_cli import _script

# librdkafka logs each reconnect attempt of each client: about 20 lines a second for 15 s before.
MAX_LINES = 12


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


@pytest.mark.parametrize(
    "args",
    [
        ["dlq", "inspect", "--topic", "dlq.orders"],
        ["dlq", "replay", "--from", "dlq.orders", "--name", "fix-1", "--dry-run"],
    ],
    ids=["inspect", "replay"],
)
def test_an_unreachable_broker_is_a_few_lines_then_the_error(args: list[str]) -> None:
    bootstrap = f"127.0.0.1:{_closed_port()}"
    proc = subprocess.run(
        [_script(), *args, "--bootstrap", bootstrap],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) <= MAX_LINES, "\n".join(lines[:40])
    assert any(bootstrap in line and "refused" in line for line in lines), proc.stderr
    assert not any(line.startswith("%") for line in lines), proc.stderr  # no raw librdkafka line
