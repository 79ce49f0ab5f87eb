"""The HTTP client that pushes records to the application (SPEC §5), on trio.

This module owns the connections to the app: a keep-alive pool (one connection per in-flight
request, over TCP loopback or a Unix socket), HTTP/1.1 response framing with httptools
(content-length, chunked, and EOF-delimited bodies; interim 1xx responses skipped), timeouts,
and the split between "could not connect" and "sent, then failed" that decides whether a
delivery counted as an attempt. Request bytes and answer meaning come from :mod:`sidecar.core.wire`.

It imports only `sidecar.core` (wire, outcome, errors) and :mod:`sidecar.http.limits` of this package; it knows
nothing of Kafka, the ledger or the DLQ. Limits on an answer: its header block plus chunked
trailers at most ``MAX_HEAD_BYTES`` (counted on the wire, so endless trailers or an endless
header value never grow memory), its body at most ``max_body_bytes``, chunk framing bounded, and
the whole exchange (send included) within the request's timeout.

Errors::

    AppClientError
     ├── AppNotReachable     the connection could not be opened (refused, no socket file,
     │                       connect timeout): the request never left, NOT an attempt
     └── AppRequestFailed    the request was sent and then failed: an attempt. ``class_name``:
                             sidecar.AppTimeout         no complete answer within the timeout
                             sidecar.AppConnectionLost  reset or EOF before a complete answer
                             sidecar.MalformedResponse  not HTTP/1.x, or over the size caps
                                                        (head + trailers, body, chunk framing)

Stale keep-alive connections: a server may close an idle connection at any moment, and we
only learn of it when the next request on it gets EOF or a reset before any response byte.
Such a failure on a *reused* connection is retried once on a fresh connection. The request was
sent, so the app could in principle have acted on it and then died without answering; we
accept that rare duplicate (delivery is at-least-once anyway) rather than charge an attempt,
and possibly a DLQ entry, for what is almost always our own stale socket. A failure on a fresh
connection, any failure after a response byte, and a timeout are never retried here. Idle
connections older than ``idle_timeout_s`` (below common server keep-alive timeouts of 5 s)
are closed rather than reused, to keep that race rare.

Timeouts: a request's deadline is kept in a set the client's watchdog (one trio system task per
client) reads; at the deadline the watchdog tells trio the socket is closing, which wakes the
exchange waiting on it with ``ClosedResourceError``, and the request fails with
``sidecar.AppTimeout``. The exchange only ever waits on its socket, so that is where a deadline can
strike, as a cancel scope's would: but a cancel scope per request (and the deadline bookkeeping
trio does for it) cost more CPU than the rest of the client's per-request work.
"""

from __future__ import annotations

import contextlib
import errno
import math
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httptools
import trio

from sidecar.core.errors import SidecarError
from sidecar.core.outcome import APP_CONNECTION_LOST, APP_TIMEOUT, MALFORMED_RESPONSE
from sidecar.core.wire import (
    Answer,
    AppError,
    CloudEventsFormat,
    RecordView,
    format_batch_request,
    format_single_request,
    interpret_batch,
    interpret_single,
)
from sidecar.http.limits import LimitExceeded, MeteredCollector

__all__ = [
    "APP_CONNECTION_LOST",
    "APP_TIMEOUT",
    "MALFORMED_RESPONSE",
    "AppClient",
    "AppClientError",
    "AppNotReachable",
    "AppRequestFailed",
    "AppTarget",
    "RawResponse",
]


DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_HEAD_BYTES = 64 * 1024
_RECEIVE_BYTES = 65536


class AppClientError(SidecarError):
    """Root of the app transport errors."""


class AppNotReachable(AppClientError):
    """The connection to the app could not be opened; the request was not sent."""


class AppRequestFailed(AppClientError):
    """The request was sent and no usable answer came back."""

    def __init__(self, class_name: str, message: str) -> None:
        super().__init__(f"{class_name}: {message}")
        self.class_name = class_name
        self.message = message


class _StaleConnection(Exception):
    """A reused connection failed before any response byte: retry once on a fresh one."""


@dataclass(frozen=True, slots=True)
class AppTarget:
    """Where the app listens and what every request carries.

    ``unix_path`` set means a Unix socket (``host``/``port`` then unused). ``authority`` is the
    Host header; by default ``host:port`` for TCP and ``localhost`` for a Unix socket.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    unix_path: str | None = None
    path: str = "/"
    extra_headers: tuple[tuple[str, str], ...] = ()
    authority: str | None = None
    cloudevents: CloudEventsFormat | None = None  # set: requests are CloudEvents (app.format)

    @property
    def host_header(self) -> str:
        if self.authority is not None:
            return self.authority
        if self.unix_path is not None:
            return "localhost"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def describe(self) -> str:
        if self.unix_path is not None:
            return f"unix:{self.unix_path}"
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class RawResponse:
    """A complete HTTP response; header names lower-cased, in arrival order."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class _ResponseCollector(MeteredCollector):
    """httptools callbacks for one response."""

    __slots__ = (
        "complete",
        "extra_message",
        "framed",
        "headers",
        "headers_done",
        "keep_alive",
        "parser",
        "status",
    )

    def __init__(self, max_body_bytes: int) -> None:
        super().__init__(MAX_HEAD_BYTES, max_body_bytes)
        self.parser: httptools.HttpResponseParser | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.framed = False  # Content-Length or Transfer-Encoding: the body does not end at EOF
        self.complete = False
        self.extra_message = False
        self.keep_alive = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.complete:
            self.extra_message = True  # bytes after the response: the connection is unusable

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        if self.headers_done:
            return  # a chunked trailer: counted against the head budget, otherwise ignored
        lowered = name.lower()
        if lowered in (b"content-length", b"transfer-encoding"):
            self.framed = True
        self.headers.append((lowered, value))

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        assert self.parser is not None
        self.status = self.parser.get_status_code()
        self.headers_done = True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if 100 <= self.status < 200 and self.status != 101:
            # An interim response (100 Continue, 103 Early Hints): the real one follows.
            self.headers = []
            self.body = bytearray()
            self.headers_done = False
            self.framed = False
            return
        assert self.parser is not None
        # llhttp resets its keep-alive flag once feed_data returns: read it here.
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True


def _detach(stream: trio.SocketStream) -> socket.socket:
    """The plain non-blocking socket under a freshly opened trio stream.

    Requests go through the socket directly (``send``/``recv`` and trio's ``wait_readable`` /
    ``wait_writable``): ``SocketStream`` wraps every call in conflict detection, an error-translating
    context manager and an ``outcome`` round trip, which cost more CPU per request than the HTTP
    work itself at thousands of requests per second.
    """
    fd = stream.socket.detach()
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return sock


def _timed_out(timeout_s: float) -> AppRequestFailed:
    return AppRequestFailed(APP_TIMEOUT, f"no complete answer within {timeout_s} s")


def _close(sock: socket.socket) -> None:
    # No task waits on the socket when it is closed here (the exchange that used it has ended),
    # but tell trio anyway so a stale registration can never outlive the descriptor.
    if sock.fileno() == -1:
        return  # already closed (a stale connection replaced by one that failed to open)
    trio.lowlevel.notify_closing(sock)
    sock.close()


async def _exchange(
    sock: socket.socket, request: bytes, reused: bool, max_body_bytes: int
) -> tuple[RawResponse, bool]:
    """Send ``request`` and read one response: (response, connection reusable)."""
    collector = _ResponseCollector(max_body_bytes)
    parser = httptools.HttpResponseParser(collector)
    collector.parser = parser
    received = 0
    try:
        view = memoryview(request)
        while view:
            try:
                sent = sock.send(view)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)
                continue
            view = view[sent:]
        # The app cannot have answered yet when the send returns: wait before the first read
        # instead of a recv that fails with EAGAIN (a syscall and an exception per request).
        await trio.lowlevel.wait_readable(sock)
        while not collector.complete:
            try:
                data = sock.recv(_RECEIVE_BYTES)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(sock)
                continue
            if not data:
                if collector.headers_done and not collector.framed:
                    break  # a body delimited by EOF (no Content-Length, not chunked)
                if received == 0:
                    if reused:
                        raise _StaleConnection
                    raise AppRequestFailed(
                        APP_CONNECTION_LOST, "the app closed the connection without answering"
                    )
                raise AppRequestFailed(
                    APP_CONNECTION_LOST,
                    f"the app closed the connection after {received} bytes of its answer",
                )
            received += len(data)
            try:
                collector.feed(parser, data)
            except LimitExceeded as exc:
                what = "header block and trailers" if exc.what == "head" else "chunk framing"
                raise AppRequestFailed(
                    MALFORMED_RESPONSE, f"response {what} over {exc.limit} bytes"
                ) from exc
            except httptools.HttpParserUpgrade as exc:
                raise AppRequestFailed(MALFORMED_RESPONSE, "unexpected protocol upgrade") from exc
            except httptools.HttpParserError as exc:
                raise AppRequestFailed(MALFORMED_RESPONSE, f"unparseable HTTP: {exc}") from exc
            if collector.too_large:
                raise AppRequestFailed(
                    MALFORMED_RESPONSE, f"response body over {max_body_bytes} bytes"
                )
    except (BrokenPipeError, ConnectionError) as exc:
        # EPIPE / ECONNRESET / ECONNABORTED: the peer went away.
        if received == 0 and reused:
            raise _StaleConnection from exc
        raise AppRequestFailed(APP_CONNECTION_LOST, f"connection lost: {exc}") from exc
    except OSError as exc:
        if exc.errno in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN):
            if received == 0 and reused:
                raise _StaleConnection from exc
            raise AppRequestFailed(APP_CONNECTION_LOST, f"connection lost: {exc}") from exc
        raise
    keep_alive = collector.complete and collector.keep_alive and not collector.extra_message
    response = RawResponse(collector.status, collector.headers, bytes(collector.body))
    return response, keep_alive


class _Watched:
    """One request's deadline (trio time) for the client's watchdog; ``sock`` None while it has no
    connection (reconnecting)."""

    __slots__ = ("deadline", "sock", "timed_out")

    def __init__(self, deadline: float, sock: socket.socket | None) -> None:
        self.deadline = deadline
        self.sock = sock
        self.timed_out = False


class AppClient:
    """A keep-alive connection pool to one app, bounded at ``max_connections`` in flight.

    ``send`` waits for a free slot when ``max_connections`` requests are in flight; callers
    that bound their own concurrency (the dispatcher does) never wait here.
    """

    def __init__(
        self,
        target: AppTarget,
        max_connections: int = 64,
        connect_timeout_s: float = 2.0,
        *,
        status_mapping: Mapping[int, str] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        idle_timeout_s: float = 4.0,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.target = target
        self._host_header = target.host_header
        self._connect_timeout_s = connect_timeout_s
        self._status_mapping = dict(status_mapping or {})
        self._max_body_bytes = max_body_bytes
        self._idle_timeout_s = idle_timeout_s
        self._slots = trio.Semaphore(max_connections)
        self._idle: list[tuple[socket.socket, float]] = []
        self._closed = False
        self.connections_opened = 0
        # The requests in flight with their deadlines, and their watchdog (see the module
        # docstring): the trio run it serves, when it wakes next, and how to wake it sooner.
        self._watched: set[_Watched] = set()
        self._watchdog_token: trio.lowlevel.TrioToken | None = None
        self._watchdog_until = math.inf
        self._watchdog_wake = trio.Event()

    async def __aenter__(self) -> AppClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close idle connections; in-flight ones close when their request ends."""
        self._closed = True
        self._watchdog_wake.set()  # it ends
        idle, self._idle = self._idle, []
        for sock, _ in idle:
            _close(sock)
        await trio.lowlevel.checkpoint()

    def _watch(self, entry: _Watched) -> None:
        self._watched.add(entry)
        token = trio.lowlevel.current_trio_token()
        if self._watchdog_token is not token:
            self._watchdog_token = token
            self._watchdog_until = math.inf
            self._watchdog_wake = trio.Event()
            trio.lowlevel.spawn_system_task(self._watchdog, token, name="sidecar app timeouts")
        elif entry.deadline < self._watchdog_until:
            self._watchdog_wake.set()

    async def _watchdog(self, token: trio.lowlevel.TrioToken) -> None:
        """Fail the requests whose deadline has passed; sleep until the next deadline."""
        while self._watchdog_token is token and not self._closed:
            now = trio.current_time()
            soonest = math.inf
            for entry in self._watched:
                if entry.timed_out:
                    continue
                if entry.deadline <= now:
                    entry.timed_out = True
                    if entry.sock is not None:
                        # Wakes the exchange waiting on it with ClosedResourceError; shut down, so
                        # an exchange that was about to wait again ends at once too.
                        trio.lowlevel.notify_closing(entry.sock)
                        with contextlib.suppress(OSError):
                            entry.sock.shutdown(socket.SHUT_RDWR)
                elif entry.deadline < soonest:
                    soonest = entry.deadline
            self._watchdog_until = soonest
            self._watchdog_wake = trio.Event()
            with trio.move_on_at(soonest):
                await self._watchdog_wake.wait()

    async def _open(self) -> socket.socket:
        stream: trio.SocketStream
        try:
            with trio.fail_after(self._connect_timeout_s):
                if self.target.unix_path is not None:
                    stream = await self._open_unix(self.target.unix_path)
                else:
                    stream = await trio.open_tcp_stream(self.target.host, self.target.port)
        except trio.TooSlowError as exc:
            raise AppNotReachable(
                f"connecting to {self.target.describe()} timed out after "
                f"{self._connect_timeout_s} s"
            ) from exc
        except OSError as exc:
            raise AppNotReachable(
                f"cannot connect to {self.target.describe()}: {exc.strerror or exc}"
            ) from exc
        self.connections_opened += 1
        return _detach(stream)

    async def _open_unix(self, path: str) -> trio.SocketStream:
        """Connect to a Unix socket, waiting out a full listen backlog.

        When the app's backlog is full, a non-blocking connect() on a Unix socket fails with EAGAIN
        and trio hands back a socket that is not connected; the first send would then fail and be
        counted as an attempt although nothing left. Check the peer and retry briefly instead.
        """
        delay_s = 0.001
        while True:
            stream = await trio.open_unix_socket(path)
            try:
                stream.socket.getpeername()
            except OSError as exc:
                await trio.aclose_forcefully(stream)
                if exc.errno != errno.ENOTCONN:
                    raise
                await trio.sleep(delay_s)  # the outer fail_after bounds the whole wait
                delay_s = min(delay_s * 2, 0.05)
                continue
            return stream

    def _take_idle(self) -> socket.socket | None:
        oldest_usable = trio.current_time() - self._idle_timeout_s
        while self._idle:
            sock, idle_since = self._idle.pop()  # LIFO: the freshest is least likely stale
            if idle_since >= oldest_usable:
                return sock
            _close(sock)
        return None

    async def send(self, request: bytes, timeout_s: float) -> RawResponse:
        """Send one complete request (from :mod:`sidecar.core.wire`) and return the response.

        ``timeout_s`` bounds the exchange after the connection is open; opening has its own
        ``connect_timeout_s``. Raises :class:`AppNotReachable` or :class:`AppRequestFailed`.
        """
        if self._closed:
            raise RuntimeError("AppClient is closed")
        # A free slot is taken without a checkpoint (the exchange has its own): `async with` on
        # the semaphore yields to the scheduler on every request, a trio loop turn for nothing
        # when the caller bounds its own concurrency, as the pipeline does.
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            await self._slots.acquire()
        try:
            sock = self._take_idle()
            reused = sock is not None
            if sock is None:
                sock = await self._open()
            keep_alive = False
            entry = _Watched(trio.current_time() + timeout_s, sock)
            self._watch(entry)
            try:
                try:
                    response, keep_alive = await _exchange(
                        sock, request, reused, self._max_body_bytes
                    )
                except _StaleConnection:
                    if entry.timed_out:
                        raise _timed_out(timeout_s) from None
                    entry.sock = None
                    _close(sock)
                    with trio.move_on_at(entry.deadline):
                        sock = await self._open()
                        entry.sock = sock
                    if entry.sock is None or entry.timed_out:
                        raise _timed_out(timeout_s) from None
                    response, keep_alive = await _exchange(
                        sock, request, False, self._max_body_bytes
                    )
            # A deadline that passed ends the exchange with whatever error that caused (the socket
            # closing under it, or shut down): it is a timeout.
            except (trio.ClosedResourceError, AppRequestFailed):
                if entry.timed_out:
                    raise _timed_out(timeout_s) from None
                raise
            finally:
                self._watched.discard(entry)
                if keep_alive and not entry.timed_out and not self._closed:
                    self._idle.append((sock, trio.current_time()))
                else:
                    _close(sock)
            return response
        finally:
            self._slots.release()

    async def deliver(self, record: RecordView, timeout_s: float) -> Answer:
        """Push one record in single mode and interpret the answer.

        A request that was sent and failed becomes a release carrying the sidecar's error
        class (it was an attempt); :class:`AppNotReachable` propagates (it was not).
        """
        request = format_single_request(
            record,
            self._host_header,
            self.target.path,
            self.target.extra_headers,
            self.target.cloudevents,
        )
        try:
            response = await self.send(request, timeout_s)
        except AppRequestFailed as exc:
            return Answer("release", AppError(exc.class_name, exc.message), reason=exc.message)
        return interpret_single(
            response.status, response.headers, response.body, self._status_mapping
        )

    async def deliver_batch(
        self, records: Sequence[RecordView], timeout_s: float
    ) -> dict[str, Answer]:
        """Push records in batch mode; one :class:`Answer` per delivery id (see deliver)."""
        request = format_batch_request(
            records,
            self._host_header,
            self.target.path,
            self.target.extra_headers,
            self.target.cloudevents,
        )
        ids = [record.delivery_id for record in records]
        try:
            response = await self.send(request, timeout_s)
        except AppRequestFailed as exc:
            failed = Answer("release", AppError(exc.class_name, exc.message), reason=exc.message)
            return dict.fromkeys(ids, failed)
        return interpret_batch(
            response.status, response.headers, response.body, ids, self._status_mapping
        )
