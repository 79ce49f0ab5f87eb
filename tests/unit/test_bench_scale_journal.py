"""The scale bench's verdict on a rollout (bench.scale.journal): lost, innocent, backwards, duplicates."""

from __future__ import annotations

from bench.scale.journal import (
    Journal,
    StopState,
    judge,
    not_durable,
    reject_bucket,
    release_bucket,
    unexplained,
)


def line(p: int, o: int, count: int, answer: str, ns: int) -> str:
    return f"t {p} {o} {count} {answer} {ns}"


def offsets_of(kind: str, n: int) -> list[int]:
    pick = reject_bucket if kind == "reject" else release_bucket
    return [o for o in range(500) if pick(0, o)][:n]


def test_a_clean_run_has_nothing_to_report() -> None:
    (rej,) = offsets_of("reject", 1)
    (rel,) = offsets_of("release", 1)
    lines = []
    for o in range(max(rej, rel) + 1):
        if o == rel:
            lines += [line(0, o, 1, "release", o * 10), line(0, o, 2, "accept", o * 10 + 5)]
        else:
            lines.append(line(0, o, 1, "reject" if o == rej else "accept", o * 10))
    v = judge(
        Journal.parse(lines),
        {("t", 0): rel + 1 if rel > rej else rej + 1},
        [("t", 0, rej)],
        (0, 10 * (max(rej, rel) + 1)),
    )
    assert (v.lost, v.innocent_dead_lettered, v.counts_backwards, v.duplicate_deliveries) == (
        0,
        0,
        0,
        0,
    )
    assert v.longest_silence_s < 1e-6


def test_what_a_bad_run_reports() -> None:
    (rel,) = offsets_of("release", 1)
    ok = next(o for o in range(50) if not reject_bucket(0, o) and not release_bucket(0, o))
    lines = [
        line(0, rel, 1, "release", 0),
        line(0, rel, 2, "accept", 1_000),
        line(0, rel, 1, "accept", 3_000_000_000),  # after a restart: count backwards, a duplicate
        line(0, ok, 1, "accept", 100),
        line(0, ok, 1, "accept", 200),  # delivered again after its accept
    ]
    ends = {("t", 0): max(rel, ok) + 1}
    v = judge(Journal.parse(lines), ends, [("t", 0, ok)], (0, 4_000_000_000))
    assert v.counts_backwards == 1
    assert v.duplicate_deliveries == 2 and v.duplicated_times == {1: 2}
    assert v.innocent_dead_lettered == 1  # ok's offset is not one the app rejects
    assert v.lost == ends[("t", 0)] - 2  # every other offset: never accepted, not in the DLQ
    assert 2.9 < v.longest_silence_s < 3.1
    # Dapr's DROP: a record the app rejected is done without a DLQ record.
    rej = offsets_of("reject", 1)[0]
    dropped = judge(
        Journal.parse([line(0, rej, 0, "reject", 1)]),
        {("t", 0): rej + 1},
        [],
        (0, 2),
        reject_is_done=True,
    )
    assert dropped.lost == rej


def test_a_kill_explains_the_records_answered_past_its_last_commit_and_nothing_else() -> None:
    ok = [o for o in range(200) if not reject_bucket(0, o) and not release_bucket(0, o)][:6]
    a, b, c, d, e, f = ok
    lines = [
        line(0, a, 1, "accept", 100),  # below the committed offset: durable
        line(0, b, 1, "accept", 200),  # at it: answered, not yet committed
        line(0, c, 1, "accept", 300),  # answered just after the kill: a request it had sent
        line(0, d, 1, "accept", 900),  # answered well after the member was gone: not its own
        line(1, e, 1, "accept", 250),  # another member's partition
        line(0, b, 1, "accept", 2_000),  # delivered again after the kill: explained
        line(0, c, 1, "accept", 2_100),
        line(0, a, 1, "accept", 2_200),  # committed, delivered again: unexplained
        line(1, e, 1, "accept", 2_300),  # not the killed member's: unexplained
    ]
    journal = Journal.parse(lines)
    stop = StopState({0: b}, started_ns=0, gone_ns=250, answered_grace_ns=100)
    held = not_durable(journal, "t", stop)
    assert held == {("t", 0, b), ("t", 0, c)}
    # A partition with no commit of its own: what was answered since the member started.
    assert not_durable(
        journal, "t", StopState({0: None}, started_ns=150, gone_ns=500, answered_grace_ns=0)
    ) == {
        ("t", 0, b),
        ("t", 0, c),
    }
    v = judge(journal, {("t", 0): f + 1, ("t", 1): e + 1}, [], (0, 3_000))
    assert v.duplicate_deliveries == 4
    odd = unexplained(v.extra, "t", [(400, held)])
    assert sorted(odd) == sorted([(0, a), (1, e)])
    # Before the stop, nothing it held explains a delivery.
    assert len(unexplained(v.extra, "t", [(2_500, held)])) == 4
