"""The app's commonest answer read without a general HTTP parser: one whole response, one buffer.

Owns :func:`simple_response`, which recognises one narrow form and returns ``None`` for anything
else (then the caller's general parser reads the same bytes): it never refuses, never decides an
edge case.

Pure: no sockets, no clock; standard library only (compiled with the rest of `sidecar.core`).
"""

from __future__ import annotations

__all__ = ["SimpleResponse", "simple_response"]

SimpleResponse = tuple[int, list[tuple[bytes, bytes]], bytes]

# RFC 9110's token characters (a header name), and what a field value or reason phrase may hold
# here: visible ASCII, space and tab. `bytes.translate(None, allowed)` deletes the allowed ones,
# so anything left over is a byte this fast path does not take.
_TOKEN = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_FIELD = bytes(range(0x20, 0x7F)) + b"\t"
# Headers whose meaning is the general parser's to apply (framing, keep-alive, upgrades).
_GENERAL = frozenset(
    (b"transfer-encoding", b"connection", b"proxy-connection", b"upgrade", b"keep-alive")
)
_MAX_LENGTH_DIGITS = 15


def simple_response(data: bytes, max_head_bytes: int, max_body_bytes: int) -> SimpleResponse | None:
    """``(status, headers, body)`` when ``data`` is exactly one response of the narrow form above,
    its header block (the blank line included) at most ``max_head_bytes`` and its body at most
    ``max_body_bytes``; header names lower-cased, values without their leading blanks, in
    arrival order. ``None`` otherwise: the general parser decides.

    Why a narrow form: almost every answer an app gives fits one read and one narrow form: ``HTTP/1.1``, a final status
    with a body (200 to 599 but 204 and 304), a single ``Content-Length``, plain header lines, and
    exactly that many body bytes after the header block. :func:`simple_response` recognises that form
    and returns the response; for anything else it returns ``None``, and the caller parses the same
    bytes with its general parser (httptools under the byte budgets of :mod:`sidecar.http.limits`,
    in :mod:`sidecar.http.exchanges`), which accepts, waits for more or refuses them.
    So this function never refuses anything and never decides an edge case: interim and
    bodiless statuses, chunked or EOF-delimited bodies, ``Connection`` (keep-alive rules), obs-fold,
    bytes outside visible ASCII, a header block near its budget, an incomplete or a pipelined
    response all go the general way. What it accepts the general parser reads to the same status,
    lower-cased headers and body, with the connection kept alive (``tests/unit/test_http_response.py``
    checks that against httptools, property-based).
    """
    if not data.startswith(b"HTTP/1.1 "):
        return None
    end = data.find(b"\r\n\r\n", 0, max_head_bytes)
    if end < 0 or end + 4 > max_head_bytes:
        return None
    lines = data[:end].split(b"\r\n")
    status_line = lines[0]
    code = status_line[9:12]
    if len(code) != 3 or not code.isdigit():
        return None
    if len(status_line) > 12 and (
        status_line[12:13] != b" " or status_line[13:].translate(None, _FIELD)
    ):
        return None
    status = int(code)
    if status < 200 or status > 599 or status in (204, 304):
        return None
    headers: list[tuple[bytes, bytes]] = []
    length = -1
    for line in lines[1:]:
        colon = line.find(b":")
        if colon <= 0:
            return None
        name = line[:colon]
        if name.translate(None, _TOKEN):
            return None
        value = line[colon + 1 :].lstrip(b" \t")
        if value.translate(None, _FIELD) or value.endswith((b" ", b"\t")):
            return None
        lowered = name.lower()
        if lowered == b"content-length":
            if length >= 0 or not value.isdigit() or len(value) > _MAX_LENGTH_DIGITS:
                return None
            length = int(value)
        elif lowered in _GENERAL:
            return None
        headers.append((lowered, value))
    start = end + 4
    if length < 0 or length > max_body_bytes or len(data) - start != length:
        return None
    return status, headers, data[start:]
