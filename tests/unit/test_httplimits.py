"""sidecar.http.limits: the head/trailer budget holds for every segmentation of the same bytes."""

from __future__ import annotations

import itertools

import httptools
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.http.limits import SLICE_BYTES, LimitExceeded, MeteredCollector

LIMIT = 64 * 1024


class Collector(MeteredCollector):
    __slots__ = ("messages",)

    def __init__(self) -> None:
        super().__init__(LIMIT, LIMIT)
        self.messages = 0

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.messages += 1


def feed(data: bytes, cuts: list[int]) -> Collector:
    collector = Collector()
    parser = httptools.HttpRequestParser(collector)
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for a, b in itertools.pairwise(points):
        if b > a:
            collector.feed(parser, data[a:b])
    return collector


def head_of(size: int) -> bytes:
    """A GET whose header block is exactly ``size`` bytes (request line to the blank line)."""
    start, end = b"GET / HTTP/1.1\r\nX-Pad: ", b"\r\n\r\n"
    return start + b"p" * (size - len(start) - len(end)) + end


CUTS = st.lists(st.integers(0, 200_000), max_size=8)


@settings(max_examples=200, deadline=None)
@given(cuts=CUTS)
def test_a_head_within_the_limit_passes_however_it_is_cut(cuts: list[int]) -> None:
    # Over-counting is bounded by one slice: a head up to LIMIT - SLICE_BYTES always passes.
    assert feed(head_of(LIMIT - SLICE_BYTES), cuts).messages == 1


@settings(max_examples=200, deadline=None)
@given(cuts=CUTS, extra=st.integers(1, 70_000))
def test_a_head_over_the_limit_fails_however_it_is_cut(cuts: list[int], extra: int) -> None:
    with pytest.raises(LimitExceeded) as caught:
        feed(head_of(LIMIT + extra), cuts)
    assert caught.value.what == "head"


@settings(max_examples=100, deadline=None)
@given(cuts=CUTS, trailer_bytes=st.integers(LIMIT + 1, 200_000))
def test_trailers_share_the_head_budget(cuts: list[int], trailer_bytes: int) -> None:
    head = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n"
    trailer = b"X-T: " + b"t" * (trailer_bytes - 7) + b"\r\n\r\n"
    with pytest.raises(LimitExceeded):
        feed(head + trailer, cuts)


@settings(max_examples=100, deadline=None)
@given(cuts=CUTS, count=st.integers(1, 400))
def test_pipelined_requests_are_each_charged_their_own_head(cuts: list[int], count: int) -> None:
    one = b"POST /p HTTP/1.1\r\nContent-Length: 3\r\nX-Pad: " + b"p" * 500 + b"\r\n\r\nabc"
    assert feed(one * count, cuts).messages == count


@settings(max_examples=100, deadline=None)
@given(cuts=CUTS, sizes=st.lists(st.integers(1, 300), min_size=1, max_size=300))
def test_many_small_chunks_are_not_a_framing_overflow(cuts: list[int], sizes: list[int]) -> None:
    chunks = b"".join(b"%x\r\n%s\r\n" % (n, b"c" * n) for n in sizes)
    data = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    assert feed(data, cuts).messages == 1


def test_an_endless_chunk_extension_is_a_framing_overflow() -> None:
    data = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=" + b"e" * 100_000
    with pytest.raises(LimitExceeded) as caught:
        feed(data, [])
    assert caught.value.what == "framing"
