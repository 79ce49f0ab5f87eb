"""The reliability checker's verdicts on hand-made journals and Kafka observations (pure, no broker)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tests.checker import (
    CAUSE_DELIVERY_COUNT,
    CAUSE_REJECTED,
    Delivery,
    DlqEntry,
    Fault,
    Journal,
    JournalError,
    Observed,
    Produced,
    RunInfo,
    check,
    digest,
    main,
    parse_journal,
)

T = "src"
RUN = RunInfo(group="g", topics=(T,), dlq_topic="dlq.src", limit=3, copy_record=True)


def produced(offset: int, kind: str = "ok", partition: int = 0) -> Produced:
    value = f"{offset}:{kind}:".encode()
    return Produced(str(offset), T, partition, offset, kind, digest(b"k"), digest(value))


def delivery(offset: int, answer: str = "accept", count: int = 1, partition: int = 0) -> Delivery:
    return Delivery(str(offset), T, partition, offset, count, answer)


def dlq(
    offset: int,
    *,
    kind: str = "poison",
    cause: str = CAUSE_REJECTED,
    count: int = 1,
    group: str = "g",
    value: bytes | None = None,
    dropped: bool = False,
    partition: int = 0,
) -> DlqEntry:
    headers: list[tuple[str, bytes | None]] = [
        ("__dlq.errors.topic", T.encode()),
        ("__dlq.errors.partition", str(partition).encode()),
        ("__dlq.errors.offset", str(offset).encode()),
        ("__dlq.errors.group", group.encode()),
        ("__dlq.errors.delivery.count", str(count).encode()),
        ("__dlq.errors.message", cause.encode()),
    ]
    if dropped:
        headers.append(("__dlq.errors.copy.dropped", b"too large"))
        return DlqEntry(0, offset, None, None, tuple(headers))
    body = value if value is not None else f"{offset}:{kind}:".encode()
    return DlqEntry(0, offset, b"k", body, tuple(headers))


def journal(
    prod: list[Produced],
    deliveries: list[Delivery],
    faults: list[Fault] | None = None,
    run: RunInfo = RUN,
) -> Journal:
    return Journal(run, tuple(prod), tuple(deliveries), tuple(faults or ()))


def clean_case() -> tuple[Journal, Observed]:
    prod = [produced(0), produced(1, "poison"), produced(2), produced(3, "release")]
    ds = [
        delivery(0),
        delivery(1, "reject"),
        delivery(2),
        delivery(3, "release", 1),
        delivery(3, "release", 2),
        delivery(3, "release", 3),
    ]
    obs = Observed(
        (dlq(1), dlq(3, kind="release", cause=CAUSE_DELIVERY_COUNT, count=3)), {(T, 0): 4}
    )
    return journal(prod, ds), obs


def test_clean_run_has_no_violations_and_a_distribution() -> None:
    j, obs = clean_case()
    r = check(j, obs)
    assert r.ok, r.table()
    assert (r.produced, r.accepted, r.dead_lettered, r.dlq_records) == (4, 2, 2, 2)
    assert r.distribution == {1: 3, 3: 1}
    assert r.max_delivery_count == 3
    assert r.bound == 3
    assert "verdict" in r.table() and "OK" in r.table()
    assert json.loads(json.dumps(r.to_dict()))["ok"] is True


def test_a_record_neither_accepted_nor_dead_lettered_is_lost() -> None:
    j, obs = clean_case()
    j = journal(list(j.produced), [d for d in j.deliveries if d.offset != 2])
    r = check(j, Observed(obs.dlq, {(T, 0): 2}))
    assert [f.coord for f in r.by_kind("lost")] == [(T, 0, 2)]
    assert not r.ok


def test_a_commit_past_a_record_not_done_is_reported() -> None:
    j, obs = clean_case()
    # Offset 1 (poison) is not in the DLQ, yet the group committed 4.
    r = check(j, Observed(obs.dlq[1:], {(T, 0): 4}))
    assert [f.coord for f in r.by_kind("commit_ahead")] == [(T, 0, 1)]
    assert [f.coord for f in r.by_kind("lost")] == [(T, 0, 1)]
    # Committed exactly at the hole is fine (the hole itself is not passed).
    r2 = check(j, Observed(obs.dlq[1:], {(T, 0): 1}))
    assert r2.by_kind("commit_ahead") == []


def test_dlq_duplicates_are_violations_only_in_transactional_mode() -> None:
    j, obs = clean_case()
    doubled = Observed((*obs.dlq, dlq(1)), obs.committed)
    alo = check(j, doubled)
    assert alo.dlq_duplicates == 1 and alo.ok, alo.table()
    assert "allowed" in alo.table()
    txn_run = dataclasses.replace(RUN, transactional=True)
    txn = check(journal(list(j.produced), list(j.deliveries), run=txn_run), doubled)
    assert txn.dlq_duplicates == 1
    assert [f.kind for f in txn.violations] == ["dlq_duplicate"]


def test_deliveries_beyond_limit_plus_crashes() -> None:
    prod = [produced(0)]
    ds = [delivery(0, "release", c) for c in (1, 2, 3)] + [delivery(0, "accept", 4)]
    r = check(journal(prod, ds), Observed((), {(T, 0): 1}))
    assert [f.kind for f in r.violations] == ["over_bound"]
    # One sidecar crash widens the bound by one attempt (docs/guarantees.md).
    crash = [Fault("sidecar_kill", 1.0)]
    r2 = check(journal(prod, ds, crash), Observed((), {(T, 0): 1}))
    assert r2.ok and r2.bound == 4 and r2.crashes == 1
    # Other faults do not.
    other = [Fault("broker_sigkill", 1.0)]
    assert not check(journal(prod, ds, other), Observed((), {(T, 0): 1})).ok
    assert check(journal(prod, ds, other), Observed((), {(T, 0): 1}), extra_allowance=1).ok


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        (dlq(1, value=b"something else"), "value is not the original"),
        (dlq(1, group="other"), "group header"),
        (dlq(1, cause="whatever"), "cause"),
        (dlq(1, count=9), "outside"),
        (dlq(1, cause=CAUSE_DELIVERY_COUNT, count=1), "< limit"),
    ],
)
def test_dlq_mismatches(entry: DlqEntry, needle: str) -> None:
    j, obs = clean_case()
    r = check(j, Observed((entry, obs.dlq[1]), obs.committed))
    found = r.by_kind("dlq_mismatch")
    assert found and any(needle in f.detail for f in found), r.table()


def test_headers_only_copy_is_accepted_when_marked_dropped() -> None:
    j, obs = clean_case()
    r = check(j, Observed((dlq(1, dropped=True), obs.dlq[1]), obs.committed))
    assert r.ok, r.table()
    assert r.dlq_copies_dropped == 1
    # Without copy mode a key or value in the DLQ record is a mismatch.
    headers_only = dataclasses.replace(RUN, copy_record=False)
    r2 = check(journal(list(j.produced), list(j.deliveries), run=headers_only), obs)
    assert any("headers-only" in f.detail for f in r2.by_kind("dlq_mismatch"))


def test_dead_lettering_a_record_the_app_only_accepted_is_unexpected() -> None:
    j, obs = clean_case()
    r = check(j, Observed((*obs.dlq, dlq(0, kind="ok")), obs.committed))
    assert [f.coord for f in r.by_kind("unexpected_dlq")] == [(T, 0, 0)]


def test_payload_the_app_got_must_match_what_was_produced() -> None:
    prod = [produced(0)]
    good = Delivery("0", T, 0, 0, 1, "accept", prod[0].value_sha)
    bad = Delivery("0", T, 0, 0, 2, "accept", digest(b"tampered"))
    assert check(journal(prod, [good]), Observed((), {(T, 0): 1})).ok
    r = check(journal(prod, [good, bad]), Observed((), {(T, 0): 1}))
    assert [f.kind for f in r.violations] == ["app_payload_mismatch"]
    assert r.redelivered_after_accept == 1


def test_counts_seen_twice_are_reported_not_failed() -> None:
    prod = [produced(0)]
    ds = [delivery(0, "release", 1), delivery(0, "accept", 1)]
    r = check(journal(prod, ds), Observed((), {(T, 0): 1}))
    assert r.count_repeats == 1 and r.ok


def test_parse_journal_round_trip_and_errors(tmp_path: Path) -> None:
    lines = [
        json.dumps({"ev": "run", "group": "g", "topics": [T], "dlq_topic": "dlq.src", "limit": 3}),
        json.dumps(
            {"ev": "produced", "id": "0", "topic": T, "partition": 0, "offset": 0, "kind": "ok"}
        ),
        json.dumps(
            {
                "ev": "delivery",
                "id": "0",
                "topic": T,
                "partition": 0,
                "offset": 0,
                "count": 1,
                "answer": "accept",
            }
        ),
        json.dumps({"ev": "fault", "kind": "sidecar_kill", "t": 1.5}),
        json.dumps({"ev": "phase", "note": "ignored"}),
        "",
    ]
    j = parse_journal(lines)
    assert j.run.limit == 3 and not j.run.transactional
    assert len(j.produced) == 1 and len(j.deliveries) == 1 and j.faults[0].kind == "sidecar_kill"
    assert j.deliveries[0].value_sha == "-"  # not recorded: not compared
    with pytest.raises(JournalError, match="no run line"):
        parse_journal(lines[1:])
    with pytest.raises(JournalError, match="line 2"):
        parse_journal([lines[0], "{not json"])
    path = tmp_path / "j.jsonl"
    path.write_text("garbage\n")
    assert main([str(path), "--bootstrap", "127.0.0.1:1"]) == 2


def test_crash_charged_names_a_count_raised_with_no_answer_counting_an_attempt() -> None:
    prod = [produced(0), produced(1), produced(2, "release")]
    ds = [
        # Accepted, the answer died with the sidecar: delivered again at the same count (no charge).
        delivery(0, "accept"),
        delivery(0, "accept"),
        # In flight at a death (old write-ahead promise): charged for it.
        delivery(1, "unanswered"),
        delivery(1, "accept", count=2),
        # Released once: count 2 is its own.
        delivery(2, "release"),
        delivery(2, "accept", count=2),
    ]
    faults = [Fault("sidecar_kill", 1.0)]
    r = check(journal(prod, ds, faults), Observed((), {(T, 0): 3}))
    assert r.crash_charged == [(T, 0, 1)]
    assert r.ok  # informational: the killer scenario asserts on it
    assert "counts charged by a crash" in r.table()
