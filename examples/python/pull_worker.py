#!/usr/bin/env python3
"""The order service of app.py as a pulling worker (dlq-sidecar `app.mode: pull`), standard library only.

Nothing connects to this worker: it long-polls the sidecar's GET /v1/records and answers each record
through POST /v1/acks, by the order's "kind" (the same rule as app.py):

    ok      accept
    poison  reject with error class OrderValidationError (the sidecar writes it to the DLQ)
    flaky   release with retry_after_ms 100 while delivery_count <= fails (default 2), then
            accept; an order whose "fails" reaches the sidecar's delivery limit is archived
    slow    renew the lock now, accept 200 ms later

    python3 pull_worker.py [--max 100] [--wait-ms 5000] [--quiet]

SIDECAR_API is http://host:port (default http://127.0.0.1:8787) or unix:/path/to/api.sock;
SIDECAR_API_TOKEN is the sidecar's api.token, if it has one. SIGTERM or Ctrl-C: the worker answers
what it pulled, then exits.

Each decision is logged as one line: order=<id> kind=<kind> delivery=<n> answer=<ack>.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import urllib.parse
from typing import Any

SIDECAR_API = os.environ.get("SIDECAR_API", "http://127.0.0.1:8787").rstrip("/")
TOKEN = os.environ.get("SIDECAR_API_TOKEN", "")
SLOW_ACK_DELAY_S = 0.2
RETRY_AFTER_MS = 100

log_lock = threading.Lock()
quiet = False
stopping = threading.Event()


def log(line: str) -> None:
    if quiet:
        return
    with log_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class OrderValidationError(Exception):
    pass


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to the sidecar's API when it listens on a Unix socket (SIDECAR_API=unix:/path)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def connect(timeout_s: float) -> http.client.HTTPConnection:
    if SIDECAR_API.startswith("unix:"):
        return UnixHTTPConnection(SIDECAR_API.removeprefix("unix:"), timeout_s)
    url = urllib.parse.urlsplit(SIDECAR_API)
    return http.client.HTTPConnection(
        url.hostname or "127.0.0.1", url.port or 80, timeout=timeout_s
    )


def call(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> Any:
    """One request on a keep-alive connection; the JSON answer (raises on anything but 200)."""
    headers = {"dlq-sidecar-api-token": TOKEN} if TOKEN else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, data, headers)
    response = conn.getresponse()
    answer = response.read()
    if response.status != 200:
        raise RuntimeError(f"{method} {path}: {response.status} {answer[:200]!r}")
    return json.loads(answer)


def post_acks(conn: http.client.HTTPConnection, acks: list[dict[str, Any]]) -> list[str]:
    return [r["result"] for r in call(conn, "POST", "/v1/acks", {"acks": acks})["results"]]


def ack_later(delivery_id: str, order_id: object) -> None:
    """The slow order's answer, after its work; the lock was renewed when it was pulled."""
    time.sleep(SLOW_ACK_DELAY_S)
    conn = connect(5)
    try:
        result = post_acks(conn, [{"id": delivery_id, "ack": "accept"}])[0]
    except (OSError, http.client.HTTPException, RuntimeError, ValueError, KeyError) as exc:
        # The record is not lost: the sidecar delivers it again when its lock expires.
        log(f"order={order_id} acked=accept error={exc!r}")
        return
    finally:
        conn.close()
    log(f"order={order_id} acked=accept result={result}")


def decide(record: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """(order id, the /v1/acks item, the logged answer) for one pulled record."""
    delivery_id, delivery = record["id"], record["delivery_count"]
    value = base64.b64decode(record["value"]) if record["value"] is not None else b""
    try:
        order = json.loads(value)
        if not isinstance(order, dict):
            raise ValueError("an order is a JSON object")
    except ValueError as exc:
        error = {"class": "OrderParseError", "message": str(exc)}
        return "?", {"id": delivery_id, "ack": "reject", "error": error}, "reject"
    order_id, kind = order.get("id"), order.get("kind")
    if kind == "flaky" and delivery <= order.get("fails", 2):
        error = {
            "class": "InventoryUnavailable",
            "message": f"inventory service timed out (delivery {delivery})",
        }
        item = {
            "id": delivery_id,
            "ack": "release",
            "retry_after_ms": RETRY_AFTER_MS,
            "error": error,
        }
        return str(order_id), item, "release"
    if kind == "poison":
        try:
            raise OrderValidationError(f"order {order_id}: quantity must be positive")
        except OrderValidationError as exc:
            error = {
                "class": "OrderValidationError",
                "message": str(exc),
                "stacktrace": traceback.format_exc(),
            }
        return str(order_id), {"id": delivery_id, "ack": "reject", "error": error}, "reject"
    if kind == "slow":
        threading.Thread(target=ack_later, args=(delivery_id, order_id), daemon=True).start()
        return str(order_id), {"id": delivery_id, "ack": "renew"}, "deferred"
    return str(order_id), {"id": delivery_id, "ack": "accept"}, "accept"


def kind_of(record: dict[str, Any]) -> str:
    try:
        order = json.loads(base64.b64decode(record["value"] or ""))
        return str(order.get("kind")) if isinstance(order, dict) else "?"
    except ValueError:
        return "?"


def work(max_records: int, wait_ms: int) -> None:
    conn = connect(wait_ms / 1000 + 10)
    while not stopping.is_set():
        try:
            records = call(conn, "GET", f"/v1/records?max={max_records}&wait_ms={wait_ms}")[
                "records"
            ]
            acks = []
            for record in records:
                order_id, item, answer = decide(record)
                kind = kind_of(record)
                log(
                    f"order={order_id} kind={kind} delivery={record['delivery_count']} answer={answer}"
                )
                acks.append(item)
            if acks:
                results = post_acks(conn, acks)
                late = [item["id"] for i, item in enumerate(acks) if results[i] != "ok"]
                if late:
                    log(
                        f"answers not applied (lock expired first, or answered already): {len(late)}"
                    )
        except (OSError, http.client.HTTPException, RuntimeError, ValueError) as exc:
            # The sidecar is not up (yet), or restarting: whatever was pulled and not answered
            # comes back when its lock expires.
            log(f"sidecar API: {exc!r}; retrying")
            conn.close()
            stopping.wait(0.5)


def main() -> None:
    global quiet
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=100, help="records per pull (1..10000)")
    parser.add_argument("--wait-ms", type=int, default=5000, help="long-poll wait (0..60000)")
    parser.add_argument("--quiet", action="store_true", help="no decision log")
    args = parser.parse_args()
    quiet = args.quiet
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    log(f"pulling from {SIDECAR_API}")
    work(args.max, args.wait_ms)


if __name__ == "__main__":
    main()
