"""A secured broker for the integration tests: `scripts/kafka start --secured` in a state dir of its own.

Started once per session, the first time a test asks for `secured_kafka`, and stopped at the end. It is a
second broker beside the session's plain one (never KAFKA_BOOTSTRAP's: that one has no secured listeners).
Also the `helm` binary of the chart tests (test_helm.py, test_helm_monitoring.py, ...) and the `promtool`
of the alert-rule tests (test_alert_rules.py, test_promtool_rules.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import KAFKA_SCRIPT
from tests.integration.test_alert_rules import find_promtool
from tests.integration.test_helm import find_helm
from tests.kafkatools import SecuredKafka


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_helm()
    if path is None:
        pytest.fail(
            "helm not found ($DLQ_HELM, ~/.cache/dlq-sidecar/bin/helm, PATH): run scripts/install-helm",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    path = find_promtool()
    if path is None:
        pytest.fail(
            "promtool not found ($DLQ_PROMTOOL, ~/.cache/dlq-sidecar/bin/promtool, PATH): "
            "run scripts/install-promtool",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def secured_kafka() -> Iterator[SecuredKafka]:
    state_dir = Path(tempfile.mkdtemp(prefix="dlq-secured-broker-"))
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"}
    env["DLQ_KAFKA_STATE_DIR"] = str(state_dir)
    env.setdefault("DLQ_KAFKA_HEAP", "384m")
    proc = subprocess.run(
        [sys.executable, str(KAFKA_SCRIPT), "start", "--secured"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(f"could not start the secured test broker:\n{proc.stderr}", pytrace=False)
    try:
        yield SecuredKafka.from_state_file(state_dir / "broker.json")
    finally:
        subprocess.run(
            [sys.executable, str(KAFKA_SCRIPT), "stop"], env=env, check=False, timeout=120
        )
        shutil.rmtree(state_dir, ignore_errors=True)
