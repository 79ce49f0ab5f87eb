"""Session fixtures: one real Kafka broker per test session, unique names per test.

The broker is started with the project's own script (scripts/kafka) unless KAFKA_BOOTSTRAP points at one; the
Schema Registry (tests/registry.py) only when a test asks for it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.ops.broker import PORT_RANGE_ENV, default_pick_range
from tests.kafkatools import Broker
from tests.registry import SchemaRegistry, install_registry

ROOT = Path(__file__).resolve().parent.parent
KAFKA_SCRIPT = ROOT / "scripts" / "kafka"


def worker_port_range(worker: str | None, workers: int) -> tuple[int, int] | None:
    """The ports parallel test worker `worker` ("gw0", ...) of `workers` picks from: a slice of its own of
    the range below the kernel's ephemeral ports, so that no other worker can take a port of its brokers
    while they are down (a kill and restart), nor between a pick and its bind. None: not a worker."""
    if not worker or not worker.startswith("gw") or workers < 2:
        return None
    whole = default_pick_range()
    span = len(whole) // workers
    low = whole.start + int(worker[2:]) * span
    return low, low + span - 1


def stale_compiled_core() -> list[str]:
    """Core sources edited after `make compiled` built the extension modules Python imports instead.

    The build's shared library (``sidecar/core/_native__mypyc*.so``) is rebuilt whenever a
    compiled source changes; a source newer than it is not what the tests would run."""
    if os.environ.get("DLQ_SIDECAR_PURE", "") not in ("", "0"):
        return []
    built = [path.stat().st_mtime for path in (ROOT / "sidecar" / "core").glob("_native__mypyc.*")]
    if not built:
        return []
    sources = [
        path
        for path in (ROOT / "sidecar" / "core").rglob("*.py")
        if path.name != "__init__.py" and path.stat().st_mtime > min(built)
    ]
    return [str(path.relative_to(ROOT)) for path in sorted(sources)]


def pytest_configure(config: pytest.Config) -> None:
    stale = stale_compiled_core()
    if stale:
        pytest.exit(
            f"{', '.join(stale)}: edited after `make compiled`; run `make compiled` again, "
            "`make pure` to remove the build, or set DLQ_SIDECAR_PURE=1",
            returncode=4,
        )
    # The share engine's journal defaults to a file under $XDG_STATE_HOME (share.journal.path:
    # auto): the sidecars a test session starts keep theirs in a directory of the session's own,
    # never in the user's ~/.local/state.
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="dlq-sidecar-state-")
    picks = worker_port_range(
        os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    )
    if picks is not None and PORT_RANGE_ENV not in os.environ:
        os.environ[PORT_RANGE_ENV] = f"{picks[0]}-{picks[1]}"  # inherited by the brokers it starts


# Run order, longest tier first: `make pytest` runs files side by side (pytest-xdist, one file per worker), and a
# long file that starts last would run alone at the end.
_TIER_ORDER = ("node", "reliability", "integration", "e2e", "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def tier(item: pytest.Item) -> int:
        parts = item.path.relative_to(ROOT).parts
        name = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
        return _TIER_ORDER.index(name) if name in _TIER_ORDER else len(_TIER_ORDER)

    items.sort(key=tier)  # stable: each tier keeps its files' and tests' own order


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    external = os.environ.get("KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    state_dir = tempfile.mkdtemp(prefix="dlq-test-broker-")
    env = {**os.environ, "DLQ_KAFKA_STATE_DIR": state_dir}
    proc = subprocess.run(
        [sys.executable, str(KAFKA_SCRIPT), "start"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.fail(f"could not start the test broker:\n{proc.stderr}", pytrace=False)
    try:
        yield proc.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run([sys.executable, str(KAFKA_SCRIPT), "stop"], env=env, check=False)


@pytest.fixture(scope="session")
def broker(bootstrap: str) -> Broker:
    return Broker(bootstrap)


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[SchemaRegistry]:
    """A real Schema Registry (Apicurio, Confluent API), started on loopback the first time a test asks."""
    try:
        registry = SchemaRegistry(install_registry())
        registry.start()
    except RuntimeError as exc:
        pytest.fail(f"could not start the schema registry: {exc}", pytrace=False)
    try:
        yield registry
    finally:
        registry.stop()


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A short name unique to this test, safe for topics and groups."""
    base = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name)[:40].strip("-")
    return f"{base}-{uuid.uuid4().hex[:8]}"
