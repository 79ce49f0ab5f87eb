"""Where the bench's children run from, and what it reads of them: CPU, memory, percentiles.

Every measured process is a child; CPU comes from /proc/<pid>/stat (all its threads, librdkafka's
included), peak RSS from VmHWM (``proc_status_kb``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """utime + stime so far of each thread of ``pid`` still alive, summed by name: ``main`` (trio's),
    librdkafka's by their own names (``rdk:main``, ``rdk:broker1``, ...), and the other Python
    threads (the poll thread, the DLQ writer's, workers) as ``python``."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended meanwhile
        name = "main" if task.name == str(pid) else comm
        name = name.split("#")[0] if name.startswith("rdk:") else name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def wakeups(pid: int) -> int:
    """Voluntary context switches so far of every thread of ``pid`` still alive: how often its
    threads went to sleep and were woken (a blocking poll, an epoll wait, a futex)."""
    return sum(wakeups_by_thread(pid).values())


def wakeups_by_thread(pid: int) -> dict[str, int]:
    """`wakeups` of each thread of ``pid`` still alive, summed by name as `thread_cpu_seconds`
    names them."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    name = "main" if task.name == str(pid) else comm
                    name = name.split("#")[0] if name.startswith("rdk:") else name
                    out[name] = out.get(name, 0) + int(line.split()[1])
        except OSError:
            continue  # ended meanwhile
    return out


def schedstat(pid: int) -> dict[str, tuple[int, int]]:
    """Per thread of ``pid`` still alive: (ns run on a core, ns waited runnable for one) so far, from
    /proc/<pid>/task/<tid>/schedstat: on a loaded machine, how much of a run a thread spent queued."""
    out: dict[str, tuple[int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            ran, waited, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        out[task.name] = (int(ran), int(waited))
    return out


def busiest_thread_shares(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], seconds: float
) -> dict[str, float]:
    """The thread that ran most between two ``schedstat`` readings: the shares of ``seconds`` it ran
    and waited runnable."""
    ran = {t: after[t][0] - before.get(t, (0, 0))[0] for t in after}
    if not ran or seconds <= 0:
        return {}
    top = max(ran, key=lambda t: ran[t])
    waited = after[top][1] - before.get(top, (0, 0))[1]
    return {
        "busiest_ran_share": ran[top] / 1e9 / seconds,
        "busiest_waited_share": waited / 1e9 / seconds,
    }


def proc_status_kb(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def git_commit(root: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), "describe", "--always", "--dirty"],
        check=False,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "?"
