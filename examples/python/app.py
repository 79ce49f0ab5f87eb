#!/usr/bin/env python3
"""An order service behind dlq-sidecar, standard library only.

The sidecar POSTs each Kafka record to /records: the body is the record value, metadata comes in
Kafka-* headers. This app decides by the order's "kind":

    ok      accept
    poison  reject with error class OrderValidationError (the sidecar writes it to the DLQ)
    flaky   release with retry_after_ms 100 while Kafka-Delivery-Count <= fails (default 2),
            then accept; an order whose "fails" reaches the sidecar's delivery limit is archived
    slow    answer 202 now, accept later through the sidecar's POST /v1/acks (SIDECAR_API)

    python3 app.py [--host 127.0.0.1] [--port 8080] [--unix PATH] [--quiet]

SIDECAR_API is http://host:port (default http://127.0.0.1:8787) or unix:/path/to/api.sock.

Each decision is logged as one line: order=<id> kind=<kind> delivery=<n> answer=<ack>.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import socketserver
import sys
import threading
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

SIDECAR_API = os.environ.get("SIDECAR_API", "http://127.0.0.1:8787").rstrip("/")
SLOW_ACK_DELAY_S = 0.2
RETRY_AFTER_MS = 100

log_lock = threading.Lock()
quiet = False


def log(line: str) -> None:
    if quiet:
        return
    with log_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class OrderValidationError(Exception):
    pass


def validate(order: dict[str, Any]) -> None:
    # A real service would check the order here; a "poison" order always fails.
    if order.get("kind") == "poison":
        raise OrderValidationError(f"order {order.get('id')}: quantity must be positive")


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP to the sidecar's API when it listens on a Unix socket (SIDECAR_API=unix:/path)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def post_acks(body: bytes) -> str:
    """POST /v1/acks to the sidecar; the one result word (ok, already, expired or unknown)."""
    conn: http.client.HTTPConnection
    if SIDECAR_API.startswith("unix:"):
        conn = UnixHTTPConnection(SIDECAR_API.removeprefix("unix:"), timeout=5)
    else:
        url = urllib.parse.urlsplit(SIDECAR_API)
        conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=5)
    try:
        conn.request("POST", "/v1/acks", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        return str(json.loads(response.read())["results"][0]["result"])
    finally:
        conn.close()


def ack_later(delivery_id: str, order_id: object) -> None:
    """Answer a deferred delivery through the sidecar's local API."""
    body = json.dumps({"acks": [{"id": delivery_id, "ack": "accept"}]}).encode()
    try:
        result = post_acks(body)
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as exc:
        # The record is not lost: the sidecar redelivers it when its lock expires.
        log(f"order={order_id} acked=accept error={exc!r}")
        return
    log(f"order={order_id} acked=accept result={result}")


def decide(order: dict[str, Any], delivery: int, delivery_id: str) -> tuple[int, dict[str, Any]]:
    """(status, JSON answer) for one order; an empty answer means "no body"."""
    kind = order.get("kind")
    if kind == "flaky":
        fails = order.get("fails", 2)
        if delivery <= fails:
            return 200, {
                "ack": "release",
                "retry_after_ms": RETRY_AFTER_MS,
                "error": {
                    "class": "InventoryUnavailable",
                    "message": f"inventory service timed out (delivery {delivery})",
                },
            }
        return 200, {"ack": "accept"}
    if kind == "slow":
        timer = threading.Timer(SLOW_ACK_DELAY_S, ack_later, (delivery_id, order.get("id")))
        timer.daemon = True
        timer.start()
        return 202, {}
    try:
        validate(order)
    except OrderValidationError as exc:
        return 200, {
            "ack": "reject",
            "error": {
                "class": type(exc).__name__,
                "message": str(exc),
                "stacktrace": traceback.format_exc(),
            },
        }
    return 200, {"ack": "accept"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the sidecar reuses its connections

    def do_GET(self) -> None:
        self.reply(200, {"status": "ok"} if self.path == "/healthz" else {"error": "not found"})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        delivery = int(self.headers.get("Kafka-Delivery-Count") or 1)
        delivery_id = self.headers.get("Kafka-Delivery-Id") or ""
        try:
            order = json.loads(body)
            if not isinstance(order, dict):
                raise ValueError("an order is a JSON object")
        except ValueError as exc:
            log(f"order=? kind=? delivery={delivery} answer=reject")
            self.reply(
                200,
                {"ack": "reject", "error": {"class": "OrderParseError", "message": str(exc)}},
            )
            return
        status, answer = decide(order, delivery, delivery_id)
        word = answer.get("ack", "deferred")
        log(f"order={order.get('id')} kind={order.get('kind')} delivery={delivery} answer={word}")
        self.reply(status, answer)

    def reply(self, status: int, answer: dict[str, Any]) -> None:
        data = json.dumps(answer).encode() if answer else b""
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per decision is logged above; the access log would double it

    def address_string(self) -> str:
        # A Unix socket peer has no (host, port) address.
        return str(self.client_address[0]) if self.client_address else "unix"


# socketserver listens with a backlog of 5; the sidecar opens up to app.max.in.flight (64)
# connections at once, and a Unix socket refuses connects beyond the backlog instead of queueing.
BACKLOG = 256


class TCPHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = BACKLOG


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, path: str) -> None:
        if os.path.exists(path):
            os.unlink(path)  # a socket left behind by an earlier run
        super().__init__(path, Handler)


def main() -> int:
    global quiet
    parser = argparse.ArgumentParser(description="Example order service for dlq-sidecar.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    parser.add_argument("--unix", metavar="PATH", help="listen on this Unix socket instead")
    parser.add_argument("--quiet", action="store_true", help="do not log each decision")
    args = parser.parse_args()
    quiet = args.quiet
    server: socketserver.BaseServer
    if args.unix:
        server = UnixHTTPServer(args.unix)
        where = f"unix:{args.unix}"
    else:
        server = TCPHTTPServer((args.host, args.port), Handler)
        where = f"http://{args.host}:{server.server_address[1]}"
    # Stop cleanly on SIGTERM too (the demo and Kubernetes send it), removing the socket file.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    print(f"order service listening on {where} (sidecar API {SIDECAR_API})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if args.unix and os.path.exists(args.unix):
            os.unlink(args.unix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
