"""The fixture broker is a real Kafka: records come back byte-exact and in per-partition order."""

from __future__ import annotations

import random

from tests.kafkatools import Broker, Rec


def _records(n: int) -> list[Rec]:
    rng = random.Random(42)
    out: list[Rec] = []
    for i in range(n):
        kind = i % 10
        key: bytes | None
        if kind == 0:
            key = None
        elif kind == 1:
            key = b""
        elif kind == 2:
            key = bytes(rng.randrange(256) for _ in range(8))  # binary, usually not UTF-8
        else:
            key = f"key-{i % 37}".encode()
        value: bytes | None
        if i % 7 == 0:
            value = None
        elif i % 7 == 1:
            value = b""
        else:
            value = f"value-{i}-".encode() + bytes(
                rng.randrange(256) for _ in range(rng.randrange(64))
            )
        headers: tuple[tuple[str, bytes | None], ...] = (
            ("seq", str(i).encode()),
            ("bin", b"\xff\xfe\x00\x80"),  # not UTF-8
            ("rep", b"first"),
            ("rep", b"second"),  # repeated name, order matters
            ("null", None),
        )
        out.append(Rec(key=key, value=value, headers=headers, partition=i % 3))
    return out


def test_thousand_records_round_trip_byte_exact(broker: Broker, unique: str) -> None:
    topic = broker.create_topic(f"rt-{unique}", partitions=3)
    sent = _records(1000)
    assert broker.produce(topic, sent) == 1000

    got = broker.read_topic(topic, expected=1000)
    assert len(got) == 1000

    by_seq = {}
    for rec in got:
        seq = int(dict((k, v) for k, v in rec.headers if k == "seq")["seq"] or b"-1")
        by_seq[seq] = rec
    assert sorted(by_seq) == list(range(1000))
    for i, want in enumerate(sent):
        have = by_seq[i]
        assert have.key == want.key, i
        assert have.value == want.value, i  # None stays None, b"" stays b""
        assert have.headers == want.headers, i  # byte-exact, order and repeats kept
        assert have.partition == want.partition

    # Per-partition order: offsets increase with the sequence number within each partition.
    for p in range(3):
        seqs = [
            int(dict(r.headers)["seq"] or b"0")
            for r in sorted(got, key=lambda r: r.offset or 0)
            if r.partition == p
        ]
        assert seqs == sorted(seqs)
        assert len(seqs) == len([s for s in sent if s.partition == p])
