"""Pull mode in tests: a sidecar config with ``app.mode: pull``, and a real HTTP client that pulls.

`pull_config` writes the harness's config (`tests.harness.write_config`) without an app URL and with
``app.mode: pull``; `PullClient` is a plain `http.client` connection to the control API, over TCP or
a Unix socket (``api.listen: unix:/path``), for `GET /v1/records` and `POST /v1/acks`. Its calls are
blocking: run them in a thread (`trio.to_thread.run_sync`) from trio tests. `raw_connect` and
`read_raw_responses` are a bare socket to the same API, for what `http.client` cannot do (pipelining,
walking away mid-request).
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
from pathlib import Path
from typing import Any

import yaml

from tests.harness import write_config


def pull_config(path: Path, *, app_extra: dict[str, Any] | None = None, **kwargs: Any) -> Path:
    """`write_config` for a pull-mode sidecar: no app URL, ``app.mode: pull``."""
    return to_pull_mode(write_config(path, app_url="unused", app_extra=app_extra, **kwargs))


def to_pull_mode(path: Path) -> Path:
    """Rewrite a sidecar config file for pull mode (drop the app's URL and socket); returns it."""
    cfg = yaml.safe_load(path.read_text())
    cfg["app"].pop("url", None)
    cfg["app"].pop("unix_socket", None)
    cfg["app"]["mode"] = "pull"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def api_listen_of(path: Path) -> str:
    return str(yaml.safe_load(path.read_text())["api"]["listen"])


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class PullClient:
    """One keep-alive connection to the control API (``api.listen``: ``host:port`` or ``unix:/path``)."""

    def __init__(self, api_listen: str, *, token: str = "", timeout_s: float = 90.0) -> None:
        if api_listen.startswith("unix:"):
            self.conn: http.client.HTTPConnection = _UnixConnection(api_listen[5:], timeout_s)
        else:
            host, _, port = api_listen.rpartition(":")
            self.conn = http.client.HTTPConnection(host, int(port), timeout=timeout_s)
        self.headers = {"dlq-sidecar-api-token": token} if token else {}

    def close(self) -> None:
        self.conn.close()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        self.conn.request(method, path, body=body, headers={**self.headers, **(headers or {})})
        resp = self.conn.getresponse()
        data = resp.read()
        ctype = resp.getheader("content-type") or ""
        return resp.status, json.loads(data) if "json" in ctype and data else data

    def pull(self, max_records: int = 100, wait_ms: int = 0) -> list[dict[str, Any]]:
        code, body = self.request("GET", f"/v1/records?max={max_records}&wait_ms={wait_ms}")
        assert code == 200, (code, body)
        return list(body["records"])

    def ack(self, acks: list[dict[str, Any]]) -> list[str]:
        code, body = self.request(
            "POST",
            "/v1/acks",
            json.dumps({"acks": acks}).encode(),
            {"Content-Type": "application/json"},
        )
        assert code == 200, (code, body)
        return [r["result"] for r in body["results"]]


def raw_connect(api_listen: str, timeout_s: float = 60.0) -> socket.socket:
    """A bare blocking socket to the control API (``host:port`` or ``unix:/path``)."""
    if api_listen.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout_s)
        sock.connect(api_listen[5:])
        return sock
    host, _, port = api_listen.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=timeout_s)


def read_raw_responses(sock: socket.socket, count: int) -> list[tuple[int, Any]]:
    """`count` Content-Length framed responses from `sock`, in order: (status, JSON body)."""
    buffer = b""
    out: list[tuple[int, Any]] = []
    while len(out) < count:
        head, sep, rest = buffer.partition(b"\r\n\r\n")
        if sep:
            lines = head.decode("latin-1").split("\r\n")
            fields = dict(line.lower().split(": ", 1) for line in lines[1:])
            length = int(fields["content-length"])
            if len(rest) >= length:
                out.append((int(lines[0].split()[1]), json.loads(rest[:length])))
                buffer = rest[length:]
                continue
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {len(out)} responses"
        buffer += chunk
    return out


def value_of(record: dict[str, Any]) -> bytes | None:
    v = record["value"]
    return None if v is None else base64.b64decode(v)


def key_of(record: dict[str, Any]) -> bytes | None:
    k = record["key"]
    return None if k is None else base64.b64decode(k)
