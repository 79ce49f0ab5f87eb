"""The HTTP client that pushes records to the application (docs/app-contract.md), on trio.

Owns turning records into requests and responses into answers (the bytes and their meaning come from
`sidecar.core.wire`), opening the connections, and the split between "could not connect" and "sent,
then failed" that decides whether a delivery counted as an attempt (`AppClient`'s docstring: errors,
limits, stale connections). The pool and the requests in flight are `sidecar.http.exchanges.Exchanges`'.

Imports only `sidecar.core` and `sidecar.http.exchanges` / `sidecar.http.limits` of this package;
knows nothing of Kafka, the ledger or the DLQ.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import trio

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
    route_missing,
    route_missing_statuses,
)
from sidecar.http.exchanges import (
    MAX_HEAD_BYTES,
    AppClientError,
    AppNotReachable,
    AppRequestFailed,
    AppRouteMissing,
    Exchange,
    Exchanges,
    RawResponse,
    Result,
)

__all__ = [
    "APP_CONNECTION_LOST",
    "APP_TIMEOUT",
    "MALFORMED_RESPONSE",
    "MAX_HEAD_BYTES",
    "AppClient",
    "AppClientError",
    "AppNotReachable",
    "AppRequestFailed",
    "AppRouteMissing",
    "AppTarget",
    "RawResponse",
]


DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024

R = TypeVar("R")


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

    def url(self) -> str:
        """The URL the requests go to, as a person would write it (a Unix socket: its path first)."""
        if self.unix_path is not None:
            return f"http+unix://{self.unix_path}{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.path}"


def _detach(stream: trio.SocketStream) -> socket.socket:
    """The plain non-blocking socket under a freshly opened trio stream.

    Requests go through the socket directly (:mod:`sidecar.http.exchanges`): ``SocketStream``
    wraps every call in conflict detection, an error-translating context manager and an
    ``outcome`` round trip, which cost more CPU per request than the HTTP work itself at thousands
    of requests per second.
    """
    fd = stream.socket.detach()
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return sock


class AppClient:
    """Requests to one app: formatted from records, sent over a keep-alive pool, answers read.

    Two faces. ``start_single`` / ``start_batch`` (the pipeline's) start a request synchronously
    and call back with its answer from the pool's reader task, after which the pool calls
    ``after_round`` once per wake-up (:class:`~sidecar.http.exchanges.Exchanges`); the caller
    bounds its own concurrency. ``send`` / ``deliver`` / ``deliver_batch`` await one request, at
    most ``max_connections`` at once (waiting for a free slot beyond that).

    Limits on an answer: its header block plus chunked trailers at most ``MAX_HEAD_BYTES`` (counted on
    the wire, so endless trailers or an endless header value never grow memory), its body at most
    ``max_body_bytes``, chunk framing bounded, and the whole exchange (send included) within the
    request's timeout.

    Errors (defined in :mod:`sidecar.http.exchanges`, exported here)::

        AppClientError
         ├── AppNotReachable     the connection could not be opened (refused, no socket file,
         │                       connect timeout): the request never left, NOT an attempt
         └── AppRequestFailed    the request was sent and then failed: an attempt. ``class_name``:
                                 sidecar.AppTimeout         no complete answer within the timeout
                                 sidecar.AppConnectionLost  reset or EOF before a complete answer
                                 sidecar.MalformedResponse  not HTTP/1.x, or over the size caps
                                                            (head + trailers, body, chunk framing)

    Stale keep-alive connections: a server may close an idle connection at any moment. The pool
    drops an idle connection as soon as its EOF arrives; one closed while a request is being sent on
    it is learnt of when that request gets EOF or a reset before any response byte. Such a failure on
    a *reused* connection is retried once on a fresh connection. The request was sent, so the app
    could in principle have acted on it and then died without answering; we accept that rare
    duplicate (delivery is at-least-once anyway) rather than charge an attempt, and possibly a DLQ
    entry, for what is almost always our own stale socket. A failure on a fresh connection, any
    failure after a response byte, and a timeout are never retried here. Idle connections older than
    ``idle_timeout_s`` (below common server keep-alive timeouts of 5 s) are closed rather than reused,
    to keep that race rare.
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
        after_round: Callable[[], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.target = target
        self._host_header = target.host_header
        self._connect_timeout_s = connect_timeout_s
        self._status_mapping = dict(status_mapping or {})
        self._route_statuses = route_missing_statuses(self._status_mapping)
        self._slots = trio.Semaphore(max_connections)
        self._closed = False
        self.pool = Exchanges(
            self._open,
            max_body_bytes=max_body_bytes,
            idle_timeout_s=idle_timeout_s,
            after_round=after_round,
            on_error=on_error,
        )

    @property
    def connections_opened(self) -> int:
        return self.pool.connections_opened

    async def __aenter__(self) -> AppClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every connection; requests still in flight are dropped."""
        self._closed = True
        self.pool.close()
        await trio.lowlevel.checkpoint()

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

    # ------------------------------------------------------------------------- started requests

    def _single_request(self, record: RecordView) -> bytes:
        t = self.target
        return format_single_request(
            record, self._host_header, t.path, t.extra_headers, t.cloudevents
        )

    def start_single(
        self, record: RecordView, timeout_s: float, done: Callable[[Answer | AppNotReachable], None]
    ) -> Exchange:
        """Push one record in single mode; ``done`` gets its answer (a request that was sent and
        failed is a release carrying the sidecar's error class) or :class:`AppNotReachable`
        (:class:`AppRouteMissing` when the app says it has no such route)."""
        mapping = self._status_mapping
        route_statuses = self._route_statuses

        def answered(result: Result) -> None:
            if isinstance(result, RawResponse):
                if result.status in route_statuses and route_missing(
                    result.status, result.headers, result.body, mapping
                ):
                    done(AppRouteMissing(self.target.url(), result.status))
                    return
                done(interpret_single(result.status, result.headers, result.body, mapping))
            elif isinstance(result, AppRequestFailed):
                done(_failed_answer(result))
            else:
                assert isinstance(result, AppNotReachable)
                done(result)

        return self.pool.start(self._single_request(record), timeout_s, answered)

    def start_batch(
        self,
        records: Sequence[RecordView],
        timeout_s: float,
        done: Callable[[dict[str, Answer] | AppNotReachable], None],
    ) -> Exchange:
        """Push records in batch mode; ``done`` gets one :class:`Answer` per delivery id (see
        ``start_single``) or :class:`AppNotReachable`."""
        t = self.target
        request = format_batch_request(
            records, self._host_header, t.path, t.extra_headers, t.cloudevents
        )
        ids = [record.delivery_id for record in records]
        mapping = self._status_mapping
        route_statuses = self._route_statuses

        def answered(result: Result) -> None:
            if isinstance(result, RawResponse):
                if result.status in route_statuses and route_missing(
                    result.status, result.headers, result.body, mapping, batch=True
                ):
                    done(AppRouteMissing(self.target.url(), result.status))
                    return
                done(interpret_batch(result.status, result.headers, result.body, ids, mapping))
            elif isinstance(result, AppRequestFailed):
                done(dict.fromkeys(ids, _failed_answer(result)))
            else:
                assert isinstance(result, AppNotReachable)
                done(result)

        return self.pool.start(request, timeout_s, answered)

    # ------------------------------------------------------------------------- awaited requests

    async def _awaited(self, start: Callable[[Callable[[R], None]], Exchange]) -> R:
        """Start a request with ``start(done)`` and wait for what ``done`` gets, at most
        ``max_connections`` at once (the request is abandoned if the caller is cancelled)."""
        if self._closed:
            raise RuntimeError("AppClient is closed")
        async with self._slots:
            box: list[R] = []
            finished = trio.Event()

            def done(result: R) -> None:
                box.append(result)
                finished.set()

            exchange = start(done)
            try:
                await finished.wait()
            except BaseException:
                self.pool.abandon(exchange)
                raise
            return box[0]

    async def send(self, request: bytes, timeout_s: float) -> RawResponse:
        """Send one complete request (from :mod:`sidecar.core.wire`) and return the response.

        ``timeout_s`` bounds the exchange after the connection is open; opening has its own
        ``connect_timeout_s``. Raises :class:`AppNotReachable` or :class:`AppRequestFailed`.
        """
        result: Result = await self._awaited(lambda done: self.pool.start(request, timeout_s, done))
        if isinstance(result, RawResponse):
            return result
        raise result

    async def deliver(self, record: RecordView, timeout_s: float) -> Answer:
        """Push one record in single mode and interpret the answer.

        A request that was sent and failed becomes a release carrying the sidecar's error
        class (it was an attempt); :class:`AppNotReachable` propagates (it was not).
        """
        answer: Answer | AppNotReachable = await self._awaited(
            lambda done: self.start_single(record, timeout_s, done)
        )
        if isinstance(answer, AppNotReachable):
            raise answer
        return answer

    async def deliver_batch(
        self, records: Sequence[RecordView], timeout_s: float
    ) -> dict[str, Answer]:
        """Push records in batch mode; one :class:`Answer` per delivery id (see deliver)."""
        answers: dict[str, Answer] | AppNotReachable = await self._awaited(
            lambda done: self.start_batch(records, timeout_s, done)
        )
        if isinstance(answers, AppNotReachable):
            raise answers
        return answers


def _failed_answer(exc: AppRequestFailed) -> Answer:
    """A request that was sent and failed: a release with the sidecar's error class."""
    return Answer("release", AppError(exc.class_name, exc.message), reason=exc.message)
