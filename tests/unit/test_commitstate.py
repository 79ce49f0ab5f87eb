"""CommitState and its offset-metadata codec: round trips, budgets, and hostile input."""

from __future__ import annotations

import base64
import random
import re
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.commitstate import (
    MAGIC,
    MAX_OFFSET,
    CommitState,
    chars_for_payload,
    decode,
    encode,
    encoded_length,
    payload_bound,
)

ASCII_SAFE = re.compile(r"^dlq1:[A-Za-z0-9_-]*$")
BIG = 10**9


def roundtrip(state: CommitState, budget: int = 10**9) -> CommitState:
    text = encode(state, budget)
    assert text is not None
    assert ASCII_SAFE.match(text), text
    decoded = decode(text)
    assert decoded is not None
    return decoded


def body_flag(text: str) -> int:
    raw = text[len(MAGIC) :]
    return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))[0]


# -- the value -----------------------------------------------------------------------------------


def test_is_done_and_count() -> None:
    state = CommitState(100, ((102, 105), (110, 111)), {100: 2, 101: 1, 107: 4})
    assert [o for o in range(98, 113) if state.is_done(o)] == [98, 99, 102, 103, 104, 110]
    assert state.count(100) == 2
    assert state.count(107) == 4
    assert state.count(108) == 0
    assert list(state.done_offsets()) == [102, 103, 104, 110]


def test_counts_are_sorted_and_read_only() -> None:
    state = CommitState(5, (), {9: 1, 6: 2})
    assert list(state.counts) == [6, 9]
    with pytest.raises(TypeError):
        state.counts[7] = 1  # type: ignore[index]


@pytest.mark.parametrize(
    ("base", "done", "counts", "message"),
    [
        (-1, (), {}, "base_offset"),
        (MAX_OFFSET + 1, (), {}, "base_offset"),
        (10, ((10, 12),), {}, "above the base"),
        (10, ((12, 14), (13, 15)), {}, "disjoint"),
        (10, ((12, 14), (14, 15)), {}, "non-adjacent"),
        (10, ((14, 16), (12, 13)), {}, "sorted"),
        (10, ((12, 12),), {}, "bad done range"),
        (10, ((12, MAX_OFFSET + 2),), {}, "bad done range"),
        (10, (), {9: 1}, "below base"),
        (10, (), {11: 0}, "delivery count"),
        (10, ((12, 14),), {13: 1}, "marked done"),
        (10, (), {MAX_OFFSET + 1: 1}, "below base"),
    ],
)
def test_invalid_states_are_rejected(
    base: int, done: tuple[tuple[int, int], ...], counts: dict[int, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        CommitState(base, done, counts)


def test_truncated_keeps_the_low_offsets() -> None:
    state = CommitState(0, ((2, 5), (8, 9)), {0: 1, 6: 3, 10: 2})
    assert state.truncated(4) == CommitState(0, ((2, 4),), {0: 1})
    assert state.truncated(7) == CommitState(0, ((2, 5),), {0: 1, 6: 3})


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "state",
    [
        CommitState(0),
        CommitState(12345),
        CommitState(7, ((8, 9),)),
        CommitState(7, ((8, 1000),), {7: 5}),
        CommitState(100, ((102, 105), (110, 111)), {100: 2, 101: 1, 107: 4}),
        CommitState(MAX_OFFSET),
        CommitState(MAX_OFFSET, (), {MAX_OFFSET: 9}),
        CommitState(MAX_OFFSET - 10, ((MAX_OFFSET - 5, MAX_OFFSET + 1),), {MAX_OFFSET - 10: 1}),
        CommitState(0, ((1, MAX_OFFSET + 1),)),
        CommitState(3, (), {3: 10**6, 2**40: 1}),
    ],
)
def test_roundtrip_examples(state: CommitState) -> None:
    assert roundtrip(state) == state


def test_fragmented_done_marks_pick_the_bitset() -> None:
    # Every third offset done: run-length needs two varints per range, a bitset 3 bits.
    done = tuple((1000 + 3 * i, 1001 + 3 * i) for i in range(1, 400))
    state = CommitState(1000, done)
    text = encode(state, BIG)
    assert text is not None
    assert decode(text) == state
    raw = text[len(MAGIC) :]
    body = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))
    payload = body[1:-4] if body[0] == 0 else zlib.decompress(body[1:])[:-4]
    assert payload[len(b"\xe8\x07")] == 2  # done section kind: bitset


def test_regular_state_is_compressed() -> None:
    done = tuple((10 * i, 10 * i + 5) for i in range(1, 500))
    state = CommitState(0, done, {10 * i + 7: 1 for i in range(1, 500)})
    text = encode(state, BIG)
    assert text is not None
    assert body_flag(text) == 1  # zlib won
    assert decode(text) == state
    assert len(text) < payload_bound(state)


def test_records_in_flight_together_cost_one_count_run() -> None:
    state = CommitState(10**12, (), {10**12 + i: 1 for i in range(2000)})
    assert payload_bound(state) < 16
    assert roundtrip(state) == state


def test_payload_bound_bounds_the_encoding() -> None:
    state = CommitState(
        MAX_OFFSET - 10**6,
        ((MAX_OFFSET - 999_000, MAX_OFFSET - 998_000),),
        {
            MAX_OFFSET - 10**6: 3,
            MAX_OFFSET - 5: 200,
        },
    )
    assert encoded_length(state) <= chars_for_payload(payload_bound(state))


# -- budgets -------------------------------------------------------------------------------------


def big_state() -> CommitState:
    rng = random.Random(7)  # irregular, so zlib cannot make it small
    done: list[tuple[int, int]] = []
    counts: dict[int, int] = {}
    position = 5001
    for _ in range(3000):
        counts[position] = rng.randint(1, 100)
        start = position + rng.randint(1, 30)
        end = start + rng.randint(1, 30)
        done.append((start, end))
        position = end + 1
    return CommitState(5000, tuple(done), counts)


def test_over_budget_gives_a_fitting_prefix() -> None:
    state = big_state()
    assert encoded_length(state) > 1000
    text = encode(state, 1000)
    assert text is not None
    assert len(text) <= 1000
    decoded = decode(text)
    assert decoded is not None
    assert decoded.base_offset == state.base_offset
    # A prefix: exactly the original below some cut, nothing above it.
    cut = max([e for _, e in decoded.done] + [o + 1 for o in decoded.counts])
    assert decoded == state.truncated(cut)
    assert cut > 5000 + 7 * 20  # and not a trivially short one


def test_budget_too_small_for_anything() -> None:
    assert encode(CommitState(MAX_OFFSET), 8) is None
    assert encode(CommitState(1), 16) is not None


# -- hostile input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "metadata",
    [
        "",
        "hello",
        "dlq1:",
        "dlq1:A",
        "dlq1:!!!!",
        "dlq1:AAAA AAAA",
        "dlq2:AAAAAAAAAAAA",
        "DLQ1:AAAAAAAAAAAA",
        "dlq1:" + base64.urlsafe_b64encode(b"\x07garbage").decode(),
        "dlq1:" + base64.urlsafe_b64encode(b"\x01not zlib at all").decode(),
        "dlq1:" + base64.urlsafe_b64encode(b"\x00\x05\x00\x00" + b"\x00" * 4).decode(),
        "dlq1:" + base64.urlsafe_b64encode(b"\x01" + zlib.compress(b"\x00" * 10**6)).decode(),
    ],
)
def test_foreign_or_corrupt_metadata_decodes_to_none(metadata: str) -> None:
    assert decode(metadata) is None


def valid_body(payload: bytes) -> str:
    inner = payload + zlib.crc32(payload).to_bytes(4, "big")
    return MAGIC + base64.urlsafe_b64encode(b"\x00" + inner).rstrip(b"=").decode()


def test_checksummed_but_invalid_payloads_decode_to_none() -> None:
    assert decode(valid_body(b"\x05\x00\x00")) == CommitState(5)  # the control case
    assert decode(valid_body(b"\x05\x00\x00\x00")) is None  # trailing byte
    assert decode(valid_body(b"\x05\x09\x00")) is None  # unknown done kind
    rle = b"\x01\x01\x00\x01"  # one done range: (6, 8)
    assert decode(valid_body(b"\x05" + rle + b"\x01\x00\x00\x00")) == CommitState(
        5, ((6, 8),), {5: 1}
    )
    assert decode(valid_body(b"\x05" + rle + b"\x01\x02\x00\x00")) is None  # count on done
    # A run of 2**21 counts: a decompression bomb of another kind.
    assert decode(valid_body(b"\x05\x00\x01\x00\x80\x80\x80\x01\x00")) is None
    # Offsets beyond int64: base 2**63 as a varint.
    varint = bytes([0x80] * 9 + [0x01])
    assert decode(valid_body(varint + b"\x00\x00")) is None
    assert decode(valid_body(bytes([0xFF] * 11) + b"\x00\x00")) is None  # endless varint


def test_every_single_character_corruption_is_detected() -> None:
    state = CommitState(123_456, ((123_460, 123_470), (123_480, 123_481)), {123_456: 3, 123_475: 1})
    text = encode(state, BIG)
    assert text is not None
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i in range(len(MAGIC), len(text)):
        for replacement in ("A", "z", "-"):
            if text[i] == replacement:
                continue
            corrupted = text[:i] + replacement + text[i + 1 :]
            result = decode(corrupted)
            assert result is None or result == state, (i, replacement)
            # Only a change confined to unused padding bits may decode to the same state.
            if result is not None:
                assert i == len(text) - 1 and replacement in alphabet
    assert decode(text[:-1]) is None


# -- properties ----------------------------------------------------------------------------------


@st.composite
def states(draw: st.DrawFn) -> CommitState:
    base = draw(st.one_of(st.integers(0, 10**6), st.integers(MAX_OFFSET - 10**6, MAX_OFFSET)))
    gaps = draw(st.lists(st.tuples(st.integers(1, 50), st.integers(1, 50)), max_size=40))
    done: list[tuple[int, int]] = []
    counts: dict[int, int] = {}
    position = base + 1
    for i, (gap, length) in enumerate(gaps):
        start = position + (gap if i else gap - 1)
        end = start + length
        if end > MAX_OFFSET + 1:
            break
        for offset in range(position - (0 if i else 1), start):
            if draw(st.booleans()):
                counts[offset] = draw(st.integers(1, 300))
        done.append((start, end))
        position = end + 1
    if draw(st.booleans()) and position <= MAX_OFFSET:
        counts[position] = draw(st.integers(1, 3))
    return CommitState(base, tuple(done), counts)


@settings(max_examples=150, deadline=None)
@given(states())
def test_roundtrip_property(state: CommitState) -> None:
    text = encode(state, BIG)
    assert text is not None
    assert ASCII_SAFE.match(text)
    assert decode(text) == state
    assert len(text) <= chars_for_payload(payload_bound(state))


@settings(max_examples=100, deadline=None)
@given(states(), st.integers(16, 400))
def test_budgeted_encoding_is_a_prefix_that_fits(state: CommitState, budget: int) -> None:
    text = encode(state, budget)
    if text is None:
        assert encoded_length(CommitState(state.base_offset)) > budget
        return
    assert len(text) <= budget
    decoded = decode(text)
    assert decoded is not None
    cut = max([e for _, e in decoded.done] + [o + 1 for o in decoded.counts] + [0])
    assert decoded == state.truncated(cut)
    if encoded_length(state) <= budget:
        assert decoded == state


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_decode_never_raises_on_text(text: str) -> None:
    result = decode(text)
    assert result is None or isinstance(result, CommitState)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_decode_never_raises_on_bytes(raw: bytes) -> None:
    result = decode(MAGIC + base64.urlsafe_b64encode(raw).rstrip(b"=").decode())
    assert result is None or isinstance(result, CommitState)
