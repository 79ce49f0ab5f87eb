"""Throughput of the delivery ledger's hot path and the size of its commit metadata.

Run: ``python -m bench.ledger_bench [records]``.  Not a test: it prints figures.

Old against new: ``python -m bench.ledger_bench --baseline PATH [--records N] [--rounds R]`` runs
the three hot-path figures below for this checkout's ``sidecar`` and for another checkout's
(``git worktree add /tmp/base <commit>``, then ``make compiled`` there for its compiled core), each
run a child process (the checkout's root first on ``PYTHONPATH``), alternated new, old, new, old
... for R rounds, and prints the medians and the ratios new/old of records per CPU second and of
CPU per record (its inverse).

Hot path: add -> acquire -> accept -> committable_offset, KEY ordering, 10k distinct keys, in
batches the size a fetch would deliver; the figure is records per CPU second of this process
(``time.process_time``, so other load on the machine skews it less), median of three runs.

Horizon mode: the same hot path with ``crash_accounting=HORIZON``, the caller committing a
``commit_point()`` whenever ``horizon_wanted()`` asks (each commit confirmed at once), so the figure
includes the commit points' encoding.

Busy partition: the same with the default limits reached (10k buffered, up to 2000 in flight) and
the application answering in random order, which keeps the commit metadata large and exercises
the pause / metadata-size checks.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import time

from sidecar.core.commitstate import CommitState, encode, encoded_length
from sidecar.core.ledger import (
    Ack,
    Attempt,
    CrashAccounting,
    LedgerConfig,
    Ordering,
    PartitionLedger,
)

KEYS = [b"key-%d" % i for i in range(10_000)]


def run_pipeline(n_records: int, batch: int = 500) -> float:
    """Records per second through add -> acquire -> accept -> committable."""
    ledger = PartitionLedger("bench", 0, 0, LedgerConfig(ordering=Ordering.KEY))
    keys = KEYS
    n_keys = len(keys)
    accept = Ack.ACCEPT
    now = 0
    offset = 0
    committed = 0
    started = time.process_time()
    while offset < n_records:
        end = min(offset + batch, n_records)
        for o in range(offset, end):
            ledger.add(o, keys[o % n_keys], None, now)
        offset = end
        for attempt in ledger.acquire(now, batch):
            ledger.answer(attempt.attempt_id, accept, now)
        committed = ledger.committable_offset()
        now += 1
    # Drain what key order held back.
    while not ledger.is_idle:
        for attempt in ledger.acquire(now, batch):
            ledger.answer(attempt.attempt_id, accept, now)
        now += 1
    committed = ledger.committable_offset()
    elapsed = time.process_time() - started
    assert committed == n_records, committed
    return n_records / elapsed


def run_horizon(n_records: int, batch: int = 500) -> tuple[float, int]:
    """Records per second in horizon mode, and how many horizon commits were wanted."""
    config = LedgerConfig(ordering=Ordering.KEY, crash_accounting=CrashAccounting.HORIZON)
    ledger = PartitionLedger("bench", 0, 0, config)
    keys = KEYS
    n_keys = len(keys)
    accept = Ack.ACCEPT
    now = 0
    offset = 0
    commits = 0
    started = time.process_time()
    while offset < n_records or not ledger.is_idle:
        end = min(offset + batch, n_records)
        for o in range(offset, end):
            ledger.add(o, keys[o % n_keys], None, now)
        offset = end
        if ledger.horizon_wanted() is not None:
            ledger.committed(ledger.commit_point(), now)
            commits += 1
        for attempt in ledger.acquire(now, batch):
            ledger.answer(attempt.attempt_id, accept, now)
        ledger.committable_offset()
        now += 1
    elapsed = time.process_time() - started
    assert ledger.committable_offset() == n_records
    return n_records / elapsed, commits


def run_busy(n_records: int) -> float:
    """Records per CPU second with 2000 in flight answered in random order, pausing as asked."""
    rng = random.Random(3)
    ledger = PartitionLedger("bench", 0, 0, LedgerConfig(ordering=Ordering.KEY))
    in_flight: list[Attempt] = []
    offset = 0
    done = 0
    now = 0
    started = time.process_time()
    while done < n_records:
        if not ledger.update_paused():
            for o in range(offset, min(offset + 500, n_records)):
                ledger.add(o, KEYS[rng.randrange(len(KEYS))], None, now)
            offset = min(offset + 500, n_records)
        in_flight += ledger.acquire(now, 2000)
        rng.shuffle(in_flight)
        answered, in_flight = (
            in_flight[: len(in_flight) // 4 + 1],
            in_flight[len(in_flight) // 4 + 1 :],
        )
        for attempt in answered:
            ledger.answer(attempt.attempt_id, Ack.ACCEPT, now)
        done += len(answered)
        ledger.committable_offset()
        now += 1
    elapsed = time.process_time() - started
    assert ledger.committable_offset() == n_records
    return n_records / elapsed


def typical_state() -> CommitState:
    """A busy partition: 2000 in flight spread over 10k buffered, a few retries, some done."""
    rng = random.Random(1)
    ledger = PartitionLedger("bench", 0, 1_000_000_000, LedgerConfig(ordering=Ordering.NONE))
    base = 1_000_000_000
    for o in range(base, base + 10_000):
        ledger.add(o, None, None, 0)
    attempts = ledger.acquire(0, 2000)
    for attempt in attempts:
        roll = rng.random()
        if roll < 0.6:
            ledger.answer(attempt.attempt_id, Ack.ACCEPT, 1)
        elif roll < 0.65:
            ledger.answer(attempt.attempt_id, Ack.RELEASE, 1)
    ledger.acquire(2, 1400)
    return ledger.commit_state()


def worst_state(n: int) -> CommitState:
    """Every other offset done and the rest with large, varied counts, offsets near 2**63."""
    rng = random.Random(2)
    base = 2**63 - 10 * n
    done = tuple((base + 2 * i + 2, base + 2 * i + 3) for i in range(n))
    counts = {base + 2 * i + 1: rng.randint(1, 200) for i in range(n)}
    counts[base] = 3
    return CommitState(base, done, counts)


FIGURES = ("write-ahead", "horizon", "busy")


def child(n_records: int) -> None:
    """One run of each hot-path figure for the ``sidecar`` on the path: one JSON line."""
    import sidecar.core

    print(
        json.dumps(
            {
                "compiled": sidecar.core.compiled(),
                "write-ahead": run_pipeline(n_records),
                "horizon": run_horizon(n_records)[0],
                "busy": run_busy(min(n_records, 300_000)),
            }
        )
    )


def compare(baseline: pathlib.Path, n_records: int, rounds: int) -> None:
    """The hot-path figures of this checkout and ``baseline``, alternated (see the docstring)."""
    sides = {"new": pathlib.Path(__file__).resolve().parents[1], "old": baseline.resolve()}
    figures: dict[str, dict[str, list[float]]] = {side: {f: [] for f in FIGURES} for side in sides}
    for round_ in range(rounds):
        for side, root in sides.items():
            env = dict(os.environ, PYTHONPATH=str(root))
            done = subprocess.run(
                [sys.executable, __file__, "--child", "--records", str(n_records)],
                cwd=root,
                env=env,
                check=True,
                capture_output=True,
                text=True,
            )
            result = json.loads(done.stdout.strip().splitlines()[-1])
            if not result["compiled"] and not os.environ.get("DLQ_SIDECAR_PURE"):
                print(f"note: the {side} side ran its pure sources ({root})", flush=True)
            for name in FIGURES:
                figures[side][name].append(result[name])
            line = ", ".join(f"{n} {result[n]:,.0f}" for n in FIGURES)
            print(f"round {round_ + 1} {side}: {line} records/CPU s", flush=True)
    print(f"medians of {rounds} rounds, {n_records:,} records (300,000 at most for busy):")
    for name in FIGURES:
        new = statistics.median(figures["new"][name])
        old = statistics.median(figures["old"][name])
        # Each round's two runs are neighbours in time: their ratio is less exposed to the
        # machine's load drifting over the whole run than the ratio of the medians.
        paired = statistics.median(
            n / o for n, o in zip(figures["new"][name], figures["old"][name], strict=True)
        )
        print(
            f"  {name:12} new {new:>12,.0f}  old {old:>12,.0f} records/CPU s   "
            f"records/s x{new / old:.3f}   CPU/record x{old / new:.3f}   "
            f"(median of the rounds' ratios: records/s x{paired:.3f})"
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1].startswith("--"):
        parser = argparse.ArgumentParser(prog="python -m bench.ledger_bench")
        parser.add_argument("--baseline", type=pathlib.Path)
        parser.add_argument("--records", type=int, default=300_000)
        parser.add_argument("--rounds", type=int, default=5)
        parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
        args = parser.parse_args()
        if args.child:
            child(args.records)
        elif args.baseline is None:
            parser.error("--baseline PATH (or a record count alone: the figures of this checkout)")
        else:
            compare(args.baseline, args.records, args.rounds)
        return
    n_records = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    rates = [run_pipeline(n_records) for _ in range(3)]
    print(
        f"hot path (add -> acquire -> accept -> committable), KEY order, 10k keys, "
        f"{n_records} records: median {statistics.median(rates):,.0f} records/s "
        f"(runs: {', '.join(f'{r:,.0f}' for r in rates)})"
    )
    horizon = [run_horizon(n_records) for _ in range(3)]
    print(
        f"hot path in horizon mode (same, plus a commit point whenever one is wanted): median "
        f"{statistics.median(r for r, _ in horizon):,.0f} records/s, "
        f"{horizon[0][1]} commit points for {n_records} records"
    )
    busy = [run_busy(min(n_records, 300_000)) for _ in range(3)]
    print(
        f"busy partition (10k buffered, 2000 in flight, random answer order): median "
        f"{statistics.median(busy):,.0f} records/s"
    )
    typical = typical_state()
    print(
        f"typical state: {len(typical.done)} done ranges, {len(typical.counts)} counts -> "
        f"{encoded_length(typical)} characters"
    )
    for n in (100, 300, 1000):
        worst = worst_state(n)
        fitted = encode(worst, 4096)
        print(
            f"worst case ({n} alternating done/not-done, counts 1..200, offsets near 2**63): "
            f"{encoded_length(worst)} characters full, {len(fitted or '')} within a 4096 budget"
        )


if __name__ == "__main__":
    main()
