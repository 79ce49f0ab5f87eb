"""A private Kafka broker the tests may kill: start, SIGKILL, SIGSTOP/SIGCONT, restart on the same log dir.

Built from the same jars and settings as scripts/kafka (the helpers of sidecar/ops/broker, which that
script runs), with two client listeners: EXTERNAL, advertised at a port the caller chooses (a fault proxy's
port, so every connection a client learns from metadata goes through the proxy), and INTERNAL, advertised as
itself, for the test's own producer and checker and for the broker's inter-broker traffic (transaction markers),
which must never be proxied.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from sidecar.ops import broker as KS

free_port = KS.free_port


class PrivateBroker:
    """A combined broker and controller (node 1); or, given `controller`, a broker-only node that
    joins that one's cluster (same cluster id, its controller quorum). `extra` overrides settings."""

    def __init__(
        self,
        advertised_port: int | None = None,
        heap: str = "384m",
        *,
        node_id: int = 1,
        controller: PrivateBroker | None = None,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.run_dir = Path(tempfile.mkdtemp(prefix="kafka-private-"))
        self.data_dir = self.run_dir / "data"
        self.external_port = free_port()
        self.internal_port = free_port()
        self.node_id = node_id
        self.controller = controller
        self.controller_port = controller.controller_port if controller else free_port()
        self.cluster_id = controller.cluster_id if controller else str(KS.new_cluster_id())
        self.extra = dict(extra or {})
        self.advertised_port = advertised_port or self.external_port
        self.heap = heap
        self.proc: subprocess.Popen[bytes] | None = None
        self.config_path = self.run_dir / "server.properties"
        self.log_path = self.run_dir / "broker.log"
        self._write_config()
        self._formatted = False

    @property
    def direct(self) -> str:
        """Bootstrap for the test's own clients: the INTERNAL listener, never proxied."""
        return f"127.0.0.1:{self.internal_port}"

    @property
    def external(self) -> str:
        """Bootstrap for the sidecar: the advertised EXTERNAL address (the proxy, when there is one)."""
        return f"127.0.0.1:{self.advertised_port}"

    @property
    def upstream(self) -> tuple[str, int]:
        """Where a proxy in front of the EXTERNAL listener forwards to."""
        return ("127.0.0.1", self.external_port)

    def _write_config(self) -> None:
        controller_id = self.controller.node_id if self.controller else self.node_id
        listeners = (
            f"EXTERNAL://127.0.0.1:{self.external_port},INTERNAL://127.0.0.1:{self.internal_port}"
        )
        if self.controller is None:
            listeners += f",CONTROLLER://127.0.0.1:{self.controller_port}"
        props = {
            "process.roles": "broker" if self.controller else "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": f"{controller_id}@127.0.0.1:{self.controller_port}",
            "listeners": listeners,
            "advertised.listeners": (
                f"EXTERNAL://127.0.0.1:{self.advertised_port},INTERNAL://127.0.0.1:{self.internal_port}"
            ),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "INTERNAL",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,EXTERNAL:PLAINTEXT,INTERNAL:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "2",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "2",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "2",
            "group.initial.rebalance.delay.ms": "0",
            "log.segment.bytes": str(16 * 1024 * 1024),
        }
        props.update(self.extra)
        self.config_path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))

    def _format(self) -> None:
        libs = KS.fetch_jars()
        cmd = KS.java_cmd(
            libs,
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            self.cluster_id,
            "--config",
            str(self.config_path),
            "--ignore-formatted",
            heap="256m",
        )
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"formatting the private broker failed:\n{res.stdout}{res.stderr}")
        self._formatted = True

    def start(self, timeout_s: float = 90.0) -> float:
        """Start (formatting the storage the first time); returns the seconds until it answered."""
        if not self._formatted:
            self._format()
        started = time.monotonic()
        libs = KS.fetch_jars()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                KS.java_cmd(libs, "kafka.Kafka", str(self.config_path), heap=self.heap),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"private broker exited ({self.proc.returncode}):\n{self.log_tail()}"
                )
            if KS.broker_answers(self.direct):
                return time.monotonic() - started
            time.sleep(0.2)
        raise RuntimeError(f"private broker did not answer in {timeout_s}s:\n{self.log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 40) -> str:
        return str(KS.log_tail(self.log_path, n))

    def _signal(self, sig: int) -> None:
        assert self.proc is not None and self.proc.poll() is None, "broker not running"
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, the log dir is left as a crash leaves it."""
        self._signal(signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(30)

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def restart(self, timeout_s: float = 90.0) -> float:
        """SIGKILL then start again on the same log dir; returns the seconds until it answered."""
        self.kill()
        return self.start(timeout_s)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def __enter__(self) -> PrivateBroker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
