"""The exit record: this pod's process starts and fatal exits, kept in a file across container restarts.

Owns `ExitRecord` (why in-process metrics cannot show a fatal exit, and the series the next process
exports: its docstring) and its collector. The file is JSON, replaced atomically; one that cannot be
read or written costs a warning, never the sidecar.

Imports: the standard library and prometheus_client; nothing of the sidecar (the daemon passes the reason in).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("sidecar.exits")

# The reasons of a fatal exit (the `reason` label).
DLQ_WRITE_FAILED = (
    "dlq_write_failed"  # a DLQ write failed for good (dlq_sidecar_dlq_failed_total rose)
)
DLQ_STARTUP_FAILED = "dlq_startup_failed"  # the start-up check of the DLQ topics failed
OTHER = "other"  # any other runtime failure (errors.tolerance: none hit, a source error, ...)
REASONS = (DLQ_WRITE_FAILED, DLQ_STARTUP_FAILED, OTHER)


@dataclass(slots=True)
class _Exits:
    count: int = 0
    last_at: float = 0.0


@dataclass(slots=True)
class ExitRecord:
    """The record of one pod, read at start-up; `started` and `failed` write it back.

    A DLQ write that fails for good stops the process (exit 1) before a scrape can see
    `dlq_sidecar_dlq_failed_total` rise, and the restarted process starts every counter at 0: in-process
    metrics cannot show a failure that ends the process. So the sidecar writes what happened to
    `metrics.exit.record.path` (a file on a volume that outlives a container restart, e.g. the pod's /tmp
    emptyDir) and the next process exports it:

        dlq_sidecar_restarts_total                             starts before this one
        dlq_sidecar_fatal_exits_total{reason}                  exits with code 1, by reason
        dlq_sidecar_last_fatal_exit_timestamp_seconds{reason}  Unix time of the last one
        dlq_sidecar_pod_broker_archived_without_dlq_total{topic}
                                                               records lost in this pod (share engine), so the
                                                               loss alert outlives a restart

    The losses are this process's count (the engine's) plus what earlier processes of the pod counted; the file
    is rewritten at a scrape that sees the count change (a process killed before that scrape leaves the log
    lines, which name each record, as the only trace).
    """

    path: Path
    starts: int = 0
    exits: dict[str, _Exits] = field(default_factory=dict)
    # Records the broker archived without a DLQ record, by topic: earlier processes' (`lost_before`) and
    # the total last written.
    lost_before: dict[str, int] = field(default_factory=dict)
    lost_written: dict[str, int] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str) -> ExitRecord:
        record = cls(Path(path))
        try:
            data = json.loads(record.path.read_text(encoding="utf-8"))
            record.starts = int(data["starts"])
            for reason, item in data["exits"].items():
                if reason in REASONS:
                    record.exits[reason] = _Exits(int(item["count"]), float(item["last_at"]))
            record.lost_before = {str(t): int(n) for t, n in data.get("lost", {}).items()}
            record.lost_written = dict(record.lost_before)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("the exit record %s is unreadable (%s): starting it over", path, exc)
            record.starts, record.exits = 0, {}
            record.lost_before, record.lost_written = {}, {}
        return record

    def started(self) -> None:
        """Count this process's start."""
        self.starts += 1
        self._write()

    def failed(self, reason: str, now: float | None = None) -> None:
        """Record a fatal exit (`reason` one of REASONS) just before the process exits 1."""
        item = self.exits.setdefault(reason, _Exits())
        item.count += 1
        item.last_at = time.time() if now is None else now
        self._write()

    def losses(self, current: dict[str, int]) -> dict[str, int]:
        """This pod's losses by topic: `current` (this process's count) plus earlier processes'; the
        file is rewritten when the total changed."""
        total = dict(self.lost_before)
        for topic, n in current.items():
            total[topic] = total.get(topic, 0) + n
        if total != self.lost_written:
            self.lost_written = total
            self._write()
        return total

    def _write(self) -> None:
        data: dict[str, Any] = {
            "starts": self.starts,
            "exits": {r: {"count": e.count, "last_at": e.last_at} for r, e in self.exits.items()},
            "lost": self.lost_written,
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot write the exit record %s: %s", self.path, exc)


class ExitCollector(Collector):
    """The record as Prometheus families (every reason and source topic from 0, so the first exit or loss
    is an increase). `lost_now` reads this process's losses by topic (the engine's counters)."""

    def __init__(
        self, record: ExitRecord, topics: Sequence[str], lost_now: Callable[[], dict[str, int]]
    ) -> None:
        self.record = record
        self.topics = tuple(topics)
        self.lost_now = lost_now

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        r = self.record
        yield CounterMetricFamily(
            "dlq_sidecar_restarts",
            "Process starts of the sidecar in this pod before the current one, whatever stopped them"
            " (metrics.exit.record.path; survives container restarts).",
            value=max(0, r.starts - 1),
        )
        exits = CounterMetricFamily(
            "dlq_sidecar_fatal_exits",
            "Exits with code 1 of the sidecar in this pod, by reason (dlq_write_failed,"
            " dlq_startup_failed, other); counted by the next process, across container restarts.",
            labels=["reason"],
        )
        last = GaugeMetricFamily(
            "dlq_sidecar_last_fatal_exit_timestamp_seconds",
            "Unix time of the last exit with code 1 of the sidecar in this pod, by reason (0: none).",
            labels=["reason"],
        )
        for reason in REASONS:
            item = r.exits.get(reason) or _Exits()
            exits.add_metric([reason], item.count)
            last.add_metric([reason], item.last_at)
        yield exits
        yield last
        lost = CounterMetricFamily(
            "dlq_sidecar_pod_broker_archived_without_dlq",
            "Records the broker archived with no DLQ record in this pod, across container restarts"
            " (share engine; never expected): dlq_sidecar_broker_archived_without_dlq_total of every"
            " process of the pod.",
            labels=["topic"],
        )
        for topic, n in sorted((dict.fromkeys(self.topics, 0) | r.losses(self.lost_now())).items()):
            lost.add_metric([topic], n)
        yield lost


def fatal_reason(dlq_failed: int, *, startup: bool = False) -> str:
    """The reason label of a fatal exit: the DLQ start-up check, a DLQ write, or anything else."""
    if startup:
        return DLQ_STARTUP_FAILED
    return DLQ_WRITE_FAILED if dlq_failed > 0 else OTHER
