"""`dlq-sidecar dlq inspect` / `dlq replay` against the real broker, with DLQ records the real sidecar wrote."""

from __future__ import annotations

import argparse
import io
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import TopicPartition

from sidecar.http.server import Response, json_response
from sidecar.kafka.dlq import CAUSE_REJECTED, FailedRecord, build_dlq_record
from sidecar.ops.dlq.command import add_dlq_parser, cmd_dlq
from sidecar.ops.dlq.entries import H_REPLAY_COUNT, H_REPLAY_FROM, H_REPLAY_NAME, DlqEntry
from sidecar.ops.dlq.filters import Filters, parse_offset_range, parse_time
from sidecar.ops.dlq.replay import TokenBucket
from tests.harness import (
    Delivery,
    RecordingApp,
    running_sidecar,
)
from tests.harness import wait_until_thread as _wait_thread
from tests.kafkatools import Broker, Rec


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dlq-sidecar")
    add_dlq_parser(parser.add_subparsers(dest="command"))
    return parser


async def dlq_cli(broker: Broker, *argv: str) -> tuple[int, str, str]:
    """Run `dlq-sidecar dlq ARGV...` in-process (in a thread); return (exit code, stdout, stderr)."""
    args = _parser().parse_args(["dlq", argv[0], "--bootstrap", broker.bootstrap, *argv[1:]])
    out, err = io.StringIO(), io.StringIO()
    rc = await trio.to_thread.run_sync(cmd_dlq, args, out, err)
    return rc, out.getvalue(), err.getvalue()


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _strip_dlq(headers: list[tuple[str, bytes | None]]) -> list[tuple[str, bytes | None]]:
    return [(n, v) for n, v in headers if not n.startswith("__dlq.")]


def _header(headers: Any, name: str) -> bytes | None:
    values = [v for n, v in headers if n == name]
    assert len(values) == 1, (name, headers)
    return values[0]  # type: ignore[no-any-return]


class Switch:
    """The app's answer, changed by the test while the sidecar runs."""

    def __init__(self) -> None:
        self.accept = False

    def __call__(self, d: Delivery) -> Response:
        if self.accept:
            return Response(200)
        cls = (d.value or b"X:").split(b":")[0].decode()
        return json_response(
            {
                "ack": "reject",
                "error": {"class": f"com.example.{cls}", "message": f"bad {d.offset}"},
            }
        )


def _records(n: int, partitions: int, classes: tuple[str, ...] = ("A", "B")) -> list[Rec]:
    out = []
    for i in range(n):
        cls = classes[(i // partitions) % len(classes)]
        out.append(
            Rec(
                key=None if i % 17 == 3 else f"k{i % 13}".encode(),
                value=f"{cls}:{i}".encode(),
                headers=(
                    ("seq", str(i).encode()),
                    ("bin", b"\xff\x00"),
                    ("rep", b"a"),
                    ("rep", b"b"),
                ),
                partition=i % partitions,
            )
        )
    return out


async def test_inspect_filters_then_replay_one_class_to_the_source(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=2)
    dlq = f"dlq.{topic}"
    group = f"g-{unique}"
    originals = _records(200, 2)
    by_seq = {i: r for i, r in enumerate(originals)}
    switch = Switch()
    app = RecordingApp(policy=switch)
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=group,
        path="/",
        extra={"errors.deadletterqueue.copy.record.enable": True},
        produce_first=originals,
    ) as rig:
        sc = rig.sc
        await _wait_thread(lambda: broker.count_records(dlq) >= 200, 120, "200 DLQ records")

        # ---- inspect
        rc, out, err = await dlq_cli(broker, "inspect", "--topic", dlq, "--json")
        assert rc == 0, err
        rows = _json_lines(out)
        assert len(rows) == 200
        assert "200 matching of 200" in err
        classes = {r["exception_class"] for r in rows}
        assert classes == {"com.example.A", "com.example.B"}
        for r in rows:
            seq = int(next(h["value"]["text"] for h in r["headers"] if h["name"] == "seq"))
            orig = by_seq[seq]
            assert r["source_topic"] == topic
            assert (r["source_partition"], r["value"]["text"]) == (
                orig.partition,
                (orig.value or b"").decode(),
            )
            assert r["exception_message"] == f"bad {r['source_offset']}"
            assert r["delivery_count"] == 1
            assert r["headers_only"] is False and r["replay_count"] == 0
            assert next(h for h in r["headers"] if h["name"] == "bin")["value"] == {
                "base64": "/wA=",
                "size": 2,
            }

        async def count(*filters: str) -> int:
            rc, out, err = await dlq_cli(broker, "inspect", "--topic", dlq, "--json", *filters)
            assert rc == 0, err
            return len(_json_lines(out))

        assert await count("--exception-class", "com.example.A") == 100
        assert await count("--source-partition", "0") == 100
        assert await count("--source-partition", "0", "--exception-class", "com.example.B") == 50
        assert await count("--source-partition", "1", "--offset-range", "0-9") == 10
        assert await count("--offset-range", "95-") == 10
        assert await count("--source-topic", "other") == 0
        assert await count("--since", "1h") == 200
        assert await count("--until", "2000-01-01") == 0
        assert await count("--since", "2999-01-01T00:00:00Z") == 0

        rc, out, err = await dlq_cli(broker, "inspect", "--topic", dlq, "--json", "--limit", "5")
        assert rc == 0 and len(_json_lines(out)) == 5
        assert "200 matching of 200 records read; first 5 shown" in err

        rc, out, _ = await dlq_cli(broker, "inspect", "--topic", dlq, "--limit", "3")
        assert rc == 0
        assert "com.example.A" in out and "by exception class" in out
        assert re.search(r"\(\d+ B\)", out)  # payload preview with its size
        assert "by source topic" in out and "200 matching" in out

        for bad in (("--offset-range", "9-1"), ("--since", "yesterday")):
            rc, _, err = await dlq_cli(broker, "inspect", "--topic", dlq, *bad)
            assert rc == 2 and err.startswith("dlq-sidecar dlq: bad "), err
        with pytest.raises(SystemExit) as exited:
            await dlq_cli(broker, "inspect", "--topic", dlq, "--source-partition", "x")
        assert exited.value.code == 2
        rc, _, err = await dlq_cli(broker, "inspect", "--topic", f"nope-{unique}")
        assert rc == 2 and "does not exist" in err

        # ---- replay class A while the app now accepts
        switch.accept = True
        before = len(app.deliveries)
        rc, out, err = await dlq_cli(
            broker,
            "replay",
            "--from",
            dlq,
            "--name",
            "fix-a",
            "--exception-class",
            "com.example.A",
        )
        assert rc == 0, out + err
        assert "replayed 100 of 100 matching records (200 read" in out
        assert "filtered out by --exception-class: 100" in out

        def replayed() -> list[Delivery]:
            return [
                d for d in app.deliveries[before:] if any(n == H_REPLAY_NAME for n, _ in d.headers)
            ]

        await _wait_thread(lambda: len(replayed()) >= 100, 60, "100 replayed deliveries")
        ends = broker.end_offsets(topic, [0, 1])
        assert sum(ends.values()) == 300
        await _wait_thread(
            lambda: all(broker.committed(group, topic, [0, 1])[p][0] == ends[p] for p in (0, 1)),
            60,
            "the sidecar committed the replayed records (acknowledged)",
        )
        got = replayed()
        assert len(got) == 100
        dlq_offset_by_seq = {
            int(next(h["value"]["text"] for h in r["headers"] if h["name"] == "seq")): r[
                "dlq_offset"
            ]
            for r in rows
        }
        seen_seqs = set()
        for d in got:
            seq = int(_header(d.headers, "seq") or b"")
            orig = by_seq[seq]
            seen_seqs.add(seq)
            assert (orig.value or b"").startswith(b"A:")
            assert d.topic == topic and d.partition == orig.partition
            assert d.key == orig.key and d.value == orig.value
            assert _strip_dlq(d.headers) == list(orig.headers)  # byte-exact, order and repeats
            assert _header(d.headers, H_REPLAY_NAME) == b"fix-a"
            assert _header(d.headers, H_REPLAY_COUNT) == b"1"
            assert _header(d.headers, H_REPLAY_FROM) == f"{dlq}/0/{dlq_offset_by_seq[seq]}".encode()
            assert d.delivery_count == 1
            assert not any(n.startswith("__dlq.errors.") for n, _ in d.headers)
        assert len(seen_seqs) == 100
        st = await sc.status()
        assert st["counters"]["dlq_written"] == 200  # accepted: the DLQ is not written again
        assert broker.count_committed_records(dlq) == 200
        assert broker.committed("dlq-replay.fix-a", dlq, [0])[0][0] == 200

        # ---- the same name again: nothing new
        rc, out, err = await dlq_cli(
            broker,
            "replay",
            "--from",
            dlq,
            "--name",
            "fix-a",
            "--exception-class",
            "com.example.A",
        )
        assert rc == 0, out + err
        assert "replayed 0 of 0 matching records (0 read" in out
        assert sum(broker.end_offsets(topic, [0, 1]).values()) == 300

        # ---- the same name with another filter: refused, nothing written
        rc, out, err = await dlq_cli(
            broker,
            "replay",
            "--from",
            dlq,
            "--name",
            "fix-a",
            "--exception-class",
            "com.example.B",
        )
        assert rc == 2
        assert "was used with other filters" in err and "com.example.A" in err
        assert sum(broker.end_offsets(topic, [0, 1]).values()) == 300
        assert await sc.stop() == 0


async def test_headers_only_records_replay_from_the_source_and_report_deleted_offsets(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    dlq = f"dlq.{topic}"
    group = f"g-{unique}"
    originals = _records(10, 1, classes=("Bad",))
    switch = Switch()
    app = RecordingApp(policy=switch)
    async with running_sidecar(
        broker, tmp_path, app, topic=topic, group=group, path="/", produce_first=originals
    ) as rig:
        sc = rig.sc
        await _wait_thread(lambda: broker.count_records(dlq) >= 10, 60, "10 DLQ records")
        rc, out, _ = await dlq_cli(broker, "inspect", "--topic", dlq, "--json")
        rows = _json_lines(out)
        assert len(rows) == 10 and all(r["headers_only"] for r in rows)
        assert all(r["value"] is None and r["key"] is None for r in rows)

        # Retention took the first three source records.
        res = broker.admin.delete_records([TopicPartition(topic, 0, 3)])
        for fut in res.values():
            fut.result(timeout=30)
        switch.accept = True
        before = len(app.deliveries)

        # The DLQ holds the records in the order they were rejected, not in source order: the first
        # run replays those before the first lost one, stops that partition there and commits no further.
        by_dlq_offset = sorted(rows, key=lambda r: r["dlq_offset"])
        first_lost = next(r for r in by_dlq_offset if r["source_offset"] < 3)
        rc, out, err = await dlq_cli(broker, "replay", "--from", dlq, "--name", "h")
        assert rc == 1, out + err
        assert "UNRECOVERABLE (partition stopped here" in out
        assert (
            f"{dlq}/0/{first_lost['dlq_offset']} ({topic}[0]@{first_lost['source_offset']}): "
            f"payload gone: source offset {topic}[0]@{first_lost['source_offset']} was deleted "
            "(log start now 3;"
        ) in out
        n_first = first_lost["dlq_offset"]
        assert f"replayed {n_first} of {n_first + 1} matching" in out
        assert broker.end_offsets(topic, [0])[0] == 10 + n_first
        committed = broker.committed("dlq-replay.h", dlq, [0])[0][0]
        assert committed == (n_first if n_first else -1001)  # never past the lost record

        rc, out, err = await dlq_cli(
            broker, "replay", "--from", dlq, "--name", "h", "--skip-unrecoverable"
        )
        assert rc == 0, out + err
        assert f"replayed {7 - n_first} of {10 - n_first} matching" in out
        assert "unrecoverable, skipped: 3" in out
        for off in range(3):
            assert f"{topic}[0]@{off} was deleted (log start now 3;" in out
        assert broker.committed("dlq-replay.h", dlq, [0])[0][0] == 10
        assert broker.end_offsets(topic, [0])[0] == 17  # each recoverable record exactly once

        await _wait_thread(lambda: len(app.deliveries) - before >= 7, 60, "7 replayed records")
        got = app.deliveries[before:]
        assert sorted(int(_header(d.headers, "seq") or b"") for d in got) == list(range(3, 10))
        for d in got:
            orig = originals[int(_header(d.headers, "seq") or b"")]
            assert d.key == orig.key and d.value == orig.value
            assert _strip_dlq(d.headers) == list(orig.headers)
            assert _header(d.headers, H_REPLAY_COUNT) == b"1"

        rc, out, _ = await dlq_cli(
            broker, "replay", "--from", dlq, "--name", "h", "--skip-unrecoverable"
        )
        assert rc == 0 and "replayed 0 of 0 matching" in out
        # Once the sidecar committed the replayed records, any DLQ write for them is done.
        await _wait_thread(
            lambda: broker.committed(group, topic, [0])[0][0] == 17,
            60,
            "the sidecar committed the replayed records",
        )
        assert broker.count_committed_records(dlq) == 10  # accepted after the replay
        assert await sc.stop() == 0


async def test_headers_only_record_of_a_deleted_topic_is_unrecoverable(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    dlq = f"dlq.{topic}"
    app = RecordingApp(policy=lambda d: Response(422))
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        path="/",
        produce_first=_records(3, 1),
    ) as rig:
        sc = rig.sc
        await _wait_thread(lambda: broker.count_records(dlq) >= 3, 60, "3 DLQ records")
        assert await sc.stop() == 0
    await trio.to_thread.run_sync(broker.delete_topic, topic)
    await _wait_thread(lambda: not broker.topic_exists(topic), 30, "topic deleted")
    rc, out, err = await dlq_cli(broker, "replay", "--from", dlq, "--name", "gone", "--dry-run")
    assert rc == 1, out + err
    assert f"source topic {topic} does not exist" in out
    rc, out, err = await dlq_cli(
        broker, "replay", "--from", dlq, "--name", "gone", "--skip-unrecoverable"
    )
    assert rc == 0 and "unrecoverable, skipped: 3" in out
    assert not broker.topic_exists(topic)  # not re-created by the replay


async def test_dry_run_writes_nothing_and_rate_limit_paces(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=2)
    dlq = f"dlq.{topic}"
    app = RecordingApp(policy=lambda d: Response(400))
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        path="/",
        extra={"errors.deadletterqueue.copy.record.enable": True},
        produce_first=_records(100, 2),
    ) as rig:
        sc = rig.sc
        await _wait_thread(lambda: broker.count_records(dlq) >= 100, 60, "100 DLQ records")
        assert await sc.stop() == 0

    rc, out, err = await dlq_cli(broker, "replay", "--from", dlq, "--name", "paced", "--dry-run")
    assert rc == 0, out + err
    assert sum(line.startswith(f"would replay {dlq}/") for line in out.splitlines()) == 100
    assert "DRY RUN: would replay 100 of 100 matching" in out
    assert sum(broker.end_offsets(topic, [0, 1]).values()) == 100
    assert broker.committed("dlq-replay.paced", dlq, [0])[0][0] < 0

    started = time.monotonic()
    rc, out, err = await dlq_cli(broker, "replay", "--from", dlq, "--name", "paced", "--rate", "20")
    elapsed = time.monotonic() - started
    assert rc == 0, out + err
    assert "replayed 100 of 100 matching" in out
    assert elapsed >= 4.0, elapsed  # 100 records at 20/s; the rest is the CLI starting up
    replayed = [
        r
        for r in await trio.to_thread.run_sync(broker.read_topic, topic, 200)
        if r.offset is not None and r.offset >= 50
    ]
    assert len(replayed) == 100
    stamps = sorted(r.timestamp_ms or 0 for r in replayed)
    span_s = (stamps[-1] - stamps[0]) / 1000
    # 99 gaps at 20/s = 4.95 s; a loaded machine only adds wake-up delays to each gap.
    assert 4.0 <= span_s <= 8.0, span_s
    print(f"rate 20/s over 100 records: run {elapsed:.2f}s, first to last record {span_s:.2f}s")


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "headers-only"])
async def test_replayed_record_failing_again_keeps_history_and_is_not_replayed_again(
    broker: Broker, unique: str, tmp_path: Path, copy: bool
) -> None:
    topic = broker.create_topic(f"src-{unique}", partitions=1)
    dlq = f"dlq.{topic}"
    app = RecordingApp(policy=Switch())  # rejects everything, always
    async with running_sidecar(
        broker,
        tmp_path,
        app,
        topic=topic,
        group=f"g-{unique}",
        path="/",
        extra={"errors.deadletterqueue.copy.record.enable": copy},
        produce_first=_records(6, 1, classes=("Always",)),
    ) as rig:
        sc = rig.sc
        await _wait_thread(lambda: broker.count_records(dlq) >= 6, 60, "6 DLQ records")
        rc, out, err = await dlq_cli(broker, "replay", "--from", dlq, "--name", "loop")
        assert rc == 0 and "replayed 6 of 6" in out, out + err
        await _wait_thread(lambda: broker.count_records(dlq) >= 12, 60, "rejected again")

        dlq_recs = await trio.to_thread.run_sync(broker.read_topic, dlq, 12)
        again = [r for r in dlq_recs if (r.offset or 0) >= 6]
        assert len(again) == 6
        for r in again:
            assert _header(r.headers, H_REPLAY_NAME) == b"loop"
            assert _header(r.headers, H_REPLAY_COUNT) == b"1"
            src_from = _header(r.headers, H_REPLAY_FROM) or b""
            assert src_from.startswith(f"{dlq}/0/".encode())
            assert int(src_from.rsplit(b"/", 1)[1]) < 6
            assert int(_header(r.headers, "__dlq.errors.offset") or b"") >= 6
            if copy:
                assert r.value is not None and _header(r.headers, "seq") is not None
            else:
                assert r.key is None and r.value is None
                assert not any(n == "seq" for n, _ in r.headers)

        rc, out, _ = await dlq_cli(broker, "inspect", "--topic", dlq, "--json")
        assert sorted(row["replay_count"] for row in _json_lines(out)) == [0] * 6 + [1] * 6

        source_end = broker.end_offsets(topic, [0])[0]
        assert source_end == 12
        rc, out, err = await dlq_cli(broker, "replay", "--from", dlq, "--name", "loop")
        assert rc == 0, out + err
        assert "replayed 0 of 6 matching" in out
        assert "skipped, replayed too often: 6" in out
        assert out.count("replayed 1 times already") >= 6
        assert broker.end_offsets(topic, [0])[0] == source_end  # nothing sent again
        assert broker.committed("dlq-replay.loop", dlq, [0])[0][0] == 12
        # Once the sidecar committed every source record, any DLQ write for them is done.
        await _wait_thread(
            lambda: broker.committed(f"g-{unique}", topic, [0])[0][0] == source_end,
            60,
            "the sidecar committed the source topic",
        )
        assert broker.count_committed_records(dlq) == 12
        assert await sc.stop() == 0


def test_time_and_range_parsing() -> None:
    assert parse_time("1h30m").ago_s == 5400
    assert parse_time("2d").ago_s == 172800
    assert parse_time("2024-05-01T00:00:00Z").absolute_ms == 1714521600000
    assert parse_time("2024-05-01T00:00:00").absolute_ms == 1714521600000  # naive = UTC
    assert parse_offset_range("5-9") == (5, 9)
    assert parse_offset_range("5-")[0] == 5
    assert parse_offset_range("-9") == (0, 9)


def test_token_bucket_paces_without_a_burst() -> None:
    bucket = TokenBucket(rate_per_s=20)
    waits = [bucket.take(0.0) for _ in range(3)]
    assert waits == [0.0, pytest.approx(0.05), pytest.approx(0.10)]
    fresh = TokenBucket(rate_per_s=10)
    assert fresh.take(0.0) == 0.0
    assert fresh.take(1.0) == 0.0  # refilled, but capped at one token
    assert fresh.take(1.0) == pytest.approx(0.1)


def test_dlq_record_keeps_replay_history_when_the_copy_is_off() -> None:
    failed = FailedRecord(
        topic="orders",
        partition=2,
        offset=7,
        key=b"k",
        value=b"v",
        headers=(("trace", b"t"), (H_REPLAY_NAME, b"fix"), (H_REPLAY_COUNT, b"1")),
        group="g",
        delivery_count=1,
        cause=CAUSE_REJECTED,
    )
    headers_only = build_dlq_record(failed, "dlq.orders", 1, False, 100)
    assert headers_only.key is None and headers_only.value is None
    names = [n for n, _ in headers_only.headers]
    assert "trace" not in names
    assert (H_REPLAY_NAME, b"fix") in headers_only.headers
    assert (H_REPLAY_COUNT, b"1") in headers_only.headers
    dropped = build_dlq_record(failed, "dlq.orders", 1, True, 100, drop_copy_reason="too large")
    assert (H_REPLAY_COUNT, b"1") in dropped.headers and "trace" not in dict(dropped.headers)


def _entry(key: bytes | None, value: bytes | None, *headers: tuple[str, bytes | None]) -> DlqEntry:
    return DlqEntry("dlq.t", 0, 5, 1_700_000_000_000, key, value, tuple(headers))


def test_entry_decoding_and_filters() -> None:
    context = (
        ("__dlq.errors.topic", b"t"),
        ("__dlq.errors.partition", b"1"),
        ("__dlq.errors.offset", b"42"),
        ("__dlq.errors.exception.class.name", b"X"),
    )
    copied = _entry(b"k", None, ("a", b"1"), ("__dlq.errors.topic", b"spoof"), *context)
    assert copied.source_topic == "t"  # the writer's context header comes last and wins
    assert not copied.headers_only and copied.original_headers() == [("a", b"1")]
    assert _entry(None, None, *context).headers_only
    assert _entry(b"k", b"v", *context, ("__dlq.errors.copy.dropped", b"big")).headers_only
    now_ms = 1_700_000_000_000 + 60_000
    assert (
        Filters(exception_classes=("X",), source_partitions=(1,)).mismatch(copied, now_ms) is None
    )
    assert Filters(exception_classes=("Y",)).mismatch(copied, now_ms) == "exception-class"
    assert Filters(offset_range=(0, 41)).mismatch(copied, now_ms) == "offset-range"
    assert Filters(since=parse_time("30s")).mismatch(copied, now_ms) == "since"
    assert Filters(since=parse_time("2m")).mismatch(copied, now_ms) is None
    assert Filters(until=parse_time("30s")).mismatch(copied, now_ms) is None
    assert Filters(until=parse_time("2m")).mismatch(copied, now_ms) == "until"
    assert not _entry(b"k", b"v").is_dlq_record
