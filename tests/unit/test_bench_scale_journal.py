"""The scale bench's verdict on a rollout (bench.scale.journal): lost, innocent, backwards, duplicates."""

from __future__ import annotations

from bench.scale.journal import Journal, judge, reject_bucket, release_bucket


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
