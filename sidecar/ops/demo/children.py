"""What the demo runs and reads while it runs: the order producer, the app and sidecar processes, and the
sidecar's counters read from its `GET /v1/status`.

It talks to the sidecar over HTTP only: it must not import the engine, the daemon or the API modules.
"""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.ops.demo.orders import Order

# --------------------------------------------------------------------------- the sidecar's API


def http_get_json(port: int, path: str, timeout_s: float = 2.0) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = json.loads(resp.read())
    finally:
        conn.close()
    if not isinstance(body, dict):
        raise ValueError(f"{path} answered {body!r}")
    return body


@dataclass
class Snapshot:
    """The sidecar's counters at one moment (from GET /v1/status)."""

    at: float
    delivered: dict[str, int]
    attempts: int
    archived: dict[str, int]
    dlq_written: int
    dlq_failed: int
    in_flight: int
    app_reachable: bool
    failure: str | None

    @classmethod
    def from_status(cls, status: dict[str, Any], at: float) -> Snapshot:
        c = status["counters"]
        return cls(
            at=at,
            delivered=dict(c["delivered"]),
            attempts=int(c["attempts"]),
            archived=dict(c["archived"]),
            dlq_written=int(c["dlq_written"]),
            dlq_failed=int(c["dlq_failed"]),
            in_flight=int(status["in_flight"]),
            app_reachable=bool(status["app_reachable"]),
            failure=status.get("failure"),
        )

    @property
    def accepted(self) -> int:
        return self.delivered.get("accept", 0)

    @property
    def archived_total(self) -> int:
        return sum(self.archived.values())

    @property
    def done(self) -> int:
        return self.accepted + self.archived_total


# --------------------------------------------------------------------------- the producer


@dataclass
class Producing:
    """The order stream, produced from a thread; `rate` 0 means as fast as the broker takes it."""

    bootstrap: str
    topic: str
    orders: list[Order]
    rate: float
    produced: int = 0
    errors: list[str] = field(default_factory=list)
    finished: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        from sidecar.kafka.tools import KafkaCallError, ToolProducer

        try:
            producer = ToolProducer({"bootstrap.servers": self.bootstrap}, message_timeout_ms=None)

            def on_done(failure: str | None) -> None:
                if failure is None:
                    self.produced += 1
                else:
                    self.errors.append(failure)

            started = time.monotonic()
            for i, order in enumerate(self.orders):
                if self.stop.is_set():
                    return
                if self.rate > 0:
                    ahead_s = started + i / self.rate - time.monotonic()
                    if ahead_s > 0:
                        producer.poll(ahead_s)
                refused = producer.send(
                    self.topic, value=order.value, key=order.key, on_done=on_done
                )
                if refused is not None:
                    self.errors.append(refused)
            if producer.flush(30) > 0:
                self.errors.append("records still unsent after 30 s")
        except KafkaCallError as exc:
            self.errors.append(str(exc))
        finally:
            self.finished.set()


# --------------------------------------------------------------------------- processes


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: Any

    def tail(self, n: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(lines[-n:])

    def stop(self, timeout_s: float) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        return self.proc.returncode


def spawn(name: str, cmd: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> Child:
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed by Child.stop
    proc = subprocess.Popen(
        cmd,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=cwd,
        # Its own session: Ctrl-C reaches only the demo, which then stops the children in order
        # (the sidecar must drain before the app it delivers to goes away).
        start_new_session=True,
    )
    return Child(name, proc, log_path, log_file)


__all__ = ["Child", "Producing", "Snapshot", "http_get_json", "spawn"]
