"""``python -m bench.wakeups``: what a thread's wake-up costs on this machine, in CPU.

The sidecar's CPU per record at ordinary rates is mostly wake-ups: a record arriving wakes the
poll thread and then trio's thread, and its answer wakes trio's thread again, each after a sleep
as long as the gap between records. This command times one fixed piece of Python work (a few
hundred calls, about 10 µs in a hot loop) done once per wake-up, for several gaps between
wake-ups, in two ways: the thread sleeping (``time.sleep``), and the thread woken by another one
through a socket (as the poll thread wakes trio's). The figure is the waking thread's own CPU
time per wake-up (``time.thread_time``): the work, the system calls around the wait, and whatever
running after a sleep costs more than running hot (caches and, in a virtual machine, the
hypervisor's wake-up of an idle virtual CPU).

    python -m bench.wakeups [--wakes N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import statistics
import threading
import time
from pathlib import Path

GAPS_MS = (0.0, 0.1, 1.0, 10.0)


def _work() -> int:
    # Dicts, attribute and method calls: the kind of work one record's path does, small.
    table: dict[int, object] = {}
    for i in range(300):
        table[i % 17] = json.dumps
    return len(table)


def per_wake_sleeping(gap_s: float, wakes: int) -> float:
    """µs of this thread's CPU per (sleep, work) round."""
    start = time.thread_time()
    for _ in range(wakes):
        if gap_s:
            time.sleep(gap_s)
        _work()
    return (time.thread_time() - start) / wakes * 1e6


def per_wake_woken(gap_s: float, wakes: int) -> float:
    """µs of the woken thread's CPU per round: it waits in ``select`` on a socket that another
    thread writes one byte to every ``gap_s``."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    cpu: list[float] = []
    rounds: list[int] = []

    def woken() -> None:
        # One round per wake-up; with no gap several bytes may be read in one.
        start = time.thread_time()
        seen = woke = 0
        while seen < wakes:
            select.select([ours], [], [])
            seen += len(ours.recv(4096))
            woke += 1
            _work()
        cpu.append(time.thread_time() - start)
        rounds.append(woke)

    thread = threading.Thread(target=woken)
    thread.start()
    try:
        for _ in range(wakes):
            if gap_s:
                time.sleep(gap_s)
            theirs.send(b"x")
            if not gap_s:
                time.sleep(0)  # let the woken thread run (no gap: as soon as it can)
    finally:
        thread.join()
        ours.close()
        theirs.close()
    return cpu[0] / rounds[0] * 1e6


def measure(wakes: int) -> dict[str, dict[str, float]]:
    figures: dict[str, dict[str, float]] = {"sleeping": {}, "woken by a thread": {}}
    for gap_ms in GAPS_MS:
        n = max(50, wakes // 10) if gap_ms >= 10 else wakes
        # Median of three, alternating the two ways: the machine's speed drifts.
        sleeping, woken = [], []
        for _ in range(3):
            sleeping.append(per_wake_sleeping(gap_ms / 1000, n))
            woken.append(per_wake_woken(gap_ms / 1000, n))
        figures["sleeping"][f"{gap_ms:g}"] = statistics.median(sleeping)
        figures["woken by a thread"][f"{gap_ms:g}"] = statistics.median(woken)
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.wakeups", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--wakes", type=int, default=2000, help="wake-ups per gap (a tenth at 10 ms)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    hot = statistics.median(per_wake_sleeping(0, args.wakes) for _ in range(3))
    print(f"the work alone, in a hot loop: {hot:.1f} µs CPU")
    figures = measure(args.wakes)
    print(f"{'gap between wake-ups':<24}" + "".join(f"{g:>10g} ms" for g in GAPS_MS))
    for way, row in figures.items():
        cells = "".join(f"{row[f'{g:g}']:>10.1f} µs" for g in GAPS_MS)
        print(f"{way:<24}{cells}")
    print("(CPU of the waking thread per wake-up, the work included; medians of 3)")
    if args.json:
        args.json.write_text(json.dumps({"hot_us": hot, "per_wake_us": figures}, indent=2))


if __name__ == "__main__":
    main()
