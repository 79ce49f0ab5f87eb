"""CommitState and its offset-metadata codec: round trips, budgets, and hostile input."""

from __future__ import annotations

import base64
import random
import re
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.commitstate import (
    DEFAULT_MAX_ENTRIES,
    MAGIC,
    MAGIC_V2,
    MAX_OFFSET,
    CommitState,
    CommitStateError,
    chars_for_payload,
    decode,
    encode,
    encoded_length,
    parse,
    payload_bound,
)

ASCII_SAFE = re.compile(r"^dlq[12]:[A-Za-z0-9_-]*$")
BIG = 10**9


def roundtrip(state: CommitState, budget: int = 10**9) -> CommitState:
    text = encode(state, budget)
    assert text is not None
    assert ASCII_SAFE.match(text), text
    decoded = decode(text)
    assert decoded is not None
    return decoded


def uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


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


@pytest.mark.parametrize(
    ("horizon", "charged", "counts", "message"),
    [
        (8, None, {}, "horizon 8 below base"),
        (MAX_OFFSET + 1, None, {}, "horizon"),
        (None, 12, {12: 1}, "needs a horizon"),
        (20, 12, {}, "needs a count"),
        (11, 12, {12: 1}, "at or below the horizon"),
    ],
)
def test_invalid_version_2_states_are_rejected(
    horizon: int | None, charged: int | None, counts: dict[int, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        CommitState(10, (), counts, horizon, charged)


def test_version_follows_the_horizon() -> None:
    assert CommitState(10).version == 1
    assert CommitState(10, horizon=9).version == 2  # a horizon below the base: no suspects
    assert encode(CommitState(10), 100) == decode_v1_literal_state_text(10)
    text = encode(CommitState(10, horizon=9), 100)
    assert text is not None and text.startswith(MAGIC_V2)


def decode_v1_literal_state_text(base: int) -> str:
    return valid_body(uvarint(base) + b"\x00\x00")


def test_truncated_keeps_the_horizon_and_the_charged_count() -> None:
    state = CommitState(0, ((2, 5), (8, 9)), {0: 1, 6: 3, 10: 2}, horizon=12, charged=10)
    assert state.truncated(4) == CommitState(0, ((2, 4),), {0: 1, 10: 2}, 12, 10)


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
    with_horizon = CommitState(
        state.base_offset, state.done, state.counts, horizon=state.base_offset - 1
    )
    assert roundtrip(with_horizon) == with_horizon


@pytest.mark.parametrize(
    "state",
    [
        CommitState(0, horizon=-1),
        CommitState(0, horizon=0),
        CommitState(5, (), {5: 1}, horizon=5, charged=5),
        CommitState(100, ((102, 105), (110, 111)), {100: 2, 101: 1, 107: 4}, 2000, 107),
        CommitState(MAX_OFFSET, (), {MAX_OFFSET: 9}, MAX_OFFSET, MAX_OFFSET),
        CommitState(3, (), {3: 10**6, 2**40: 1}, 2**40, 2**40),
    ],
)
def test_version_2_roundtrip_examples(state: CommitState) -> None:
    text = encode(state, BIG)
    assert text is not None and text.startswith(MAGIC_V2)
    assert decode(text) == state
    assert len(text) <= chars_for_payload(payload_bound(state))


def test_version_1_metadata_written_before_version_2_still_decodes() -> None:
    # Written by main before version 2 existed: the bytes of version 1 did not change either.
    old = "dlq1:AGQCCg4CAwAAAQAAAAUAA6d_yNU"
    state = CommitState(100, ((102, 105), (110, 111)), {100: 2, 101: 1, 107: 4})
    assert decode(old) == state
    assert decode(old) is not None and decode(old).horizon is None  # type: ignore[union-attr]
    assert encode(state, 4096) == old


def test_version_2_literal() -> None:
    text = "dlq2:AGQVAQcDAgoOAgMAAAEAAAAFAANBedGz"
    state = CommitState(100, ((102, 105), (110, 111)), {100: 2, 101: 1, 107: 4}, 120, 107)
    assert decode(text) == state
    assert encode(state, 4096) == text


def test_a_prefix_encoding_never_drops_the_horizon_or_the_charged_count() -> None:
    rng = random.Random(5)
    counts = {1000 + 2 * i: rng.randint(1, 200) for i in range(400)}
    state = CommitState(1000, (), counts, horizon=5000, charged=1798)
    text = encode(state, 200)
    assert text is not None and len(text) <= 200
    decoded = decode(text)
    assert decoded is not None
    assert decoded.horizon == 5000 and decoded.charged == 1798
    assert decoded.count(1798) == counts[1798]
    assert len(decoded.counts) < len(counts)  # truncated indeed
    # The smallest v2 state with the largest values fits the smallest budget the ledger accepts.
    tiny = CommitState(MAX_OFFSET - 1, (), {MAX_OFFSET: 2**20}, MAX_OFFSET, MAX_OFFSET)
    assert encode(tiny, 64) is not None


def test_a_charged_count_that_disagrees_with_the_counts_is_corrupt() -> None:
    header = uvarint(5) + uvarint(10) + b"\x01" + uvarint(1) + uvarint(2)  # charged 6: count 3
    assert decode(valid_body(header + b"\x00" + b"\x01\x01\x00\x02", MAGIC_V2)) == CommitState(
        5, (), {6: 3}, 14, 6
    )
    assert decode(valid_body(header + b"\x00" + b"\x01\x01\x00\x00", MAGIC_V2)) is None
    assert decode(valid_body(header + b"\x00\x00", MAGIC_V2)) == CommitState(5, (), {6: 3}, 14, 6)
    bad_kind = uvarint(5) + uvarint(10) + b"\x02"
    with pytest.raises(CommitStateError, match="charged kind"):
        parse(valid_body(bad_kind + b"\x00\x00", MAGIC_V2))
    # A charged offset above the horizon is not a valid state.
    above = uvarint(5) + uvarint(1) + b"\x01" + uvarint(3) + uvarint(0)
    assert decode(valid_body(above + b"\x00\x00", MAGIC_V2)) is None


# -- decoding bounds (issue 20) ------------------------------------------------------------------


def alternating_bitset_bomb() -> str:
    """Issue 20's finding: about 1,400 characters that inflate to 4.19 million done ranges."""
    nbytes = (1 << 20) - 16
    payload = b"\x00\x02" + uvarint(nbytes * 8) + b"\x55" * nbytes + b"\x00"
    return valid_body(payload, packed=True)


def test_a_small_string_that_inflates_to_millions_of_ranges_is_corrupt() -> None:
    bomb = alternating_bitset_bomb()
    assert len(bomb) < 1500  # within Kafka's default offset.metadata.max.bytes of 4096
    assert decode(bomb) is None  # before the bound: a state of 4,194,240 done ranges
    with pytest.raises(CommitStateError, match="bitset of 8388480 bits"):
        parse(bomb)


def test_decoding_bounds_ranges_counts_and_bitset_bits() -> None:
    n = DEFAULT_MAX_ENTRIES
    # Run-length ranges: n + 1 single-offset ranges one apart.
    rle = b"\x00\x01" + uvarint(n + 1) + b"\x01\x00" * (n + 1) + b"\x00"
    with pytest.raises(CommitStateError, match=f"{n + 1} done ranges"):
        parse(valid_body(rle, packed=True))
    ok = b"\x00\x01" + uvarint(n) + b"\x01\x00" * n + b"\x00"
    assert len(parse(valid_body(ok, packed=True)).done) == n
    # Counts: one run of n + 1 offsets.
    run = b"\x00\x00\x01\x00" + uvarint(n) + b"\x00"
    with pytest.raises(CommitStateError, match="counted offsets"):
        parse(valid_body(run))
    assert len(parse(valid_body(b"\x00\x00\x01\x00" + uvarint(n - 1) + b"\x00")).counts) == n
    # A bitset within the bit bound but with too many ranges.
    nbytes = n // 4 + 8  # four ranges a byte
    bits = b"\x00\x02" + uvarint(nbytes * 8) + b"\x55" * nbytes + b"\x00"
    with pytest.raises(CommitStateError, match="more than 65536 done ranges"):
        parse(valid_body(bits, packed=True))
    # The caller's own bound.
    assert decode(valid_body(ok, packed=True), max_entries=n - 1) is None
    small = CommitState(0, ((2, 3), (4, 5), (6, 7)), {0: 1, 1: 1})
    text = encode(small, BIG)
    assert text is not None
    assert decode(text, max_entries=3) == small
    assert decode(text, max_entries=2) is None


def test_a_sparse_bitset_decodes_quickly_and_exactly() -> None:
    # Long runs of whole 0x00 / 0xFF bytes take the fast path; the edges are bit-exact.
    bits = bytearray(b"\x00" * 5000 + b"\xff" * 3000 + b"\x0f" + b"\x00" * 10 + b"\xf0")
    nbits = len(bits) * 8 - 3  # the last byte's top three bits fall outside
    payload = b"\x00\x02" + uvarint(nbits) + bytes(bits) + b"\x00"
    state = parse(valid_body(payload, packed=True))
    assert state.done == ((40001, 64005), (64093, 64094 + 0))

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


def valid_body(payload: bytes, magic: str = MAGIC, *, packed: bool = False) -> str:
    inner = payload + zlib.crc32(payload).to_bytes(4, "big")
    body = b"\x01" + zlib.compress(inner, 9) if packed else b"\x00" + inner
    return magic + base64.urlsafe_b64encode(body).rstrip(b"=").decode()


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


@st.composite
def states_v2(draw: st.DrawFn) -> CommitState:
    state = draw(states())
    top = max([e for _, e in state.done] + [o + 1 for o in state.counts] + [state.base_offset])
    horizon = min(
        MAX_OFFSET, state.base_offset - 1 + draw(st.integers(0, top - state.base_offset + 60))
    )
    chargeable = [o for o in state.counts if o <= horizon]
    charged = draw(st.sampled_from([None, *chargeable]))
    return CommitState(state.base_offset, state.done, state.counts, horizon, charged)


@settings(max_examples=150, deadline=None)
@given(states_v2(), st.integers(40, 400))
def test_version_2_roundtrip_and_prefix_property(state: CommitState, budget: int) -> None:
    text = encode(state, BIG)
    assert text is not None and text.startswith(MAGIC_V2)
    assert decode(text) == state
    assert len(text) <= chars_for_payload(payload_bound(state))
    fitted = encode(state, budget)
    if fitted is None:
        return
    assert len(fitted) <= budget
    decoded = decode(fitted)
    assert decoded is not None
    assert decoded.horizon == state.horizon and decoded.charged == state.charged
    if state.charged is not None:
        assert decoded.count(state.charged) == state.count(state.charged)
    kept = [o for o in decoded.counts if o != state.charged]
    cut = max([e for _, e in decoded.done] + [o + 1 for o in kept] + [0])
    assert decoded == state.truncated(cut)
