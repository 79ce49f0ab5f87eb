"""A small HTTP/1.1 server on trio, for the sidecar's local API and for test and example apps.

This module owns HTTP/1.1 framing on the server side: request parsing with httptools (llhttp),
keep-alive, content-length and chunked request bodies, ``Expect: 100-continue``, size limits
(413 for a body, 431 for a header block), 400 on garbage, and listening on TCP or on a Unix
socket (removing a stale socket file first). It knows nothing of Kafka, acks or the wire
contract: handlers get a :class:`Request` and return a :class:`Response`.

It must not import other ``sidecar`` modules; ``api`` and the example apps build on it.

Usage::

    port = await nursery.start(serve_http, handler, ("tcp", "127.0.0.1", 0))
    path = await nursery.start(serve_http, handler, ("unix", "/run/app.sock"))
"""

from __future__ import annotations

import contextlib
import errno
import http
import json
import logging
import os
import socket
import stat
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

import httptools
import trio

__all__ = [
    "Handler",
    "Listen",
    "Request",
    "Response",
    "json_response",
    "serve_http",
]

log = logging.getLogger(__name__)

Listen: TypeAlias = tuple[Literal["tcp"], str, int] | tuple[Literal["unix"], str]

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024
_RECEIVE_BYTES = 65536
_DRAIN_TIMEOUT_S = 1.0
_DRAIN_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed request. Header names are lower-case; values are decoded as latin-1."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        wanted = name.lower()
        for key, value in self.headers:
            if key == wanted:
                return value
        return None

    def header_values(self, name: str) -> list[str]:
        """Every value of header ``name`` in order (repeated headers are kept apart)."""
        wanted = name.lower()
        return [value for key, value in self.headers if key == wanted]


@dataclass(frozen=True, slots=True)
class Response:
    """What a handler returns. Content-Length and Connection are added by the server."""

    status: int = 200
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""


Handler: TypeAlias = Callable[[Request], Awaitable[Response]]


def json_response(obj: object, status: int = 200) -> Response:
    """A :class:`Response` with ``obj`` as a compact JSON body."""
    body = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    return Response(status, (("Content-Type", "application/json"),), body)


_REASONS = {status.value: status.phrase for status in http.HTTPStatus}


def _format_response(response: Response, keep_alive: bool, head_only: bool) -> bytes:
    status = response.status
    parts = [
        b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n"
        % (status, _REASONS.get(status, "Unknown").encode("ascii"), len(response.body))
    ]
    for name, value in response.headers:
        parts.append(f"{name}: {value}\r\n".encode("latin-1"))
    if not keep_alive:
        parts.append(b"Connection: close\r\n")
    parts.append(b"\r\n")
    if not head_only:
        parts.append(response.body)
    return b"".join(parts)


def _error_response(status: int, message: str) -> bytes:
    response = Response(status, (("Content-Type", "text/plain; charset=utf-8"),), message.encode())
    return _format_response(response, keep_alive=False, head_only=False)


class _RequestCollector:
    """httptools callbacks for one connection; completed requests queue up in ``ready``."""

    __slots__ = (
        "body",
        "body_bytes",
        "expect_continue",
        "headers",
        "headers_complete",
        "max_body_bytes",
        "parser",
        "ready",
        "started",
        "too_large",
        "url",
    )

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.parser: httptools.HttpRequestParser | None = None
        self.ready: deque[tuple[Request, bool]] = deque()
        self.too_large = False
        self.started = False
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.headers_complete = False
        self.expect_continue = False

    def on_message_begin(self) -> None:
        self._reset()
        self.started = True

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self.headers_complete = True
        for name, value in self.headers:
            if name == "content-length" and value.strip().isdigit():
                if int(value) > self.max_body_bytes:
                    self.too_large = True
            elif name == "expect" and value.strip().lower() == "100-continue":
                self.expect_continue = True

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        if self.body_bytes > self.max_body_bytes:
            self.too_large = True
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.parser is not None
        target = self.url.decode("latin-1")
        path, _, query = target.partition("?")
        request = Request(
            self.parser.get_method().decode("ascii"),
            path,
            query,
            tuple(self.headers),
            b"".join(self.body),
        )
        self.ready.append((request, self.parser.should_keep_alive()))
        self.url = b""
        self.headers_complete = False
        self.started = False


async def _refuse(stream: trio.abc.Stream, status: int, message: str) -> None:
    """Send an error and close gracefully, so the client gets to read the error.

    Closing a socket with unread input makes the kernel send a reset, which can destroy the
    response before the client reads it; so shut down our side, then drain (bounded) first.
    """
    await stream.send_all(_error_response(status, message))
    if isinstance(stream, trio.abc.HalfCloseableStream):
        await stream.send_eof()
    drained = 0
    with trio.move_on_after(_DRAIN_TIMEOUT_S):
        while drained < _DRAIN_MAX_BYTES:
            data = await stream.receive_some(_RECEIVE_BYTES)
            if not data:
                break
            drained += len(data)


async def _call_handler(handler: Handler, request: Request) -> Response:
    try:
        return await handler(request)
    except Exception:
        # The per-request boundary: one broken handler call must cost one 500, not the server.
        # trio.Cancelled is a BaseException and passes through.
        log.exception("HTTP handler failed for %s %s", request.method, request.path)
        return Response(500, (("Content-Type", "text/plain"),), b"internal error\n")


async def _serve_connection(
    stream: trio.abc.Stream, handler: Handler, max_request_bytes: int, idle_timeout_s: float
) -> None:
    collector = _RequestCollector(max_request_bytes)
    parser = httptools.HttpRequestParser(collector)
    collector.parser = parser
    head_bytes = 0  # bytes received while a request's header block is incomplete
    try:
        while True:
            data: bytes | bytearray = b""
            with trio.move_on_after(idle_timeout_s):
                data = await stream.receive_some(_RECEIVE_BYTES)
            if not data:
                return  # peer closed, or idle past the timeout
            upgrade = False
            try:
                parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                upgrade = True  # not supported: answer what was parsed, then close
            except httptools.HttpParserError as exc:
                await _refuse(stream, 400, f"bad request: {exc}\n")
                return
            if collector.too_large:
                await _refuse(stream, 413, "request body too large\n")
                return
            if collector.started and not collector.headers_complete:
                head_bytes += len(data)
            else:
                head_bytes = 0
            if head_bytes > MAX_HEADER_BYTES:
                await _refuse(stream, 431, "request header block too large\n")
                return
            if collector.expect_continue:
                collector.expect_continue = False
                if not collector.ready:
                    await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            while collector.ready:
                request, keep_alive = collector.ready.popleft()
                response = await _call_handler(handler, request)
                keep_alive = keep_alive and not upgrade
                await stream.send_all(
                    _format_response(response, keep_alive, head_only=request.method == "HEAD")
                )
                if not keep_alive:
                    return
            if upgrade:
                return
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return  # the client went away mid-exchange; nothing to tell it
    finally:
        await trio.aclose_forcefully(stream)


async def _open_unix_listener(path: str, backlog: int) -> trio.SocketListener:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise FileExistsError(errno.EEXIST, "exists and is not a socket", path)
        probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await probe.connect(path)
        except OSError:
            os.unlink(path)  # nobody answers: a leftover from a process that died
        else:
            raise OSError(errno.EADDRINUSE, "a live server already listens on", path)
        finally:
            probe.close()
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(path)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


async def serve_http(
    handler: Handler,
    listen: Listen,
    *,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    idle_timeout_s: float = 60.0,
    backlog: int = 1024,
    task_status: trio.TaskStatus[int | str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``handler`` on ``listen`` until cancelled.

    Reports the bound port (TCP; useful with port 0) or the socket path (Unix) through
    ``task_status`` once it accepts connections. On cancel, connections are closed and a Unix
    socket file this call created is removed.
    """
    listeners: list[trio.SocketListener]
    unix_path: str | None = None
    bound: int | str
    if listen[0] == "tcp":
        _, host, port = listen
        listeners = await trio.open_tcp_listeners(port, host=host, backlog=backlog)
        bound = int(listeners[0].socket.getsockname()[1])
    elif listen[0] == "unix":
        unix_path = listen[1]
        listeners = [await _open_unix_listener(unix_path, backlog)]
        bound = unix_path
    else:
        raise ValueError(f"listen must be ('tcp', host, port) or ('unix', path), got {listen!r}")
    inode = os.stat(unix_path).st_ino if unix_path is not None else None

    async def serve_one(stream: trio.SocketStream) -> None:
        await _serve_connection(stream, handler, max_request_bytes, idle_timeout_s)

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, serve_one, listeners)
            task_status.started(bound)
    finally:
        for listener in listeners:
            listener.socket.close()
        if unix_path is not None:
            # Remove only our own socket file: a successor may already have bound the path.
            with contextlib.suppress(OSError):
                if os.stat(unix_path).st_ino == inode:
                    os.unlink(unix_path)
