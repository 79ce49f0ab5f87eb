"""Per-partition delivery state beyond the committed offset, and its offset-metadata codec.

Owns :class:`CommitState` (what must survive a restart or a rebalance: the offsets above the
committed one already done, and the delivery counts of records not yet done) and the string codec
that stores it in the offset commit's metadata (``offset.metadata.max.bytes``); the byte grammar
is drawn in `CommitState`'s docstring.

Pure: must not import trio, confluent_kafka or anything doing I/O.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from sidecar.core.errors import SidecarError

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "MAGIC",
    "MAGIC_V2",
    "MAX_OFFSET",
    "CommitState",
    "CommitStateError",
    "chars_for_payload",
    "decode",
    "encode",
    "encoded_length",
    "parse",
    "payload_bound",
]

MAGIC = "dlq1:"
MAGIC_V2 = "dlq2:"
#: Kafka offsets are signed 64-bit integers.
MAX_OFFSET = 2**63 - 1
# A decoded payload larger than this is not ours (4096 characters of base64 inflate to far less);
# the bound keeps a hostile or corrupt zlib stream from allocating gigabytes.
_MAX_INFLATED = 1 << 20

#: Decoding bound (done ranges, and counted offsets, each): a ledger holds at most
#: ``max_buffered_records`` records (default 10,000), so it never writes more than one more range
#: than that, nor more counts.  Decoding 65,536 entries takes tens of milliseconds.
DEFAULT_MAX_ENTRIES = 1 << 16

_FLAG_RAW = 0
_FLAG_ZLIB = 1
_DONE_NONE = 0
_DONE_RLE = 1
_DONE_BITSET = 2


def _empty_counts() -> Mapping[int, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class CommitState:
    """What a partition's commit must carry besides the offset itself.

    - ``base_offset``: the committed offset, i.e. the lowest offset that is not done.
    - ``done``: sorted, disjoint, non-adjacent half-open ranges ``(start, end)`` of offsets above
      ``base_offset`` that are done (acknowledged, or archived with the DLQ write confirmed).
    - ``counts``: delivery counts (>= 1) of records at or above ``base_offset`` that are not done.
    - ``horizon`` (version 2; None in version 1): every not-done offset above it was never handed
      out; at least ``base_offset - 1``.
    - ``charged`` (version 2): the offset whose count was written ahead of an isolated delivery;
      it has a count and is at or below the horizon.

    Wire format, version 1 (written in write-ahead mode)::

        "dlq1:" + base64url-without-padding( flag byte | body )
        flag 0x00: body = payload | crc32(payload) (4 bytes, big-endian)
        flag 0x01: body = zlib(payload | crc32(payload))
        payload   = uvarint(base_offset) | done section | counts section
        done      = 0x00                                    (no done ranges)
                  | 0x01 uvarint(n) n * (uvarint(gap) uvarint(length - 1))          (run-length)
                  | 0x02 uvarint(nbits) bytes                                        (bitset)
        counts    = uvarint(n) n * (uvarint(gap) uvarint(length - 1) uvarint(count - 1))

    Version 2 (horizon mode, see :mod:`sidecar.core.ledger.horizon`) adds a fixed header after the base; the framing,
    the checksum and the two sections are version 1's::

        "dlq2:" + base64url-without-padding( flag byte | body )       (flag and body as in version 1)
        payload   = uvarint(base_offset) | uvarint(horizon - base_offset + 1) | charged
                    | done section | counts section
        charged   = 0x00                                                  (no isolation charge)
                  | 0x01 uvarint(offset - base_offset) uvarint(count - 1)

    Done ranges are relative to ``base_offset + 1``; a run-length range starts ``gap`` offsets after the
    end of the previous one.  Bit ``i`` (little-endian within each byte) of a bitset means offset
    ``base_offset + 1 + i`` is done.  Counts are runs of consecutive offsets with the same delivery
    count (records in flight together usually are), each starting ``gap`` offsets after the end of the
    previous run (the first after ``base_offset``).  The encoder writes whichever of run-length or
    bitset is smaller, then keeps the zlib form only when it is smaller still (Confluent Parallel
    Consumer makes the same choice between run-length, bitset and compression).

    The *horizon* (version 2) says "every offset above it that is not done was never handed out since
    these counts were written"; offsets at or below it that are not done may have been delivered and
    their answers lost (see the ledger's crash accounting).  The *charged* entry is the one count that
    was written ahead of an isolated delivery: it lives in the header so that a prefix encoding (see
    :func:`encode`) can never drop it, and the decoder merges it into the counts.

    Done ranges may cover offsets that never existed (compaction gaps, transaction markers): marking a
    non-existent offset done is harmless, and it keeps the ranges few.
    """

    base_offset: int
    done: tuple[tuple[int, int], ...] = ()
    counts: Mapping[int, int] = field(default_factory=_empty_counts)
    horizon: int | None = None
    charged: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.base_offset <= MAX_OFFSET:
            raise ValueError(f"base_offset out of range: {self.base_offset}")
        # The first range may start right above the base; later ones must leave a gap after
        # the previous range (adjacent ranges would have been one).
        lowest_start = self.base_offset + 1
        for start, end in self.done:
            if start < lowest_start:
                raise ValueError(
                    f"done ranges must be sorted, disjoint, non-adjacent and above the base "
                    f"offset {self.base_offset}: {self.done!r}"
                )
            if end <= start or end > MAX_OFFSET + 1:
                raise ValueError(f"bad done range ({start}, {end})")
            lowest_start = end + 1
        frozen = dict(sorted(self.counts.items()))
        for offset, count in frozen.items():
            if not self.base_offset <= offset <= MAX_OFFSET:
                raise ValueError(f"count for offset {offset} below base {self.base_offset}")
            if count < 1:
                raise ValueError(f"delivery count must be >= 1, got {count} for offset {offset}")
            if self._in_done(offset):
                raise ValueError(f"offset {offset} has a delivery count but is marked done")
        object.__setattr__(self, "counts", MappingProxyType(frozen))
        if self.horizon is not None and not self.base_offset - 1 <= self.horizon <= MAX_OFFSET:
            raise ValueError(f"horizon {self.horizon} below base {self.base_offset} - 1")
        if self.charged is not None:
            if self.horizon is None:
                raise ValueError("a charged count needs a horizon (version 2)")
            if self.charged not in frozen or self.charged > self.horizon:
                raise ValueError(
                    f"charged offset {self.charged} needs a count and must be at or below "
                    f"the horizon {self.horizon}"
                )

    @property
    def version(self) -> int:
        """The metadata version that carries this state: 2 with a horizon, else 1."""
        return 1 if self.horizon is None else 2

    def _in_done(self, offset: int) -> bool:
        i = bisect.bisect_right(self.done, (offset, MAX_OFFSET + 2)) - 1
        return i >= 0 and self.done[i][0] <= offset < self.done[i][1]

    def is_done(self, offset: int) -> bool:
        """True when the record at ``offset`` must not be delivered again."""
        return offset < self.base_offset or self._in_done(offset)

    def count(self, offset: int) -> int:
        """The persisted delivery count of ``offset`` (0 when none was recorded)."""
        return self.counts.get(offset, 0)

    def done_offsets(self) -> Iterator[int]:
        """Every offset above the base covered by a done range (may be many: test helper)."""
        for start, end in self.done:
            yield from range(start, end)

    def truncated(self, cut: int) -> CommitState:
        """The state restricted to offsets below ``cut``: what a prefix encoding keeps.

        The horizon and the charged count are kept whatever ``cut`` is (they are in the header).
        """
        done = tuple((s, min(e, cut)) for s, e in self.done if s < cut)
        counts = {o: c for o, c in self.counts.items() if o < cut or o == self.charged}
        return CommitState(self.base_offset, done, counts, self.horizon, self.charged)


# -- varints -------------------------------------------------------------------------------------


def _put_uvarint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _uvarint_len(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def uvarint(self) -> int:
        result = 0
        shift = 0
        while True:
            byte = self.data[self.pos]  # IndexError on truncation: caught by decode()
            self.pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
            if shift > 63:  # 10 bytes hold any int64; longer is corruption
                raise ValueError("varint too long")

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("truncated")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk


# -- encoder -------------------------------------------------------------------------------------


def _rle(base: int, done: tuple[tuple[int, int], ...]) -> bytes:
    out = bytearray((_DONE_RLE,))
    _put_uvarint(out, len(done))
    previous_end = base + 1
    for start, end in done:
        _put_uvarint(out, start - previous_end)
        _put_uvarint(out, end - start - 1)
        previous_end = end
    return bytes(out)


def _bitset(base: int, done: tuple[tuple[int, int], ...], limit: int) -> bytes | None:
    """The bitset form, or None when it would not be shorter than ``limit`` bytes."""
    nbits = done[-1][1] - (base + 1)
    if nbits // 8 + 1 >= limit:
        return None
    bits = bytearray((nbits + 7) // 8)
    # Bounded work: nbits < 8 * limit, and limit is the run-length size (small).
    for start, end in done:
        for rel in range(start - base - 1, end - base - 1):
            bits[rel >> 3] |= 1 << (rel & 7)
    out = bytearray((_DONE_BITSET,))
    _put_uvarint(out, nbits)
    out += bits
    return bytes(out)


def _put_header(out: bytearray, state: CommitState) -> None:
    """Base offset, and in version 2 the horizon and the charged count."""
    base = state.base_offset
    _put_uvarint(out, base)
    if state.horizon is None:
        return
    _put_uvarint(out, state.horizon - base + 1)
    if state.charged is None:
        out.append(0)
    else:
        out.append(1)
        _put_uvarint(out, state.charged - base)
        _put_uvarint(out, state.counts[state.charged] - 1)


def _payload(state: CommitState) -> bytes:
    out = bytearray()
    _put_header(out, state)
    if state.done:
        rle = _rle(state.base_offset, state.done)
        bitset = _bitset(state.base_offset, state.done, len(rle))
        out += rle if bitset is None or len(bitset) >= len(rle) else bitset
    else:
        out.append(_DONE_NONE)
    _put_counts(out, state)
    return bytes(out)


def _put_counts(out: bytearray, state: CommitState) -> None:
    runs: list[list[int]] = []  # [start, length, count]
    for offset, count in state.counts.items():  # sorted by construction
        if runs and runs[-1][0] + runs[-1][1] == offset and runs[-1][2] == count:
            runs[-1][1] += 1
        else:
            runs.append([offset, 1, count])
    _put_uvarint(out, len(runs))
    previous_end = state.base_offset
    for start, length, count in runs:
        _put_uvarint(out, start - previous_end)
        _put_uvarint(out, length - 1)
        _put_uvarint(out, count - 1)
        previous_end = start + length


def _encode_full(state: CommitState) -> str:
    payload = _payload(state)
    inner = payload + zlib.crc32(payload).to_bytes(4, "big")
    packed = zlib.compress(inner, 9)
    body = (
        bytes((_FLAG_ZLIB,)) + packed if len(packed) < len(inner) else bytes((_FLAG_RAW,)) + inner
    )
    magic = MAGIC if state.horizon is None else MAGIC_V2
    return magic + base64.urlsafe_b64encode(body).rstrip(b"=").decode("ascii")


def payload_bound(state: CommitState) -> int:
    """An upper bound, in bytes, of the binary payload: its size with run-length done ranges.

    The ledger tracks how much each change can grow this bound, so it can tell cheaply that the
    metadata is still far from ``offset.metadata.max.bytes`` without encoding on every change.
    """
    rle = _rle(state.base_offset, state.done) if state.done else b"\x00"
    header = bytearray()
    _put_header(header, state)
    counts = bytearray()
    _put_counts(counts, state)
    return len(header) + len(rle) + len(counts)


def chars_for_payload(payload_bytes: int) -> int:
    """Upper bound of the encoded length for a payload of ``payload_bytes`` (flag, CRC, base64)."""
    body = 1 + payload_bytes + 4
    return len(MAGIC) + (4 * body + 2) // 3  # both magics are 5 characters


def encoded_length(state: CommitState) -> int:
    """Length in characters (= bytes, it is ASCII) of the full encoding of ``state``."""
    return len(_encode_full(state))


def encode(state: CommitState, budget_bytes: int) -> str | None:
    """Encode ``state`` in at most ``budget_bytes`` ASCII characters.

    When the whole state does not fit, the result is a *prefix* encoding: the done ranges and
    counts of the lowest offsets, as many as fit, and nothing about higher offsets.  That is safe
    for at-least-once delivery (a dropped done mark means a redelivery, a dropped count restarts at
    zero) but it does lose information, so the ledger pauses intake well before this happens.
    Returns None only when not even the base offset fits (a budget of a dozen characters).
    """
    full = _encode_full(state)
    if len(full) <= budget_bytes:
        return full
    # Items in offset order; a prefix of k items is kept.  Size is not strictly monotone in k
    # (zlib, bitset choice), so the binary search finds a fitting prefix, not always the longest.
    items: list[tuple[int, int]] = sorted(
        [(s, 0) for s, _ in state.done] + [(o, 1) for o in state.counts if o != state.charged]
    )

    def prefix(k: int) -> CommitState:
        cut = items[k][0] if k < len(items) else MAX_OFFSET + 1
        return state.truncated(cut)

    best = _encode_full(prefix(0))
    if len(best) > budget_bytes:
        return None
    low, high = 0, len(items)  # prefix(low) fits, prefix(high) does not
    while high - low > 1:
        mid = (low + high) // 2
        candidate = _encode_full(prefix(mid))
        if len(candidate) <= budget_bytes:
            low, best = mid, candidate
        else:
            high = mid
    return best


# -- decoder -------------------------------------------------------------------------------------


class CommitStateError(SidecarError, ValueError):
    """The metadata is not a state this build can use: foreign, unknown version, corrupt, or over
    a decoding bound.  The message says which; the caller starts from the committed offset."""


def _decode_done(reader: _Reader, base: int, max_entries: int) -> tuple[tuple[int, int], ...]:
    kind = reader.take(1)[0]
    if kind == _DONE_NONE:
        return ()
    if kind == _DONE_RLE:
        n = reader.uvarint()
        if n > max_entries:
            raise CommitStateError(f"{n} done ranges, more than the bound {max_entries}")
        if n > len(reader.data):  # each range takes >= 2 bytes
            raise CommitStateError("truncated done ranges")
        ranges = []
        previous_end = base + 1
        for _ in range(n):
            start = previous_end + reader.uvarint()
            end = start + reader.uvarint() + 1
            ranges.append((start, end))
            previous_end = end
        return tuple(ranges)
    if kind == _DONE_BITSET:
        nbits = reader.uvarint()
        if nbits > 8 * max_entries:
            raise CommitStateError(f"a done bitset of {nbits} bits, over {8 * max_entries}")
        bits = reader.take((nbits + 7) // 8)
        ranges = []
        run_start = -1
        rel = 0
        while rel < nbits:
            byte = bits[rel >> 3]
            # Whole bytes that continue the current state cost one step, not eight.
            if rel & 7 == 0 and rel + 8 <= nbits and byte == (0xFF if run_start >= 0 else 0):
                rel += 8
                continue
            is_set = byte >> (rel & 7) & 1
            if is_set and run_start < 0:
                run_start = rel
            elif not is_set and run_start >= 0:
                ranges.append((base + 1 + run_start, base + 1 + rel))
                run_start = -1
                if len(ranges) > max_entries:
                    raise CommitStateError(f"more than {max_entries} done ranges")
            rel += 1
        if run_start >= 0:
            ranges.append((base + 1 + run_start, base + 1 + nbits))
        if len(ranges) > max_entries:
            raise CommitStateError(f"more than {max_entries} done ranges")
        return tuple(ranges)
    raise CommitStateError(f"unknown done encoding {kind}")


def _inner(text: str) -> bytes:
    """Base64, framing and checksum: the payload."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != text:
        # Non-canonical or non-alphabet characters were silently skipped.
        raise CommitStateError("not canonical base64url")
    if not raw:
        raise CommitStateError("empty body")
    if raw[0] == _FLAG_ZLIB:
        inflater = zlib.decompressobj()
        inner = inflater.decompress(raw[1:], _MAX_INFLATED)
        if inflater.unconsumed_tail or not inflater.eof or inflater.unused_data:
            raise CommitStateError("bad or over-large zlib stream")
    elif raw[0] == _FLAG_RAW:
        inner = raw[1:]
    else:
        raise CommitStateError(f"unknown body flag {raw[0]}")
    if len(inner) < 5:
        raise CommitStateError("truncated body")
    payload, crc = inner[:-4], inner[-4:]
    if zlib.crc32(payload).to_bytes(4, "big") != crc:
        raise CommitStateError("checksum mismatch")
    return payload


def _parse_payload(payload: bytes, version: int, max_entries: int) -> CommitState:
    reader = _Reader(payload)
    base = reader.uvarint()
    horizon: int | None = None
    charged: tuple[int, int] | None = None
    if version == 2:
        horizon = base - 1 + reader.uvarint()
        kind = reader.take(1)[0]
        if kind == 1:
            charged = (base + reader.uvarint(), reader.uvarint() + 1)
        elif kind != 0:
            raise CommitStateError(f"unknown charged kind {kind}")
    done = _decode_done(reader, base, max_entries)
    n = reader.uvarint()
    if n > len(payload):
        raise CommitStateError("truncated counts")
    counts: dict[int, int] = {}
    previous_end = base
    for _ in range(n):
        start = previous_end + reader.uvarint()
        length = reader.uvarint() + 1
        count = reader.uvarint() + 1
        if len(counts) + length > max_entries:
            raise CommitStateError(f"more than {max_entries} counted offsets")
        for offset in range(start, start + length):
            counts[offset] = count
        previous_end = start + length
    if reader.pos != len(payload):
        raise CommitStateError("trailing bytes")
    if charged is not None:
        offset, count = charged
        if counts.get(offset, count) != count:
            raise CommitStateError(f"charged count of {offset} disagrees with the counts")
        counts[offset] = count
    return CommitState(base, done, counts, horizon, None if charged is None else charged[0])


def parse(metadata: str, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> CommitState:
    """Decode metadata written by :func:`encode` (version 1 or 2), or raise CommitStateError.

    Raises for empty metadata, metadata written by something else, a version this build does not
    know, corrupt data (bad base64, bad zlib stream, CRC mismatch, trailing bytes, values out of
    range) and a state over the decoding bounds below.

    Decoding is bounded: at most ``max_entries`` done ranges, ``max_entries`` counted offsets and
    ``8 * max_entries`` bitset bits, 1 MiB inflated (a few kB of zlib can otherwise inflate to
    millions of ranges).  A state over a bound is corrupt: this raises saying which bound,
    :func:`decode` returns None, and the caller starts from the committed offset alone (redelivery,
    never loss).  The default bound is far above what a ledger with the default
    ``max.buffered.records.per.partition`` (10,000) ever writes; a caller with a larger buffer passes
    ``max_entries=2 * max_buffered_records + 2``.
    """
    if metadata.startswith(MAGIC):
        version = 1
    elif metadata.startswith(MAGIC_V2):
        version = 2
    else:
        raise CommitStateError("not written by this sidecar (no dlq1:/dlq2: prefix)")
    try:
        payload = _inner(metadata[len(MAGIC) :])
        return _parse_payload(payload, version, max_entries)
    except CommitStateError:
        raise
    except (ValueError, IndexError, zlib.error, binascii.Error, UnicodeError) as exc:
        raise CommitStateError(f"corrupt: {exc}") from exc


def decode(metadata: str, *, max_entries: int = DEFAULT_MAX_ENTRIES) -> CommitState | None:
    """:func:`parse`, but None instead of an error: never raises.

    The caller logs a warning naming the partition and starts from the committed offset alone,
    which redelivers but never loses a record.
    """
    try:
        return parse(metadata, max_entries=max_entries)
    except CommitStateError:
        return None
