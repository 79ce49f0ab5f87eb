"""A small HTTP/1.1 server on trio, for the sidecar's local API and for test and example apps.

Owns HTTP/1.1 framing on the server side (httptools), keep-alive, request bodies, TCP and Unix
listeners, TLS, and its hard limits (drawn in `Limits`' docstring; the listener's use in
`serve_http`'s). Knows nothing of Kafka, acks or the wire contract: handlers get a `Request` and
return a `Response`.

Imports only `sidecar.http.limits`, `sidecar.http.seating` and `sidecar.http.sockets` from this
package; ``sidecar.service.api`` and the test and example apps build on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http
import json
import logging
import os
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, TypeAlias, TypeVar

import httptools
import outcome
import trio

from sidecar.core.errors import SidecarError
from sidecar.http.limits import LimitExceeded, MeteredCollector
from sidecar.http.seating import Seat, Seating, SeatState
from sidecar.http.sockets import IdleWatch, accept_loop, open_unix_listener, peer_of

__all__ = [
    "BadResponse",
    "Handler",
    "Limits",
    "Listen",
    "PeerClosed",
    "Request",
    "Response",
    "ServerStats",
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
_REFUSE_SEND_TIMEOUT_S = 1.0
_LOG_EVERY_S = 1.0
# A cut (a connection the server closed) is logged at most once per peer per interval, and at
# most CUT_LOG_LINES times per interval in all; the peers remembered for that are bounded.
CUT_LOG_INTERVAL_S = 10.0
CUT_LOG_LINES = 20
_CUT_LOG_PEERS = 4096
# What a watched handler's connection may buffer of the next pipelined request; past that, the
# watch stops reading (and so stops noticing a close) until the handler returns.
_WATCH_MAX_BYTES = 256 * 1024

T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """The server's hard limits.

    Every limit is hard (docs/security.md), set by :class:`Limits`, answered with a clear status or a close,
    counted in :class:`ServerStats` and logged: refusals at most once a second per reason, cuts (a
    connection the server closes on its own) at most once per peer per 10 s::

        413  body over ``max_request_bytes``
        431  header block plus chunked trailers over ``max_header_bytes`` (bytes on the wire,
             :mod:`sidecar.http.limits`: an endless header value or trailer never grows memory)
        --   no byte of a request within ``idle_timeout_s`` of connecting, or within
             ``keep_alive_timeout_s`` of the last answer: closed (cut ``idle``, or
             ``keep_alive_idle``, counted only; answers say ``Keep-Alive: timeout=N``)
        408  a header block not complete within ``header_timeout_s`` of the request's first byte
             (cut ``header_timeout``)
        408  a body slower than ``body_min_rate_bytes_per_s`` after ``body_timeout_s``: cut when
             ``body_timeout_s`` plus one second per ``body_min_rate_bytes_per_s`` bytes received have
             passed since the header block (cut ``body_too_slow``, Apache's mod_reqtimeout rule)
        408  a whole request (header block and body) not in within ``request_timeout_s`` of its
             first byte, however fast it trickles (cut ``request_timeout``)
        --   a response the client does not read within ``send_timeout_s``: dropped (cut
             ``send_timeout``)
        --   a new connection when its peer holds ``max_connections_per_peer`` or the listener
             ``max_connections``: the connection of that peer, or of the listener, that has gone
             longest without a request answered (idle or reading) is closed to make room (cut
             ``evicted``; :mod:`sidecar.http.seating`)
        503  a new connection when every open one is busy being answered: answered and closed
        500  a handler that raised, or returned a response that cannot be written (a header that is
             not latin-1 or carries CR/LF): the per-request dispatch (``_respond``), this module's
             only broad ``except``; the connection and the server go on
    It imports only :mod:`sidecar.http.limits`, :mod:`sidecar.http.seating` and
    :mod:`sidecar.http.sockets` (listening, accepting, idle waits) from this package;
    ``sidecar.service.api`` and the test and example apps build on it.
    """

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_header_bytes: int = MAX_HEADER_BYTES
    max_connections: int = 1024
    max_connections_per_peer: int = 256
    idle_timeout_s: float = 5.0
    keep_alive_timeout_s: float = 60.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    body_min_rate_bytes_per_s: float = 500.0
    request_timeout_s: float = 30.0
    send_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in (
            "max_request_bytes",
            "max_header_bytes",
            "max_connections",
            "max_connections_per_peer",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in (
            "idle_timeout_s",
            "keep_alive_timeout_s",
            "header_timeout_s",
            "body_timeout_s",
            "request_timeout_s",
            "send_timeout_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.body_min_rate_bytes_per_s < 0:
            raise ValueError("body_min_rate_bytes_per_s must not be negative")

    def body_deadline(self, headers_done_at: float, body_bytes: int) -> float:
        """When a body whose header block completed at ``headers_done_at`` and that has sent
        ``body_bytes`` so far is cut: ``body_timeout_s`` after the header, one more second per
        ``body_min_rate_bytes_per_s`` bytes received (Apache's mod_reqtimeout ``MinRate``)."""
        deadline = headers_done_at + self.body_timeout_s
        if self.body_min_rate_bytes_per_s:
            deadline += body_bytes / self.body_min_rate_bytes_per_s
        return deadline


@dataclass(slots=True)
class ServerStats:
    """What one listener did (read by the metrics): open connections, refusals and cuts by reason.

    Refusals (an answer with a status, or a 503 connection): ``connections`` (503: full of
    connections whose handlers run, none to close), ``header_too_large`` (431),
    ``body_too_large`` (413), ``bad_request`` (400), plus the control API's own guards.

    Cuts (a connection the server closed on its own): ``evicted`` (closed to make room for a new
    connection), ``idle`` (no byte within ``idle_timeout_s`` of connecting), ``keep_alive_idle``
    (no next request within ``keep_alive_timeout_s``: counted, never logged), ``header_timeout``,
    ``body_too_slow``, ``request_timeout`` (the three answered 408), ``send_timeout`` (the client
    does not read its response).
    """

    name: str = "http"
    open_connections: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    cuts: dict[str, int] = field(default_factory=dict)
    _logged_at: dict[str, float] = field(default_factory=dict)
    _unlogged: dict[str, int] = field(default_factory=dict)
    _cut_logged_at: dict[str, float] = field(default_factory=dict)
    _cut_window: list[float] = field(default_factory=lambda: [-CUT_LOG_INTERVAL_S, 0.0])
    _cuts_unlogged: int = 0

    def reject(self, reason: str, detail: str) -> None:
        """Count a refusal and log it, at most once a second per reason (a flood stays readable)."""
        self.refused[reason] = self.refused.get(reason, 0) + 1
        now = trio.current_time()
        if now - self._logged_at.get(reason, -_LOG_EVERY_S) < _LOG_EVERY_S:
            self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
            return
        self._logged_at[reason] = now
        suppressed = self._unlogged.pop(reason, 0)
        log.warning(
            "%s listener: refused a request (%s): %s%s",
            self.name,
            reason,
            detail,
            f" (and {suppressed} more since the last such line)" if suppressed else "",
            extra={"fields": {"listener": self.name, "reason": reason}},
        )

    def cut(self, reason: str, peer: str, detail: str, *, quiet: bool = False) -> None:
        """Count a connection the server closed; log it at most once per peer per
        :data:`CUT_LOG_INTERVAL_S`, and at most :data:`CUT_LOG_LINES` lines per interval in all
        (a flood from many peers stays readable too). ``quiet``: count only."""
        self.cuts[reason] = self.cuts.get(reason, 0) + 1
        if quiet:
            return
        now = trio.current_time()
        if now - self._cut_logged_at.get(peer, -CUT_LOG_INTERVAL_S) < CUT_LOG_INTERVAL_S:
            self._cuts_unlogged += 1
            return
        window = self._cut_window  # [start, lines logged since]
        if now - window[0] >= CUT_LOG_INTERVAL_S:
            window[0], window[1] = now, 0.0
        if window[1] >= CUT_LOG_LINES:
            self._cuts_unlogged += 1
            return
        window[1] += 1
        if len(self._cut_logged_at) >= _CUT_LOG_PEERS:
            # Bounded: forget the peers whose interval is over (all of them, if none is).
            recent = {p: t for p, t in self._cut_logged_at.items() if now - t < CUT_LOG_INTERVAL_S}
            self._cut_logged_at = recent if len(recent) < _CUT_LOG_PEERS else {}
        self._cut_logged_at[peer] = now
        suppressed, self._cuts_unlogged = self._cuts_unlogged, 0
        log.warning(
            "%s listener: closed a connection from %s (%s): %s%s",
            self.name,
            peer,
            reason,
            detail,
            f" (and {suppressed} more cuts not logged since the last such line)"
            if suppressed
            else "",
            extra={"fields": {"listener": self.name, "reason": reason, "peer": peer}},
        )


class PeerClosed(SidecarError):
    """The client closed its connection (EOF or reset) during :meth:`Request.watch_peer`: the
    wait was cancelled, and the server answers nothing and closes the connection."""


class _Peer:
    """One connection's read side while its handler runs (the loop itself reads only between
    requests); see :meth:`Request.watch_peer`."""

    __slots__ = ("closed", "handling", "pending", "stream")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.pending = bytearray()  # read during a watch: the loop parses these before reading
        self.closed = False  # EOF or a reset seen during a watch
        self.handling = False  # a handler of this connection runs: the loop is not reading

    async def watch(self, wait: Callable[[], Awaitable[T]]) -> T:
        if self.closed:
            raise PeerClosed("the client closed the connection")
        waiting = trio.CancelScope()

        async def run() -> T:
            with waiting:
                return await wait()
            raise PeerClosed("the client closed the connection")  # `waiting` cancelled: EOF

        # The wait runs in the body, captured, so that what it raises leaves unwrapped (a
        # nursery wraps its body's exceptions in an ExceptionGroup). `outcome` is trio's own
        # result type (trio.lowlevel.reschedule takes its values): not a dependency of ours.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_until_closed, waiting)
            result = await outcome.acapture(run)
            nursery.cancel_scope.cancel()
        return result.unwrap()

    async def _read_until_closed(self, waiting: trio.CancelScope) -> None:
        # Cancelling receive_some of a socket stream loses no byte: trio either received (and
        # returns) or did not; so what the client sends next reaches the loop in order.
        while len(self.pending) < _WATCH_MAX_BYTES:
            try:
                data = await self.stream.receive_some(_RECEIVE_BYTES)
            except trio.BrokenResourceError:
                data = b""  # a reset
            if not data:
                self.closed = True
                waiting.cancel()
                return
            self.pending += data


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed request. Header names are lower-case; values are decoded as latin-1."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    via_unix: bool = False  # came in over a Unix socket (no browser can send those)
    _peer: _Peer | None = field(default=None, repr=False, compare=False)

    async def watch_peer(self, wait: Callable[[], Awaitable[T]]) -> T:
        """``await wait()``, cancelled if the client closes the connection meanwhile.

        For a handler that waits (a long poll): when the client goes (EOF or a reset on the
        read side) before ``wait`` returned, ``wait`` is cancelled and :class:`PeerClosed`
        raised; the server then writes nothing and closes the connection. Bytes of a pipelined
        next request do not cancel it. Outside the server (a Request built by hand) or once the
        handler returned, it only awaits ``wait``. A ``wait`` that returned just as the client
        went returns its value: the response is then written into the closed connection.

        A handler that waits (a long poll) may ask to be cancelled when its client goes:
        :meth:`Request.watch_peer` runs the wait while this module reads the connection on its behalf.
        EOF or a reset on the read side cancels the wait and raises :class:`PeerClosed` (the connection is
        closed, nothing is written); bytes that arrive meanwhile (the next pipelined request: HTTP/1.1
        lets a client send it before the answer) are kept for the connection loop, in order, and never
        cancel anything. A client that half-closes its side after a request is taken for gone, as Go's
        net/http does. Other handlers are not watched: a request answered at once is answered even to a
        client that has already shut its side.

        Chunked trailers count against the header budget and are otherwise dropped (RFC 9110 §6.5:
        they are not merged into the headers).
        """
        peer = self._peer
        if peer is None or not peer.handling:
            return await wait()
        return await peer.watch(wait)

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


class BadResponse(SidecarError, ValueError):
    """A handler's response that cannot be written as HTTP/1.1 (the handler's bug: a 500)."""


def _format_response(
    response: Response, keep_alive: bool, head_only: bool, idle_s: float = 0.0
) -> bytes:
    """The response's bytes; BadResponse when a header cannot go on the wire as it is (not
    latin-1, or a CR or LF in it, which would split the response)."""
    status = response.status
    parts = [
        b"HTTP/1.1 %d %s\r\nContent-Length: %d\r\n"
        % (status, _REASONS.get(status, "Unknown").encode("ascii"), len(response.body))
    ]
    for name, value in response.headers:
        line = f"{name}: {value}"
        if "\r" in line or "\n" in line:
            raise BadResponse(f"header {name[:64]!r}: CR or LF in a header line")
        try:
            parts.append(line.encode("latin-1") + b"\r\n")
        except UnicodeEncodeError as exc:
            raise BadResponse(f"header {name[:64]!r}: not latin-1") from exc
    if not keep_alive:
        parts.append(b"Connection: close\r\n")
    elif idle_s >= 1:
        # How long an idle connection stays open (whole seconds, rounded down): a client that
        # honours it closes first, instead of reusing a connection the server is closing.
        parts.append(b"Keep-Alive: timeout=%d\r\n" % int(idle_s))
    parts.append(b"\r\n")
    if not head_only:
        parts.append(response.body)
    return b"".join(parts)


def _error_response(status: int, message: str) -> bytes:
    response = Response(status, (("Content-Type", "text/plain; charset=utf-8"),), message.encode())
    return _format_response(response, keep_alive=False, head_only=False)


class _RequestCollector(MeteredCollector):
    """httptools callbacks for one connection; completed requests queue up in ``ready``."""

    __slots__ = (
        "expect_continue",
        "headers",
        "headers_complete",
        "parser",
        "peer",
        "ready",
        "url",
        "via_unix",
    )

    def __init__(
        self, max_body_bytes: int, max_head_bytes: int, via_unix: bool, peer: _Peer | None = None
    ) -> None:
        super().__init__(max_head_bytes, max_body_bytes)
        self.via_unix = via_unix
        self.peer = peer
        self.parser: httptools.HttpRequestParser | None = None
        self.ready: deque[tuple[Request, bool]] = deque()
        self._reset()

    def _reset(self) -> None:
        self.url = b""
        self.headers: list[tuple[str, str]] = []
        self.body = bytearray()
        self.headers_complete = False
        self.expect_continue = False

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reset()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        if self.headers_complete:
            return  # a chunked trailer: counted against the head budget, otherwise ignored
        self.headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.headers_complete = True
        if self._content_length > self.max_body_bytes:
            self.too_large = True
        for name, value in self.headers:
            if name == "expect" and value.strip().lower() == "100-continue":
                self.expect_continue = True

    def on_message_complete(self) -> None:
        super().on_message_complete()
        assert self.parser is not None
        target = self.url.decode("latin-1")
        path, _, query = target.partition("?")
        request = Request(
            self.parser.get_method().decode("ascii"),
            path,
            query,
            tuple(self.headers),
            bytes(self.body),
            via_unix=self.via_unix,
            _peer=self.peer,
        )
        self.ready.append((request, self.parser.should_keep_alive()))
        self._reset()


async def _refuse(
    stream: trio.abc.Stream, status: int, message: str, *, drain_s: float = _DRAIN_TIMEOUT_S
) -> None:
    """Send an error and close gracefully, so the client gets to read the error.

    Closing a socket with unread input makes the kernel send a reset, which can destroy the
    response before the client reads it; so shut down our side, then drain (bounded) first.
    The send is bounded too: a client that does not read gets nothing.
    """
    with trio.move_on_after(drain_s + _REFUSE_SEND_TIMEOUT_S):
        with trio.move_on_after(_REFUSE_SEND_TIMEOUT_S) as sending:
            await stream.send_all(_error_response(status, message))
            if isinstance(stream, trio.abc.HalfCloseableStream):
                await stream.send_eof()
        if sending.cancelled_caught:
            return
        drained = 0
        with trio.move_on_after(drain_s):
            while drained < _DRAIN_MAX_BYTES:
                data = await stream.receive_some(_RECEIVE_BYTES)
                if not data:
                    break
                drained += len(data)


_INTERNAL_ERROR = Response(500, (("Content-Type", "text/plain"),), b"internal error\n")


async def _respond(
    handler: Handler, request: Request, keep_alive: bool, head_only: bool, idle_s: float
) -> bytes | None:
    """The per-request dispatch: the handler's response as bytes, or a 500; None when the client
    closed the connection during a watched wait (PeerClosed: nobody to answer).

    The only broad `except` of this module: one broken handler call (an exception, or a response
    that cannot be written) must cost one 500, not the connection or the server. trio.Cancelled is
    a BaseException and passes through.
    """
    try:
        return _format_response(await handler(request), keep_alive, head_only, idle_s)
    except PeerClosed:
        return None
    except Exception:
        log.exception("HTTP handler failed for %s %s", request.method, request.path)
        return _format_response(_INTERNAL_ERROR, keep_alive, head_only, idle_s)


async def _serve_connection(
    stream: trio.abc.Stream,
    handler: Handler,
    limits: Limits,
    stats: ServerStats,
    via_unix: bool,
    room: Seating,
    seat: Seat,
    idle: IdleWatch,
) -> None:
    peer = _Peer(stream)
    collector = _RequestCollector(limits.max_request_bytes, limits.max_header_bytes, via_unix, peer)
    parser = httptools.HttpRequestParser(collector)
    collector.parser = parser
    # The clocks of the request being read (None between requests): its first byte, and the
    # end of its header block. A request is cut at the first of its deadlines (`Limits`).
    request_start: float | None = None
    body_start: float | None = None
    waiting_since = trio.current_time()
    served = False  # a request was answered on this connection: an idle one is a keep-alive
    try:
        while True:
            data: bytes | bytearray = b""
            if request_start is None:
                wait_s = limits.keep_alive_timeout_s if served else limits.idle_timeout_s
                deadline = waiting_since + wait_s
                reason = "keep_alive_idle" if served else "idle"
            elif body_start is None:
                deadline = request_start + min(limits.header_timeout_s, limits.request_timeout_s)
                reason = (
                    "header_timeout"
                    if limits.header_timeout_s < limits.request_timeout_s
                    else "request_timeout"
                )
            else:
                deadline = request_start + limits.request_timeout_s
                reason = "request_timeout"
                body_deadline = limits.body_deadline(body_start, collector.body_bytes)
                if body_deadline < deadline:
                    deadline, reason = body_deadline, "body_too_slow"
            if peer.pending:  # read while a handler watched its client: the next request
                data, peer.pending = peer.pending, bytearray()
            else:
                timed_out = False
                if request_start is None:
                    timed_out = not await idle.wait_readable(stream, deadline)
                if not timed_out:
                    with trio.move_on_at(deadline) as receiving:
                        data = await stream.receive_some(_RECEIVE_BYTES)
                    timed_out = receiving.cancelled_caught
                if timed_out:
                    if request_start is None:
                        stats.cut(
                            reason,
                            seat.peer,
                            f"no request within {wait_s:g} s",
                            quiet=served,
                        )
                        return  # close quietly: nothing was asked
                    # Still seated (reading) while the 408 goes out: the first to be closed if
                    # a new connection needs the room, so its descriptor is always counted.
                    stats.cut(reason, seat.peer, _CUT_DETAIL[reason])
                    await _refuse(stream, 408, "request not complete in time\n", drain_s=0.1)
                    return
                if not data:
                    return  # peer closed
            if request_start is None:
                request_start = trio.current_time()
                room.enter(seat, SeatState.READING, request_start)
            upgrade = False
            try:
                collector.feed(parser, bytes(data))
            except httptools.HttpParserUpgrade:
                upgrade = True  # not supported: answer what was parsed, then close
            except LimitExceeded as exc:
                if exc.what == "head":
                    stats.reject("header_too_large", f"header block or trailers {exc}")
                    await _refuse(stream, 431, "request header block or trailers too large\n")
                else:
                    stats.reject("bad_request", f"chunk framing {exc}")
                    await _refuse(stream, 400, "bad request: chunk framing too large\n")
                return
            except httptools.HttpParserError as exc:
                stats.reject("bad_request", "unparseable request")
                await _refuse(stream, 400, f"bad request: {exc}\n")
                return
            if collector.too_large:
                stats.reject("body_too_large", f"body over {limits.max_request_bytes} bytes")
                await _refuse(stream, 413, "request body too large\n")
                return
            if body_start is None and collector.headers_complete:
                body_start = trio.current_time()
            if collector.expect_continue:
                collector.expect_continue = False
                if not collector.ready:
                    await _send(stream, b"HTTP/1.1 100 Continue\r\n\r\n", limits, stats, seat)
            answered = bool(collector.ready)
            if answered:
                # Never closed to make room while answered.
                room.enter(seat, SeatState.BUSY, trio.current_time())
            while collector.ready:
                request, keep_alive = collector.ready.popleft()
                keep_alive = keep_alive and not upgrade
                head_only = request.method == "HEAD"
                peer.handling = True
                try:
                    response = await _respond(
                        handler, request, keep_alive, head_only, limits.keep_alive_timeout_s
                    )
                finally:
                    peer.handling = False
                if response is None:
                    return  # the client closed the connection during the handler's wait
                await _send(stream, response, limits, stats, seat)
                served = True
                if not keep_alive or peer.closed:
                    return
            if upgrade:
                return
            if not collector.in_message:
                request_start = body_start = None
                waiting_since = trio.current_time()
                room.enter(seat, SeatState.WAITING, waiting_since)
            elif answered:  # the next pipelined request has begun: its own clocks
                request_start = trio.current_time()
                body_start = request_start if collector.headers_complete else None
                room.enter(seat, SeatState.READING, request_start)
    except (trio.BrokenResourceError, trio.ClosedResourceError, _SendTimeout):
        return  # the client went away, or stopped reading; nothing to tell it
    finally:
        room.leave(seat)
        # The parser holds the collector's methods, the collector the parser: break the cycle, or
        # every connection's objects wait for the cyclic garbage collector.
        collector.parser = None
        await trio.aclose_forcefully(stream)


_CUT_DETAIL = {
    "header_timeout": "header block not complete in time",
    "request_timeout": "request not complete in time",
    "body_too_slow": "body slower than the minimum rate",
}


class _SendTimeout(Exception):
    """A response could not be written within send_timeout_s: the client does not read."""


async def _send(
    stream: trio.abc.Stream, data: bytes, limits: Limits, stats: ServerStats, seat: Seat
) -> None:
    with trio.move_on_after(limits.send_timeout_s) as scope:
        await stream.send_all(data)
    if scope.cancelled_caught:
        stats.cut("send_timeout", seat.peer, f"read nothing for {limits.send_timeout_s:g} s")
        raise _SendTimeout


async def serve_http(
    handler: Handler,
    listen: Listen,
    *,
    max_request_bytes: int | None = None,
    idle_timeout_s: float | None = None,
    limits: Limits | None = None,
    stats: ServerStats | None = None,
    backlog: int = 4096,
    tls: Callable[[], ssl.SSLContext] | None = None,
    task_status: trio.TaskStatus[int | str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``handler`` on ``listen`` until cancelled.

    ``limits`` holds every limit; ``max_request_bytes`` and ``idle_timeout_s`` override its most
    used fields (``idle_timeout_s`` both idle limits: before the first request and between).
    ``stats``, when given, is kept up to date (for metrics and tests). ``tls``: serve HTTPS with the
    context it returns (called once per connection).
    Reports the bound port (TCP; useful with port 0) or the socket path (Unix) through
    ``task_status`` once it accepts connections. On cancel, connections are closed and a Unix
    socket file this call created is removed.

    An idle connection waits for its first byte in one epoll set and deadline heap per listener
    (:class:`sidecar.http.sockets.IdleWatch`), not in trio's own, which every turn of trio's loop and
    every cancel scope of the delivery path would pay for.
    An open connection costs a task, a parser and a socket (see
    ``tests/integration/test_listener_floods.py``) plus what it has sent of its current request, at
    most ``max_header_bytes`` and ``max_request_bytes``; the room bounds how many there are.

    TLS (``tls``: a callable giving the ``ssl.SSLContext`` for each new connection, so a rotated certificate
    is picked up): each accepted connection is wrapped in a ``trio.SSLStream`` before anything is read, and
    every limit above applies to it as to plain HTTP; the handshake counts against ``idle_timeout_s`` (it is
    what the connection sends first), and a failed handshake closes the connection like a reset.

    Usage::

        port = await nursery.start(serve_http, handler, ("tcp", "127.0.0.1", 0))
        path = await nursery.start(serve_http, handler, ("unix", "/run/app.sock"))
        port = await nursery.start(functools.partial(serve_http, tls=lambda: context), handler, listen)
    """
    limits = limits or Limits()
    overrides: dict[str, float] = {}
    if max_request_bytes is not None:
        overrides["max_request_bytes"] = max_request_bytes
    if idle_timeout_s is not None:
        overrides["idle_timeout_s"] = overrides["keep_alive_timeout_s"] = idle_timeout_s
    if overrides:
        limits = dataclasses.replace(limits, **overrides)  # type: ignore[arg-type]
    stats = stats if stats is not None else ServerStats()
    listeners: list[trio.SocketListener]
    unix_path: str | None = None
    bound: int | str
    if listen[0] == "tcp":
        _, host, port = listen
        listeners = await trio.open_tcp_listeners(port, host=host, backlog=backlog)
        bound = int(listeners[0].socket.getsockname()[1])
    elif listen[0] == "unix":
        unix_path = listen[1]
        listeners = [await open_unix_listener(unix_path, backlog)]
        bound = unix_path
    else:
        raise ValueError(f"listen must be ('tcp', host, port) or ('unix', path), got {listen!r}")
    inode = os.stat(unix_path).st_ino if unix_path is not None else None
    via_unix = unix_path is not None

    room = Seating(limits.max_connections, limits.max_connections_per_peer)
    scopes: dict[Seat, trio.CancelScope] = {}
    idle = IdleWatch()

    async def serve_one(sock: trio.SocketStream) -> None:
        peer = peer_of(sock, via_unix)
        stream: trio.abc.Stream = sock
        if tls is not None:
            stream = trio.SSLStream(sock, tls(), server_side=True, https_compatible=True)
        seat, evicted = room.admit(peer, trio.current_time())
        if evicted is not None:
            stats.cut("evicted", evicted.peer, "closed to make room for a new connection")
            scopes[evicted].cancel()  # its task closes the socket at once
        if seat is None:
            stats.open_connections = room.count
            stats.reject("connections", f"{limits.max_connections} connections all answering")
            try:
                await _refuse(stream, 503, "too many connections\n", drain_s=0.1)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                await trio.aclose_forcefully(stream)
            return
        stats.open_connections = room.count
        with trio.CancelScope() as scope:
            scopes[seat] = scope
            try:
                await _serve_connection(stream, handler, limits, stats, via_unix, room, seat, idle)
            finally:
                del scopes[seat]
                room.leave(seat)
                stats.open_connections = room.count

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(idle.run)
            for listener in listeners:
                nursery.start_soon(accept_loop, listener, nursery, serve_one)
            task_status.started(bound)
    finally:
        idle.close()
        for listener in listeners:
            listener.socket.close()
        if unix_path is not None:
            # Remove only our own socket file: a successor may already have bound the path.
            with contextlib.suppress(OSError):
                if os.stat(unix_path).st_ino == inode:
                    os.unlink(unix_path)
