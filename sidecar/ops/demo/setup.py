"""What the demo sets up before it runs anything: its files, its ports, its config and its broker.

Owns finding the files the demo ships (`find_layout`), picking the app's and the API's ports
(`pick_port`, the broker launcher's `free_port` when the documented one is busy), deriving the run's
config from config.example.yaml (`derive_config`), finding or starting a broker through the launcher
behind `scripts/kafka` (`sidecar.ops.broker`, run as `python -m`) and recreating the source topic.
Must not import the engine, the daemon or the API modules.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sidecar.core.errors import SidecarError
from sidecar.ops.broker import free_port

_HERE = Path(__file__).resolve().parent
_DATA = _HERE / "data"


class DemoError(SidecarError):
    """Something the demo needs is missing or failed; the message says what and what to do."""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the demo's files are; `root` is where its children run (it holds `sidecar/`)."""

    root: Path
    kafka_script: Path
    example_config: Path
    example_app: Path


def find_layout() -> Layout:
    """The files the demo runs, shipped in this package."""
    # In a checkout the data files are links into the repository: resolved, the demo names (and
    # runs) examples/python/app.py and config.example.yaml themselves.
    layout = Layout(
        _HERE.parents[2],
        _HERE.parent / "broker" / "__main__.py",
        (_DATA / "config.example.yaml").resolve(),
        (_DATA / "example_app.py").resolve(),
    )
    missing = [
        str(p)
        for p in (layout.kafka_script, layout.example_config, layout.example_app)
        if not p.is_file()
    ]
    if missing:
        raise DemoError(
            "the dlq-sidecar package is incomplete: the demo cannot find " + ", ".join(missing)
        )
    return layout


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port(preferred: int) -> int:
    """`preferred` when it is free, else a free port the way the broker launcher picks one (below
    the ephemeral range: see `sidecar.ops.broker.ports.free_port`)."""
    return preferred if port_is_free(preferred) else free_port()


def derive_config(
    example: Path,
    out: Path,
    *,
    bootstrap: str,
    group: str,
    topic: str,
    app_url: str,
    api_listen: str,
) -> dict[str, Any]:
    """Write the demo's config: config.example.yaml with the run's addresses and short backoffs.

    The example file stays the documented, working file; only what differs per run (and the
    backoffs, so released orders come back within the demo's seconds) is overridden.
    """
    cfg = yaml.safe_load(example.read_text(encoding="utf-8"))
    cfg["kafka"]["bootstrap.servers"] = bootstrap
    cfg["kafka"]["group.id"] = group
    cfg["source"]["topics"] = [topic]
    cfg["app"]["url"] = app_url
    cfg["errors.retry.delay.initial.ms"] = 100
    cfg["errors.retry.delay.max.ms"] = 1000
    cfg["commit.interval.ms"] = 500
    cfg["shutdown.drain.timeout.ms"] = 5000
    cfg["api"]["listen"] = api_listen
    header = (
        f"# Written by `dlq-sidecar demo` from {example}: the same file with this run's broker,\n"
        "# group, topic, app and API addresses, and short retry backoffs.\n"
    )
    out.write_text(header + yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")

    from sidecar.config import ConfigError, load_config

    try:
        load_config(out)
    except ConfigError as exc:
        raise DemoError(f"the derived config {out} is not valid: {exc}") from None
    return dict(cfg)


# --------------------------------------------------------------------------- the broker


def run_kafka_script(
    layout: Layout, command: str, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar.ops.broker", command],
        stdout=subprocess.PIPE,
        stderr=None if command == "start" else subprocess.PIPE,  # start's progress goes to the user
        text=True,
        timeout=timeout_s,
        check=False,
    )


def find_or_start_broker(layout: Layout, say: Callable[[str], None]) -> tuple[str, bool]:
    """(bootstrap, started by us). KAFKA_BOOTSTRAP wins; a running local broker is reused."""
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if not external:
        status = run_kafka_script(layout, "status", 30)
        if status.returncode == 0 and status.stdout.strip():
            bootstrap = status.stdout.strip().splitlines()[-1]
            say(f"using the local broker at {bootstrap}")
            return bootstrap, False
        say("starting a local Kafka broker (scripts/kafka start) ...")
    proc = run_kafka_script(layout, "start", 600)
    if proc.returncode != 0 or not proc.stdout.strip():
        where = f"KAFKA_BOOTSTRAP={external}" if external else "scripts/kafka start"
        raise DemoError(f"no Kafka broker: {where} failed (exit {proc.returncode}); see above")
    bootstrap = proc.stdout.strip().splitlines()[-1]
    if external:
        say(f"using the broker at {bootstrap} (KAFKA_BOOTSTRAP)")
        return bootstrap, False
    return bootstrap, True


def existing_topics(bootstrap: str, names: Sequence[str]) -> list[str]:
    """Which of `names` the broker at `bootstrap` has (the ones the demo would delete)."""
    from sidecar.kafka.tools import KafkaCallError, TopicAdmin

    try:
        existing = set(TopicAdmin({"bootstrap.servers": bootstrap}).topics())
    except KafkaCallError as exc:
        raise DemoError(f"the broker at {bootstrap} does not answer: {exc}") from None
    return [name for name in names if name in existing]


def recreate_topic(bootstrap: str, topic: str, dlq_topic: str, partitions: int) -> None:
    """Delete the topic and its DLQ if they exist, so each run starts from empty, then create the topic.

    The DLQ topic is left for the sidecar to create at start-up (errors.deadletterqueue.auto.create.enable).
    """
    from sidecar.kafka.tools import KafkaCallError, TopicAdmin

    try:
        admin = TopicAdmin({"bootstrap.servers": bootstrap})
        existing = set(admin.topics())
    except KafkaCallError as exc:
        raise DemoError(f"the broker at {bootstrap} does not answer: {exc}") from None
    admin.delete_topics([t for t in (topic, dlq_topic) if t in existing])
    deadline = time.monotonic() + 60
    while True:
        # Deletion finishes asynchronously; creating too early fails with TOPIC_ALREADY_EXISTS.
        try:
            admin.create_topic(topic, partitions, 1)
            break
        except KafkaCallError as exc:
            if time.monotonic() > deadline:
                raise DemoError(str(exc)) from None
            time.sleep(0.2)
    while time.monotonic() < deadline:
        if admin.leaders_ready(topic, partitions) and dlq_topic not in admin.topics(5):
            return
        time.sleep(0.1)
    raise DemoError(f"topic {topic} has no leader after 60 s")


__all__ = [
    "DemoError",
    "Layout",
    "derive_config",
    "existing_topics",
    "find_layout",
    "find_or_start_broker",
    "pick_port",
    "port_is_free",
    "recreate_topic",
    "run_kafka_script",
]
