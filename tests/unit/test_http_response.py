"""The app client's fast path for a whole answer in one buffer (`sidecar.core.http_response`)
against the general parser it stands in for (httptools under the byte budgets, as
`sidecar.http.exchanges` reads a response): whatever the fast path accepts, the general parser
reads to the same status, headers and body, complete and kept alive; and the answers apps
actually give take the fast path."""

from __future__ import annotations

import httptools
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sidecar.core.http_response import simple_response
from sidecar.http.exchanges import _QUICK_HEAD_BYTES, _ResponseCollector

MAX_BODY = 1 << 20
FAST_HEAD = _QUICK_HEAD_BYTES  # what the app client passes


def general(data: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool] | None:
    """What the general path makes of ``data`` as one read: (status, headers, body, reusable),
    or None when it refuses the bytes or waits for more."""
    collector = _ResponseCollector(MAX_BODY)
    parser = httptools.HttpResponseParser(collector)
    collector.parser = parser
    try:
        collector.feed(parser, data)
    except Exception:
        return None
    if not collector.complete or collector.too_large:
        return None
    reusable = collector.keep_alive and not collector.extra_message
    return collector.status, collector.headers, bytes(collector.body), reusable


COMMON = [
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 2\r\nContent-Length: 0\r\n\r\n",
    b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{"result": "accept"}',
    b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 10:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-type: application/json\r\ncontent-length: 2\r\n\r\n{}",
    b"HTTP/1.1 500\r\nContent-Length: 5\r\n\r\noops!",
]


@pytest.mark.parametrize("data", COMMON)
def test_the_answers_apps_give_take_the_fast_path_and_read_as_the_general_parser_reads_them(
    data: bytes,
) -> None:
    fast = simple_response(data, FAST_HEAD, MAX_BODY)
    assert fast is not None
    assert (*fast, True) == general(data)


@pytest.mark.parametrize(
    "data",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc",  # incomplete: more to read
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\n",  # pipelined bytes
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: 1\r\n b\r\nContent-Length: 0\r\n\r\n",  # obs-fold
        b"HTTP/1.1 200 OK\r\nX-A: \xc3\xa9\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
        b"HTTP/1.1 200 OK\r\n\r\nbody until EOF",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n" + b"x" * 3,
    ],
)
def test_everything_else_goes_the_general_way(data: bytes) -> None:
    assert simple_response(data, FAST_HEAD, MAX_BODY) is None


def test_budgets_send_a_response_near_them_the_general_way() -> None:
    big_head = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * FAST_HEAD + b"\r\nContent-Length: 0\r\n\r\n"
    assert simple_response(big_head, FAST_HEAD, MAX_BODY) is None
    body = b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world"
    assert simple_response(body, FAST_HEAD, 10) is None
    assert simple_response(body, FAST_HEAD, 11) is not None


# Pieces that are mostly the narrow form, each with its deviations mixed in now and then (a
# strategy repeated in `one_of` is drawn more often).
_NAME_BYTES = b"abcXYZ-_09!~ :\t\x00\x7f\xe9"
_VALUE_BYTES = b"abc XYZ 09,;=\"'\t\x00\x01\x7f\x80\xff\r\n:"
_good_names = st.sampled_from([b"Content-Type", b"Retry-After", b"X-A", b"date", b"Server"])
_odd_names = st.sampled_from([b"Connection", b"content-length", b"Transfer-Encoding", b"Upgrade"])
_noise_names = st.binary(max_size=8).map(
    lambda b: bytes(_NAME_BYTES[x % len(_NAME_BYTES)] for x in b)
)
names = st.one_of(_good_names, _good_names, _good_names, _good_names, _odd_names, _noise_names)
_good_values = st.sampled_from([b"application/json", b"0", b"2", b"text/plain; charset=utf-8", b""])
_odd_values = st.sampled_from([b" 1", b"1 ", b"+1", b"close", b"chunked", b"a\tb", b"\t"])
_noise_values = st.binary(max_size=10).map(
    lambda b: bytes(_VALUE_BYTES[x % len(_VALUE_BYTES)] for x in b)
)
values = st.one_of(_good_values, _good_values, _good_values, _odd_values, _noise_values)
separators = st.sampled_from([b": "] * 6 + [b":", b":\t", b" : ", b":  ", b": \t"])
line_ends = st.sampled_from([b"\r\n"] * 12 + [b"\n", b"\r"])


@st.composite
def responses(draw: st.DrawFn) -> bytes:
    version = draw(st.sampled_from([b"HTTP/1.1"] * 6 + [b"HTTP/1.0", b"HTTP/2", b"http/1.1"]))
    good_status = st.sampled_from([b"200", b"201", b"422", b"503", b"599"])
    odd_status = st.sampled_from([b"204", b"304", b"101", b"199", b"600", b"99", b"2000", b"20x"])
    status = draw(st.one_of(good_status, good_status, good_status, odd_status))
    reason = draw(
        st.sampled_from([b" OK"] * 4 + [b"", b" ", b" Bad\tThing", b" \x00", b" \xe9", b"OK"])
    )
    end = draw(line_ends)
    body = draw(st.binary(max_size=40))
    headers = draw(st.lists(st.tuples(names, separators, values), max_size=4))
    length = draw(
        st.sampled_from(
            [b"%d" % len(body)] * 6 + [b"%d" % (len(body) + 1), b"x", b"0%d" % len(body)]
        )
    )
    lines = [version + b" " + status + reason]
    lines += [n + s + v for n, s, v in headers]
    if draw(st.sampled_from([True] * 6 + [False])):
        lines.insert(draw(st.integers(1, len(lines))), b"Content-Length: " + length)
    extra = draw(st.sampled_from([b""] * 6 + [b"\r\n", b"HTTP/1.1 200 OK\r\n\r\n"]))
    return end.join(lines) + end + draw(line_ends) + body + extra


@settings(max_examples=3000, deadline=None)
@given(responses())
@example(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
@example(b"HTTP/1.1 200\r\nX-A:\r\nContent-Length: 1\r\n\r\nz")
def test_what_the_fast_path_accepts_the_general_parser_reads_the_same(data: bytes) -> None:
    fast = simple_response(data, FAST_HEAD, MAX_BODY)
    if fast is not None:
        assert (*fast, True) == general(data)


@settings(max_examples=500, deadline=None)
@given(
    st.sampled_from([200, 201, 400, 422, 500, 503]),
    st.lists(
        st.tuples(
            st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).map(str.encode),
            st.text("abcdefghijklmnopqrstuvwxyz0123456789 ;=/,", min_size=0, max_size=20).map(
                lambda s: s.strip().encode()
            ),
        ).filter(
            lambda nv: (
                nv[0]
                not in (
                    b"content-length",
                    b"connection",
                    b"upgrade",
                    b"keep-alive",
                    b"transfer-encoding",
                    b"proxy-connection",
                )
            )
        ),
        max_size=6,
    ),
    st.binary(max_size=200),
)
def test_a_plain_answer_takes_the_fast_path(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    head = b"HTTP/1.1 %d Whatever\r\n" % status
    head += b"".join(n + b": " + v + b"\r\n" for n, v in headers)
    data = head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    fast = simple_response(data, FAST_HEAD, MAX_BODY)
    assert fast == (status, [*headers, (b"content-length", b"%d" % len(body))], body)
    assert general(data) == (*fast, True)
