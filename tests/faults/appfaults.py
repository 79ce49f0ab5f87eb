"""An app that can misbehave at the HTTP level: answer garbage, or take a request and never answer.

`sidecar.http.server` always frames a well-formed response, so the faulty app runs its own small HTTP/1.1
loop (requests parsed with httptools, as the real server does) and, per mode, either lets the `JournalApp`
answer (healthy: the same answers and journal lines as `AppServer`), writes broken bytes, or hangs.

What the sidecar must make of each garbage answer is docs/app-contract.md's: a request that
was sent and then failed is an attempt and a release, never an accept — except a 2xx whose body is not
declared JSON, which is an accept by its status. Every variant below carries that expected meaning (the word
the app journals) and the error class the sidecar reports for it (`sidecar/http/appclient.py`,
`sidecar/core/wire/answers.py`), which a DLQ record archived at the delivery limit names in
`__dlq.errors.exception.class.name`.
"""

from __future__ import annotations

import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any

import httptools
import trio

from sidecar.http.server import Request, Response
from tests.faults.workload import AppServer, Seen

HEALTHY, GARBAGE, HANG = "healthy", "garbage", "hang"
# The journal word of a delivery the app took and never answered (the sidecar's timeout decides).
HANG_ANSWER = "hang"
HANG_CLASS = "sidecar.AppTimeout"


@dataclass(frozen=True)
class Garbage:
    name: str
    data: bytes
    keep_alive: bool  # False: the app closes the connection right after writing `data`
    answer: str  # what the journal says the app answered (the contract's reading of `data`)
    error_class: str | None  # the sidecar's error class for it; None when it is an accept


def _http(ctype: str, body: bytes, *, length: int | None = None) -> bytes:
    """A 200 with `body`; `length` declares another Content-Length than the body has (a truncated answer)."""
    declared = len(body) if length is None else length
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        ctype.encode("ascii"),
        declared,
        body,
    )


GARBAGE_VARIANTS: tuple[Garbage, ...] = (
    # Not HTTP at all: the response parser fails on the status line.
    Garbage(
        "bad-status-line",
        b"HTTZ/1.1 2OO okay-ish\r\nwhatever\r\n\r\n",
        False,
        "garbage:bad-status-line",
        "sidecar.MalformedResponse",
    ),
    # A 200 declaring a JSON body that does not parse: a release, never an accept.
    Garbage(
        "json-not-json",
        _http("application/json", b"{ack: accept!}"),
        True,
        "garbage:json-not-json",
        "sidecar.MalformedAnswer",
    ),
    # A truncated answer: the header promises 64 bytes of body, 12 arrive, then the app closes.
    Garbage(
        "truncated-body",
        _http("application/json", b'{"ack":"acce', length=64),
        False,
        "garbage:truncated-body",
        "sidecar.AppConnectionLost",
    ),
    # The connection closed in the middle of the header block. (At least one byte is sent: a close before
    # any byte on a reused connection is taken for a stale keep-alive socket and resent once, by design.)
    Garbage(
        "closed-in-headers",
        b"HTTP/1.1 200 OK\r\nContent-Le",
        False,
        "garbage:closed-in-headers",
        "sidecar.AppConnectionLost",
    ),
    # A 200 whose body is neither JSON nor declared JSON: the status answers, so this IS an accept.
    Garbage("text-on-200", _http("text/plain", b"not json, but a 2xx"), True, "accept", None),
)
ERROR_CLASS_BY_ANSWER: dict[str, str] = {
    g.answer: g.error_class for g in GARBAGE_VARIANTS if g.error_class is not None
} | {HANG_ANSWER: HANG_CLASS}


def garbage_for(seen: Seen) -> Garbage:
    """The variant for one delivery: a hash of the record and its delivery count, so a record's attempts
    differ and every variant is, for some records, the last attempt before the limit (a plain rotation
    would make only the variants after the fixed accept one ever reach it)."""
    key = f"{seen.topic}:{seen.partition}:{seen.offset}:{seen.count}".encode()
    return GARBAGE_VARIANTS[zlib.crc32(key) % len(GARBAGE_VARIANTS)]


class _Requests:
    """httptools callbacks: complete requests queue up in `ready`."""

    def __init__(self) -> None:
        self.ready: deque[Request] = deque()
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._body: list[bytes] = []
        self.parser: Any = None

    def on_message_begin(self) -> None:
        self._url, self._headers, self._body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        path, _, query = self._url.decode("latin-1").partition("?")
        method = self.parser.get_method().decode("ascii")
        self.ready.append(Request(method, path, query, tuple(self._headers), b"".join(self._body)))


def _format(response: Response) -> bytes:
    head = [b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n" % (response.status, len(response.body))]
    head += [f"{n}: {v}\r\n".encode("latin-1") for n, v in response.headers]
    return b"".join(head) + b"\r\n" + response.body


class FaultyAppServer(AppServer):
    """`AppServer` whose app answers per `mode`: healthy, garbage (`GARBAGE_VARIANTS`) or hang.

    A hung request is never answered, also after the mode changes back: the app "lost" it, and only the
    sidecar's `app.timeout.ms` ends that attempt. The mode is read when a request arrives.
    """

    mode: str = HEALTHY

    async def _serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
            async with trio.open_nursery() as inner:
                await inner.start(trio.serve_listeners, self._connection, listeners)
                task_status.started(scope)

    async def _connection(self, stream: trio.SocketStream) -> None:
        requests = _Requests()
        parser = httptools.HttpRequestParser(requests)
        requests.parser = parser
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                parser.feed_data(data)
                while requests.ready:
                    if not await self._answer(stream, requests.ready.popleft()):
                        return
        except (trio.BrokenResourceError, trio.ClosedResourceError, httptools.HttpParserError):
            return
        finally:
            await trio.aclose_forcefully(stream)

    async def _answer(self, stream: trio.SocketStream, request: Request) -> bool:
        """Answer one request; False when the connection must end."""
        seen, _value = self.app.parse(request)
        mode = self.mode
        if mode == HANG:
            self.app.note(seen, HANG_ANSWER)
            # Read (and drop) until the sidecar gives up and closes: it must not get a byte back.
            while await stream.receive_some(65536):
                pass
            return False
        if mode == GARBAGE:
            garbage = garbage_for(seen)
            self.app.note(seen, garbage.answer)
            await stream.send_all(garbage.data)
            return garbage.keep_alive
        response = await self.app.respond(seen)
        await stream.send_all(_format(response))
        return True
