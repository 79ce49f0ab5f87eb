"""The connections to the app and the requests in flight on them, many per task.

Owns `Exchanges`: a keep-alive pool of non-blocking sockets, every request on them (started in the
caller, answered by one reader task over one epoll set: told in its docstring), deadlines and response
framing (httptools under `sidecar.http.limits`, or `sidecar.core.http_response` for the common form).

Knows nothing of what answers mean (`sidecar.http.appclient` does); imports only ``sidecar.core`` and
`sidecar.http.limits`.
"""

from __future__ import annotations

import contextlib
import errno
import math
import select
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httptools
import trio

from sidecar.core.errors import SidecarError
from sidecar.core.http_response import simple_response
from sidecar.core.outcome import APP_CONNECTION_LOST, APP_TIMEOUT, MALFORMED_RESPONSE
from sidecar.http.limits import SLICE_BYTES, LimitExceeded, MeteredCollector

__all__ = [
    "MAX_HEAD_BYTES",
    "AppClientError",
    "AppNotReachable",
    "AppRequestFailed",
    "AppRouteMissing",
    "Exchange",
    "Exchanges",
    "RawResponse",
    "Result",
]

MAX_HEAD_BYTES = 64 * 1024
_RECEIVE_BYTES = 65536
# The fast path takes a header block a slice short of the budget: the general parser's count may
# be up to a slice over (see sidecar.http.limits), so near the budget it decides.
_QUICK_HEAD_BYTES = MAX_HEAD_BYTES - SLICE_BYTES
_CONNECTION_LOST_ERRNOS = (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN)
_IN = select.EPOLLIN | select.EPOLLET | select.EPOLLRDHUP
_IN_OUT = _IN | select.EPOLLOUT


class AppClientError(SidecarError):
    """Root of the app transport errors."""


class AppNotReachable(AppClientError):
    """The connection to the app could not be opened; the request was not sent."""


class AppRouteMissing(AppNotReachable):
    """The app answered that it has no such route (404, 405 or 415 with no JSON answer, or a
    status mapped to ``route-missing``): the configured URL is wrong, and the record was not
    taken, so this is no attempt either."""

    def __init__(self, url: str, status: int) -> None:
        super().__init__(f"{url} answers HTTP {status}: the app has no such route")
        self.url = url
        self.status = status


class AppRequestFailed(AppClientError):
    """The request was sent and no usable answer came back."""

    def __init__(self, class_name: str, message: str) -> None:
        super().__init__(f"{class_name}: {message}")
        self.class_name = class_name
        self.message = message


@dataclass(frozen=True, slots=True)
class RawResponse:
    """A complete HTTP response; header names lower-cased, in arrival order."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


# What a request ends with: its response, or why there is none (AppNotReachable: never sent).
Result = RawResponse | AppClientError


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


class Exchange:
    """One request: its bytes, its connection, its response so far, its deadline, whom to tell."""

    __slots__ = (
        "collector",
        "deadline",
        "done",
        "finished",
        "parser",
        "received",
        "request",
        "reused",
        "sock",
        "timeout_s",
        "unsent",
        "waits_writable",
    )

    def __init__(self, request: bytes, timeout_s: float, done: Callable[[Result], None]) -> None:
        self.request = request
        self.timeout_s = timeout_s
        self.done = done
        self.sock: socket.socket | None = None
        self.reused = False
        self.unsent: memoryview | None = None  # the part of the request not sent yet
        self.waits_writable = False  # the socket's buffer was full: waiting for room
        self.received = 0
        self.deadline = 0.0  # trio time; set once it has a connection
        self.finished = False
        self.collector: _ResponseCollector | None = None
        self.parser: httptools.HttpResponseParser | None = None


class _Stale(Exception):
    """A reused connection failed before any response byte: retry once on a fresh one."""


def _spent(_result: Result) -> None:
    """An exchange's callback once it is over. Letting go of the caller's callback breaks the cycle
    the caller's request object and its exchange make (the request holds the exchange, the callback
    the request): without it, every request's objects, the record's bytes included, waited for the
    cyclic garbage collector, and a full collection stalled the record path for tens of ms."""


def _drop_parser(exchange: Exchange) -> None:
    """Let go of an exchange's response parser. The parser holds its collector's methods and the
    collector the parser (for the status and keep-alive): a cycle, left to the cyclic collector
    unless it is broken here, as an exchange that is over lets go of its callback (`_spent`)."""
    collector = exchange.collector
    if collector is not None:
        collector.parser = None
    exchange.collector = exchange.parser = None


def timed_out(timeout_s: float) -> AppRequestFailed:
    return AppRequestFailed(APP_TIMEOUT, f"no complete answer within {timeout_s} s")


def _raise(exc: BaseException) -> None:
    raise exc


class Exchanges:
    """The pool and the requests in flight; one per app client.

    ``connect`` opens a new connection (raising :class:`AppNotReachable`); ``after_round`` is
    called after each reader wake-up that completed a request; ``on_error`` gets an exception a
    ``done`` callback raised (by default it is raised in the reader, which ends the trio run).
    Both are given by whoever builds the pool (the app client's caller).

    Timeouts: the pool's reader task keeps every request's deadline and wakes for the soonest; a
    request past it fails with ``sidecar.AppTimeout`` and its connection is closed. No cancel scope per
    request: one (and the deadline bookkeeping trio does for it) cost more CPU than the rest of the
    client's per-request work.

    :class:`Exchanges` owns a keep-alive pool of plain non-blocking sockets and every request on
    them. A request starts synchronously in the caller (``start``: a free connection taken, the bytes
    sent with one ``send``); its answer is read by one reader task per trio run, which waits on one
    epoll set of all the pool's sockets (the set's own descriptor is what trio waits on) and, when it
    wakes, reads every connection that has something, completes each request whose response is whole
    (its ``done`` callback, in that task, synchronously) and then calls ``after_round`` once. So a
    request costs no task of its own and no task wake-up to send it; at any rate above a few hundred
    requests per second many answers share a wake-up. A request that needs a new connection waits
    for it in a short task of its own (connects are rare with keep-alive); so does the retry of a
    request whose reused connection turned out stale.

    Sockets are in the set edge-triggered, from their connect to their close: an answer arriving is
    an edge, and so is an idle connection the app closed (its EOF), which is then dropped from the
    pool at once rather than found stale by the next request. A request's deadline covers its send
    and its answer (from the moment it has a connection) and is kept by the reader, which wakes for
    the soonest one; a connection whose request timed out is closed.

    Response framing is httptools' (content-length, chunked, EOF-delimited bodies, interim 1xx
    responses skipped) under the byte budgets of :mod:`sidecar.http.limits`; a response that is
    whole in its first read and of the narrow common form is taken by
    :func:`sidecar.core.http_response.simple_response` without a parser of its own. It knows nothing of
    records or answers' meaning: :mod:`sidecar.http.appclient` formats requests and interprets
    responses; this module imports only ``sidecar.core`` and :mod:`sidecar.http.limits`.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[socket.socket]],
        *,
        max_body_bytes: int,
        idle_timeout_s: float,
        after_round: Callable[[], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._connect = connect
        self._max_body_bytes = max_body_bytes
        self._idle_timeout_s = idle_timeout_s
        self._idle: list[tuple[socket.socket, float]] = []
        self._by_fd: dict[int, Exchange] = {}  # connections with a request on them
        self._sockets: dict[int, socket.socket] = {}  # every connection in the epoll set
        # Requests with a deadline, in the order they got it; `_uniform` while they share one
        # timeout (then the first one's deadline is the soonest).
        self._flight: dict[Exchange, None] = {}
        self._timeouts: dict[float, int] = {}
        self._epoll: select.epoll | None = None
        self._now: Callable[[], float] = trio.current_time  # the run's clock (one call, not three)
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._completions = 0
        self._closed = False
        self._starting = False  # inside `start`: a request that fails now is finished later
        self.connections_opened = 0
        self.after_round: Callable[[], None] | None = after_round
        self.on_error: Callable[[BaseException], None] = on_error or _raise

    # --------------------------------------------------------------------------- the callers' face

    def in_flight(self) -> int:
        return len(self._flight)

    def idle_connections(self) -> int:
        return len(self._idle)

    def start(self, request: bytes, timeout_s: float, done: Callable[[Result], None]) -> Exchange:
        """Start a request (trio's thread): sent now on a free connection, or once one is open.

        ``done`` is called exactly once, later, from the reader task (never from inside
        ``start``), unless the request is abandoned or the pool closed first.
        """
        if self._closed:
            raise RuntimeError("the app client is closed")
        if self._token is None:  # no reader yet, or its trio run is over
            self._serve_this_run()
        exchange = Exchange(request, timeout_s, done)
        sock = self._take_idle()
        if sock is None:
            trio.lowlevel.spawn_system_task(self._open_for, exchange, name="sidecar app connect")
            return exchange
        self._starting = True
        try:
            self._begin(exchange, sock, reused=True)
        finally:
            self._starting = False
        return exchange

    def abandon(self, exchange: Exchange) -> None:
        """The caller gave up on a request (cancelled): close its connection, never call ``done``."""
        if exchange.finished:
            return
        exchange.finished = True
        exchange.done = _spent
        self._forget(exchange)
        if exchange.sock is not None:
            self._close(exchange.sock)

    def close(self) -> None:
        """Close every connection; requests in flight are dropped without their ``done``."""
        self._closed = True
        for exchange in list(self._flight):
            exchange.finished = True
        for exchange in list(self._by_fd.values()):
            exchange.finished = True
        self._flight.clear()
        self._timeouts.clear()
        self._by_fd.clear()
        self._idle.clear()
        for sock in list(self._sockets.values()):
            self._close(sock)
        if self._epoll is not None:
            with contextlib.suppress(RuntimeError):
                trio.lowlevel.notify_closing(self._epoll.fileno())
            self._epoll.close()
        if self._scope is not None:
            self._scope.cancel()

    # --------------------------------------------------------------------------- connections

    def _take_idle(self) -> socket.socket | None:
        oldest_usable = self._now() - self._idle_timeout_s
        idle = self._idle
        while idle:
            sock, idle_since = idle.pop()  # LIFO: the freshest is least likely stale
            if idle_since >= oldest_usable:
                return sock
            self._close(sock)
        return None

    def _put_idle(self, sock: socket.socket) -> None:
        self._idle.append((sock, self._now()))

    def _register(self, sock: socket.socket) -> None:
        assert self._epoll is not None
        fd = sock.fileno()
        self._epoll.register(fd, _IN)
        self._sockets[fd] = sock

    def _close(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        if fd == -1:
            return
        if self._sockets.pop(fd, None) is not None and self._epoll is not None:
            with contextlib.suppress(OSError, ValueError):
                self._epoll.unregister(fd)
        self._by_fd.pop(fd, None)
        # trio waited on it while it connected: tell it, so no registration outlives the descriptor.
        with contextlib.suppress(RuntimeError):
            trio.lowlevel.notify_closing(sock)
        sock.close()

    async def _open_for(self, exchange: Exchange) -> None:
        """A request without a connection: open one (within the request's deadline when this is
        the retry of a stale one), then send."""
        retry = exchange.deadline > 0.0
        sock: socket.socket | None = None
        try:
            if retry:
                with trio.move_on_at(exchange.deadline):
                    sock = await self._connect()
            else:
                sock = await self._connect()
        except AppNotReachable as exc:
            if not exchange.finished:
                self._finish(exchange, exc)
                self._after_async_completion()
            return
        if self._closed:
            if sock is not None:
                sock.close()
            return
        if sock is not None:
            self.connections_opened += 1
            self._register(sock)
        if exchange.finished:  # timed out or abandoned meanwhile: keep the connection
            if sock is not None:
                self._put_idle(sock)
            return
        if sock is None:
            self._finish(exchange, timed_out(exchange.timeout_s))
        else:
            self._begin(exchange, sock, reused=False)
        self._after_async_completion()

    # --------------------------------------------------------------------------- one request

    def _begin(self, exchange: Exchange, sock: socket.socket, *, reused: bool) -> None:
        exchange.sock = sock
        exchange.reused = reused
        exchange.received = 0
        if exchange.collector is not None:  # a retry: made again when the first read needs them
            _drop_parser(exchange)
        if exchange.deadline == 0.0:
            exchange.deadline = self._now() + exchange.timeout_s
            self._flight[exchange] = None
            timeouts = self._timeouts
            timeouts[exchange.timeout_s] = timeouts.get(exchange.timeout_s, 0) + 1
            scope = self._scope
            if scope is not None and exchange.deadline < scope.deadline:
                scope.deadline = exchange.deadline
        self._by_fd[sock.fileno()] = exchange
        exchange.unsent = memoryview(exchange.request)
        self._send_more(exchange)

    def _send_more(self, exchange: Exchange) -> None:
        sock, view = exchange.sock, exchange.unsent
        assert sock is not None and view is not None
        try:
            while view:
                try:
                    sent = sock.send(view)
                except BlockingIOError:
                    exchange.unsent = view
                    if not exchange.waits_writable:
                        exchange.waits_writable = True
                        self._want_writable(sock, True)
                    return
                view = view[sent:]
        except OSError as exc:
            exchange.unsent = None
            self._failed(exchange, exc)
            return
        exchange.unsent = None
        if exchange.waits_writable:
            exchange.waits_writable = False
            self._want_writable(sock, False)

    def _want_writable(self, sock: socket.socket, writable: bool) -> None:
        assert self._epoll is not None
        with contextlib.suppress(OSError):
            self._epoll.modify(sock.fileno(), _IN_OUT if writable else _IN)

    def _on_event(self, exchange: Exchange, events: int) -> None:
        if exchange.unsent is not None:
            if events & (select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP):
                self._send_more(exchange)
            if exchange.unsent is not None or exchange.finished:
                return
        self._read(exchange)

    def _read(self, exchange: Exchange) -> None:
        sock = exchange.sock
        assert sock is not None
        first: bytes | None = None
        if exchange.collector is None:
            # The response's first read: most answers are whole in it and of the narrow form
            # `simple_response` takes without a general parser; anything else is fed to one.
            try:
                first = sock.recv(_RECEIVE_BYTES)
            except BlockingIOError:
                return
            except OSError as exc:
                self._failed(exchange, exc)
                return
            if first:
                quick = simple_response(first, _QUICK_HEAD_BYTES, self._max_body_bytes)
                if quick is not None:
                    exchange.received = len(first)
                    self._answered(exchange, sock, RawResponse(*quick), keep_alive=True)
                    return
            exchange.collector = _ResponseCollector(self._max_body_bytes)
            exchange.parser = httptools.HttpResponseParser(exchange.collector)
            exchange.collector.parser = exchange.parser
        collector, parser = exchange.collector, exchange.parser
        assert collector is not None and parser is not None
        try:
            while not collector.complete:
                if first is not None:
                    data, first = first, None
                else:
                    try:
                        data = sock.recv(_RECEIVE_BYTES)
                    except BlockingIOError:
                        return  # edge-triggered: the next bytes are an event of their own
                if not data:
                    if collector.headers_done and not collector.framed:
                        break  # a body delimited by EOF (no Content-Length, not chunked)
                    if exchange.received == 0:
                        if exchange.reused:
                            raise _Stale
                        raise AppRequestFailed(
                            APP_CONNECTION_LOST, "the app closed the connection without answering"
                        )
                    raise AppRequestFailed(
                        APP_CONNECTION_LOST,
                        f"the app closed the connection after {exchange.received} bytes of its "
                        "answer",
                    )
                exchange.received += len(data)
                try:
                    collector.feed(parser, data)
                except LimitExceeded as exc:
                    what = "header block and trailers" if exc.what == "head" else "chunk framing"
                    raise AppRequestFailed(
                        MALFORMED_RESPONSE, f"response {what} over {exc.limit} bytes"
                    ) from exc
                except httptools.HttpParserUpgrade as exc:
                    raise AppRequestFailed(
                        MALFORMED_RESPONSE, "unexpected protocol upgrade"
                    ) from exc
                except httptools.HttpParserError as exc:
                    raise AppRequestFailed(MALFORMED_RESPONSE, f"unparseable HTTP: {exc}") from exc
                if collector.too_large:
                    raise AppRequestFailed(
                        MALFORMED_RESPONSE, f"response body over {self._max_body_bytes} bytes"
                    )
        except _Stale:
            self._retry_stale(exchange)
            return
        except AppRequestFailed as exc:
            self._close(sock)
            self._finish(exchange, exc)
            return
        except OSError as exc:
            self._failed(exchange, exc)
            return
        keep_alive = collector.complete and collector.keep_alive and not collector.extra_message
        response = RawResponse(collector.status, collector.headers, bytes(collector.body))
        self._answered(exchange, sock, response, keep_alive=keep_alive)

    def _answered(
        self, exchange: Exchange, sock: socket.socket, response: RawResponse, *, keep_alive: bool
    ) -> None:
        self._by_fd.pop(sock.fileno(), None)
        exchange.sock = None
        if keep_alive and not self._closed:
            self._put_idle(sock)
        else:
            self._close(sock)
        self._finish(exchange, response)

    def _failed(self, exchange: Exchange, exc: OSError) -> None:
        """A send or receive failed: the peer went away (a stale connection if nothing came back
        on a reused one), or the socket failed otherwise."""
        lost = isinstance(exc, (BrokenPipeError, ConnectionError)) or (
            exc.errno in _CONNECTION_LOST_ERRNOS
        )
        if lost and exchange.received == 0 and exchange.reused:
            self._retry_stale(exchange)
            return
        if exchange.sock is not None:
            self._close(exchange.sock)
        self._finish(exchange, AppRequestFailed(APP_CONNECTION_LOST, f"connection lost: {exc}"))

    def _retry_stale(self, exchange: Exchange) -> None:
        if exchange.sock is not None:
            self._close(exchange.sock)
            exchange.sock = None
        exchange.reused = False
        trio.lowlevel.spawn_system_task(self._open_for, exchange, name="sidecar app reconnect")

    def _finish(self, exchange: Exchange, result: Result) -> None:
        if exchange.finished:
            return
        if self._starting:
            trio.lowlevel.spawn_system_task(
                self._finish_later, exchange, result, name="sidecar app request failed"
            )
            return
        exchange.finished = True
        self._forget(exchange)
        self._completions += 1
        done, exchange.done = exchange.done, _spent
        try:
            done(result)
        except Exception as exc:  # a bug in the caller's callback: the caller decides
            self.on_error(exc)

    async def _finish_later(self, exchange: Exchange, result: Result) -> None:
        self._finish(exchange, result)
        self._after_async_completion()

    def _forget(self, exchange: Exchange) -> None:
        """The request is over: out of the deadlines (if it had one) and off its connection."""
        if exchange.collector is not None:  # most answers are read without one
            _drop_parser(exchange)
        if exchange in self._flight:
            del self._flight[exchange]
            timeouts = self._timeouts
            left = timeouts[exchange.timeout_s] - 1
            if left:
                timeouts[exchange.timeout_s] = left
            else:
                del timeouts[exchange.timeout_s]
        if exchange.sock is not None:
            self._by_fd.pop(exchange.sock.fileno(), None)

    # --------------------------------------------------------------------------- the reader

    def _serve_this_run(self) -> None:
        token = trio.lowlevel.current_trio_token()
        # No reader (`start` calls this only then): the first request, or a new trio run (tests
        # run many). A fresh epoll set and reader; an old run's connections cannot be waited on
        # from this one.
        for sock in list(self._sockets.values()):
            self._close(sock)
        self._idle.clear()
        if self._epoll is not None:
            self._epoll.close()
        self._epoll = select.epoll()
        self._token = token
        self._now = trio.lowlevel.current_clock().current_time
        trio.lowlevel.spawn_system_task(self._serve, token, name="sidecar app answers")

    def _soonest(self) -> float:
        flight = self._flight
        if not flight:
            return math.inf
        if len(self._timeouts) == 1:
            return next(iter(flight)).deadline
        return min(e.deadline for e in flight)

    async def _serve(self, token: trio.lowlevel.TrioToken) -> None:
        """The reader: wait for the epoll set, read what is there, expire what is late."""
        epoll = self._epoll
        assert epoll is not None
        fd = epoll.fileno()
        try:
            while self._token is token and not self._closed:
                with trio.CancelScope(deadline=self._soonest()) as scope:
                    self._scope = scope
                    while True:
                        await trio.lowlevel.wait_readable(fd)
                        self._round(epoll)
                        # Only ever sooner (setting a deadline is dear): a wait that ends early
                        # costs a round that finds nothing.
                        soonest = self._soonest()
                        if soonest < scope.deadline:  # noqa: PLR1730
                            scope.deadline = soonest
                self._scope = None
                self._round(epoll)
        except (trio.ClosedResourceError, ValueError, OSError):
            return  # closed
        finally:
            # Its run is over (cancelled at its end), or the pool closed: the next request in a
            # trio run starts a reader of its own (`_serve_this_run`).
            if self._token is token:
                self._token = None

    def _round(self, epoll: select.epoll) -> None:
        before = self._completions
        by_fd = self._by_fd
        for fd, events in epoll.poll(0):
            exchange = by_fd.get(fd)
            if exchange is None:
                self._idle_event(fd)
            else:
                self._on_event(exchange, events)
        flight = self._flight
        if flight:
            now = self._now()
            uniform = len(self._timeouts) == 1
            for exchange in list(flight):
                if exchange.deadline <= now:
                    if exchange.sock is not None:
                        self._close(exchange.sock)
                    self._finish(exchange, timed_out(exchange.timeout_s))
                elif uniform:
                    break
        if self._completions != before and self.after_round is not None:
            self.after_round()

    def _after_async_completion(self) -> None:
        """A connect task started or finished a request: the caller's round ends here too."""
        if self.after_round is not None:
            self.after_round()

    def _idle_event(self, fd: int) -> None:
        """Something on an idle connection: the app closed it (EOF), or sent what nobody asked
        for. Either way it is not reusable."""
        sock = self._sockets.get(fd)
        if sock is None:
            return
        try:
            sock.recv(1)  # EOF, an error, or a byte nobody asked for: it goes either way
        except BlockingIOError:
            return  # nothing after all (a spurious edge)
        except OSError:
            pass
        for i, (idle, _since) in enumerate(self._idle):
            if idle is sock:
                del self._idle[i]
                break
        self._close(sock)
