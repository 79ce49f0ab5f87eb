"""A real Schema Registry for the tests: Apicurio Registry, installed by scripts/install-registry.

It serves the Confluent API at ``/apis/ccompat/v7``; both of its listeners (the API and Quarkus' management
port) are bound to loopback on ports picked free. Storage is in memory: every start is an empty registry.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from sidecar.ops.broker import free_port

ROOT = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = ROOT / "scripts" / "install-registry"
CCOMPAT = "/apis/ccompat/v7"


def install_registry() -> Path:
    """The registry's home (scripts/install-registry: fetched once into the cache)."""
    proc = subprocess.run(
        [str(INSTALL_SCRIPT)], capture_output=True, text=True, check=False, timeout=600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/install-registry failed:\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


class SchemaRegistry:
    """One registry process: `start()` returns once its API answers, `stop()` ends it."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.mkstemp(prefix="dlq-test-registry-", suffix=".log")[1])

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL (what a SchemaRegistryClient is given)."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT}"

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def start(self, timeout_s: float = 120.0) -> None:
        self.port = free_port()
        env = {
            **os.environ,
            "QUARKUS_HTTP_HOST": "127.0.0.1",
            "QUARKUS_HTTP_PORT": str(self.port),
            # Quarkus' management listener (health, metrics) is on 0.0.0.0:9000 unless told otherwise.
            "QUARKUS_MANAGEMENT_HOST": "127.0.0.1",
            "QUARKUS_MANAGEMENT_PORT": str(free_port()),
        }
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(self.home / "start")],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the registry exited ({self.proc.returncode}) before it answered:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the registry did not answer in {timeout_s:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
