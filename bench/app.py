"""The bench app child (``bench.benchapp``) as the runs drive it, and its JSON-over-HTTP helpers.

``App`` starts the app (one asyncio process listening on TCP and a Unix socket) and talks to its
control routes; ``measure_app_alone`` measures it under the sidecar's own HTTP client.
``UnixHTTPConnection`` and ``http_json`` also serve the sidecar's API (``bench.sidecars``).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
from typing import Any
from urllib.parse import quote

from bench.measure import PY, ROOT, cpu_seconds


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 5.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError:
            sock.close()  # not there yet: the caller asks again
            raise
        self.sock = sock


def http_json(conn: http.client.HTTPConnection, method: str, path: str) -> Any:
    conn.request(method, path)
    response = conn.getresponse()
    body = response.read()
    if response.status >= 300 and response.status != 503:
        raise RuntimeError(f"{method} {path}: {response.status} {body[:200]!r}")
    return json.loads(body) if body else None


class App:
    """The bench app child: one process, TCP + Unix socket."""

    def __init__(self, directory: str) -> None:
        self.unix_path = os.path.join(directory, "app.sock")
        self.proc = subprocess.Popen(
            [PY, "-m", "bench.benchapp", "--unix", self.unix_path],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(json.loads(self.proc.stdout.readline())["port"])
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def reset(self, **mode: int | str) -> None:
        query = "&".join(f"{k}={quote(str(v))}" for k, v in mode.items())
        http_json(self.conn, "POST", f"/reset?{query}")

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = http_json(self.conn, "GET", "/stats")
        return result

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def set_kill_pid(self, pid: int) -> None:
        http_json(self.conn, "POST", f"/killer?pid={pid}")

    def close(self) -> None:
        self.conn.close()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None
        self.proc.stdout.close()


def measure_app_alone(app: App, seconds: float) -> dict[str, Any]:
    """The app under the sidecar's own HTTP client (trio, 64 in flight), and the app's CPU."""
    import trio

    from bench.http_bench import load
    from sidecar.http.appclient import AppTarget

    out: dict[str, Any] = {}
    for transport in ("tcp", "unix"):
        if transport == "tcp":
            target = AppTarget(host="127.0.0.1", port=app.port, path="/records")
        else:
            target = AppTarget(unix_path=app.unix_path, path="/records")
        app.reset()
        cpu0 = app.cpu()
        result = trio.run(load, target, 64, seconds)
        app_cpu = app.cpu() - cpu0
        requests = app.stats()["requests"]
        out[transport] = {
            "requests_per_s": round(result.requests_per_s),
            "client_cpu_us_per_request": round(result.cpu_us_per_request, 1),
            "app_cpu_us_per_request": round(app_cpu / max(1, requests) * 1e6, 1),
        }
    return out
