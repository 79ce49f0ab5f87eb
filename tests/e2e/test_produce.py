"""`dlq-sidecar produce` through the installed command, on the real broker: one record per line, the
key before the separator, headers on every record, the topic created when missing."""

from __future__ import annotations

import subprocess

from tests.e2e.test_cli import _script
from tests.kafkatools import Broker


def test_lines_become_records_on_a_topic_it_creates(broker: Broker, unique: str) -> None:
    topic = f"produced-{unique}"
    lines = 'o-1:{"id": 1, "amount": 12}\no-2:{"id": 2}\nno key here\n'
    args = ["--topic", topic, "--bootstrap", broker.bootstrap, "--key-separator", ":"]
    done = subprocess.run(
        [_script(), "produce", *args, "--header", "source=try", "--partitions", "2"],
        input=lines,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"created topic {topic} (2 partitions)" in done.stderr
    assert f"produced 3 records to {topic}" in done.stderr
    recs = broker.read_topic(topic, 3, timeout_s=30)
    key_of = {r.value: r.key for r in recs}
    assert key_of == {
        b'{"id": 1, "amount": 12}': b"o-1",
        b'{"id": 2}': b"o-2",
        b"no key here": None,  # no separator: no key
    }
    assert all(r.headers_by_name()["source"] == [b"try"] for r in recs)


def test_no_broker_is_a_usage_error() -> None:
    done = subprocess.run(
        [_script(), "produce", "--topic", "t"],
        input="x\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2, done.stderr
    assert "no broker" in done.stderr
