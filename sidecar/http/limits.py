"""Byte budgets for HTTP/1.1 header blocks, trailers and chunk framing, over httptools (llhttp).

Owns `MeteredCollector`, which counts the bytes fed to the parser per phase of the message (why
and how: its docstring), and `LimitExceeded`. Shared by `sidecar.http.server` and
`sidecar.http.appclient`.

Sans-IO: no sockets, no clock. Must not import other ``sidecar`` modules.
"""

from __future__ import annotations

import contextlib
from typing import Protocol

from sidecar.core.errors import SidecarError

__all__ = ["CHUNK_FRAMING_BYTES", "SLICE_BYTES", "LimitExceeded", "MeteredCollector"]

SLICE_BYTES = 1024
CHUNK_FRAMING_BYTES = 256

_IDLE, _HEAD, _BODY, _FRAMING, _CHUNK_START = range(5)
_HEADISH = (_IDLE, _HEAD, _CHUNK_START)


class LimitExceeded(SidecarError):
    """A message's head (header block plus trailers) or its chunk framing is over its budget."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"{what} over {limit} bytes")
        self.what = what  # "head" or "framing"
        self.limit = limit


class _Parser(Protocol):
    def feed_data(self, data: bytes) -> None: ...


class MeteredCollector:
    """Base of an httptools protocol object that keeps the byte budgets.

    It also keeps the message's body, up to ``max_body_bytes``: past that, ``too_large`` is set
    and the rest is dropped (the caller answers or gives up). Subclasses that define a callback
    call this class's version first (``super().on_body(b)``). Feed data through :meth:`feed`,
    never through the parser directly.

    Why limits cannot be checked in the header callbacks alone: httptools hands a header name or
    value over only once it is complete and buffers the pieces until then, and it reports chunked
    *trailers* through the same callbacks as headers. One endless header value, or endless trailers,
    would grow memory without ever reaching a callback. So the bytes fed to the parser are counted,
    per phase of the message the parser is in::

        IDLE         between messages (stray CRLFs count towards the next message's head)
        HEAD         from a message's first byte until its header block is complete
        BODY         body bytes (the caller counts them against its own body limit)
        FRAMING      chunk-size lines and the CRLF after each chunk's data
        CHUNK_START  right after a chunk-size line: the last (zero-size) chunk's trailers follow here

    A message's head and its trailers share one budget, ``max_head_bytes``; chunk framing may take
    :data:`CHUNK_FRAMING_BYTES` per chunk. Outside a body, data is fed in slices of at most
    :data:`SLICE_BYTES`, so a phase change (or the boundary between pipelined messages) inside one
    slice over-counts a message by less than a slice and never under-counts it; a content-length
    body is fed whole, up to its last byte, so the next pipelined message starts a fresh slice.
    """

    __slots__ = (
        "_body_bytes",
        "_chunked",
        "_chunks",
        "_completed",
        "_content_length",
        "_framing_bytes",
        "_head_bytes",
        "_in_message",
        "_phase",
        "_slice_body",
        "_touched_head",
        "body",
        "max_body_bytes",
        "max_head_bytes",
        "too_large",
    )

    def __init__(self, max_head_bytes: int, max_body_bytes: int) -> None:
        self.max_head_bytes = max_head_bytes
        self.max_body_bytes = max_body_bytes
        self.body = bytearray()
        self.too_large = False
        self._phase = _IDLE
        self._head_bytes = 0
        self._framing_bytes = 0
        self._chunks = 0
        self._chunked = False
        self._content_length = -1
        self._body_bytes = 0
        self._in_message = False
        self._completed = 0
        self._slice_body = 0
        self._touched_head = False

    # httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._phase = _HEAD
        self._in_message = True
        self._touched_head = True
        self._chunks = 0
        self._chunked = False
        self._content_length = -1
        self._body_bytes = 0
        self._framing_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._phase == _HEAD and len(name) == 14 and name.lower() == b"content-length":
            # llhttp has already refused a malformed or conflicting Content-Length.
            with contextlib.suppress(ValueError):
                self._content_length = int(value)

    def on_headers_complete(self) -> None:
        self._phase = _BODY

    def on_body(self, body: bytes) -> None:
        self._slice_body += len(body)
        self._body_bytes += len(body)
        self._phase = _BODY
        if len(self.body) + len(body) > self.max_body_bytes:
            self.too_large = True
        elif not self.too_large:
            self.body += body

    def on_chunk_header(self) -> None:
        self._phase = _CHUNK_START
        self._chunked = True
        self._chunks += 1
        self._touched_head = True

    def on_chunk_complete(self) -> None:
        self._phase = _FRAMING

    def on_message_complete(self) -> None:
        self._phase = _IDLE
        self._in_message = False
        self._completed += 1

    # feeding -----------------------------------------------------------------------------------

    @property
    def body_bytes(self) -> int:
        """Body bytes of the current message so far (chunk data without its framing)."""
        return self._body_bytes

    @property
    def in_message(self) -> bool:
        """True while a message has begun and is not complete, or bytes of the next one wait."""
        return self._in_message or self._head_bytes > 0

    def feed(self, parser: _Parser, data: bytes) -> None:
        """Feed ``data`` to ``parser``; raises :class:`LimitExceeded` (and httptools' errors)."""
        offset, end = 0, len(data)
        while offset < end:
            if self._phase == _BODY and not self._chunked:
                if self._content_length >= 0:
                    step = max(1, min(end - offset, self._content_length - self._body_bytes))
                else:
                    step = end - offset  # a response body delimited by EOF
            else:
                step = min(SLICE_BYTES, end - offset)
            piece = data if step == end else data[offset : offset + step]
            offset += step
            start_phase = self._phase
            self._slice_body = 0
            self._completed = 0
            self._touched_head = False
            parser.feed_data(piece)
            self._account(start_phase, len(piece) - self._slice_body)

    def _account(self, start_phase: int, non_body: int) -> None:
        headish = start_phase in _HEADISH or self._touched_head
        if self._completed:
            finished = self._head_bytes + (non_body if headish else 0)
            if finished > self.max_head_bytes:
                raise LimitExceeded("head", self.max_head_bytes)
            # Whatever of this slice belongs to a message that began after the completion is
            # unknown: count all of it (an over-count of less than one slice).
            self._head_bytes = non_body if (self._in_message and headish) else 0
            self._framing_bytes = 0
        elif headish:
            self._head_bytes += non_body
        else:
            self._framing_bytes += non_body
        if self._head_bytes > self.max_head_bytes:
            raise LimitExceeded("head", self.max_head_bytes)
        if self._framing_bytes > CHUNK_FRAMING_BYTES * max(self._chunks, 1) + SLICE_BYTES:
            raise LimitExceeded("framing", CHUNK_FRAMING_BYTES)
