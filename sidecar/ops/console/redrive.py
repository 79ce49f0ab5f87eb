"""The console's redrives: the preview (a dry run of `dlq replay`) and the redrive itself, on a thread.

Owns `Redrives` and `preview`: both run `sidecar.ops.dlq.replay.Replayer`, the code `dlq replay` runs
(what that gives, and how a redrive is recorded: `Redrives`' docstring).

Imports: the standard library, rich and the `sidecar.ops.dlq.*` modules.
"""

from __future__ import annotations

import io
import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from rich.console import Console as RichConsole

from sidecar.core.errors import SidecarError
from sidecar.ops.dlq.render import render_replay_summary
from sidecar.ops.dlq.replay import Replayer, ReplayOptions, ReplaySummary

log = logging.getLogger("sidecar.console")


def new_replay_name() -> str:
    return f"console-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def summary_text(summary: ReplaySummary, options: ReplayOptions) -> str:
    """The summary as `dlq replay` prints it (the same renderer), for the preview and redrive pages."""
    out = io.StringIO()
    render_replay_summary(RichConsole(file=out, width=160, color_system=None), summary, options)
    return out.getvalue()


def preview(options: ReplayOptions) -> tuple[ReplaySummary, int]:
    """The dry run of `options`: (what it would do, DLQ records it would scan). Blocking."""
    replayer = Replayer(replace(options, dry_run=True))
    summary = replayer.run()
    return summary, replayer.total


@dataclass(slots=True)
class Job:
    """One redrive, as its page shows it."""

    id: str
    who: str
    options: ReplayOptions
    started_at: str
    state: str = "starting"  # starting, running, done, failed
    total: int = 0
    scanned: int = 0
    sent: int = 0
    error: str | None = None
    summary: ReplaySummary | None = None
    finished_s: float | None = None
    _started_s: float = field(default_factory=time.monotonic)

    def progress(self) -> dict[str, Any]:
        s = self.summary
        return {
            "id": self.id,
            "state": self.state,
            "total": self.total,
            "scanned": self.scanned,
            "sent": self.sent,
            "replayed": s.replayed_total if s is not None else None,
            "skipped": sum(s.skipped.values()) if s is not None else None,
            "failures": len(s.failures) + len(s.unrecoverable) if s is not None else None,
            "error": self.error,
            "elapsed_s": round((self.finished_s or time.monotonic()) - self._started_s, 1),
        }


class Redrives:
    """The redrives of one console process: started on their own threads, kept for their pages.

    Both run `sidecar.ops.dlq.replay.Replayer`, the code `dlq-sidecar dlq replay` runs: the same filters
    (the chosen records are `Filters.records`), the same loop guard (`--max-replays`, default 1: a record
    replayed once already is skipped), headers-only records read back from the source, the rate through its
    token bucket, progress committed under a replay name of its own (`console-<time>-<random>`, one per
    redrive). Each redrive is recorded: a log line when it starts (who, when, the topic, the filters, the
    rate, the name) and when it ends (the counts), never a payload; and `__dlq.replay.by` / `.at` on every
    record it sends (`ReplayOptions.by`).
    """

    def __init__(self, max_running: int, max_kept: int = 100) -> None:
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._max_running = max_running
        self._max_kept = max_kept

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def running(self) -> int:
        with self._lock:
            return sum(1 for j in self._jobs.values() if j.state in ("starting", "running"))

    def start(self, options: ReplayOptions, who: str) -> Job | None:
        """Start a redrive; None when `max_running` are running already."""
        with self._lock:
            if sum(1 for j in self._jobs.values() if j.state in ("starting", "running")) >= (
                self._max_running
            ):
                return None
            job = Job(
                id=secrets.token_hex(8),
                who=who,
                options=replace(options, dry_run=False, by=f"{who} (dlq-sidecar console)"),
                started_at=datetime.now(UTC).isoformat(timespec="seconds"),
            )
            self._jobs[job.id] = job
            while len(self._jobs) > self._max_kept:
                oldest = next(iter(self._jobs))
                if self._jobs[oldest].state in ("starting", "running"):
                    break
                del self._jobs[oldest]
        o = job.options
        log.info(
            "redrive %s started by %s at %s: from %s to %s, filters %s, rate %s/s, limit %s, "
            "replay name %s",
            job.id,
            who,
            job.started_at,
            o.dlq_topic,
            o.target_topic or "(each record's source topic)",
            json.dumps(o.filters.describe(), sort_keys=True),
            o.rate_per_s or "unlimited",
            o.limit,
            o.name,
        )
        threading.Thread(
            target=self._run, args=(job,), name=f"redrive-{job.id}", daemon=True
        ).start()
        return job

    def _run(self, job: Job) -> None:
        replayer = Replayer(job.options)

        def on_progress(summary: ReplaySummary, n: int) -> None:
            job.state = "running"
            job.total = replayer.total
            job.scanned = summary.scanned
            job.sent = replayer.planned
            job.summary = summary

        replayer.on_progress = on_progress
        try:
            summary = replayer.run()
        except (
            SidecarError
        ) as exc:  # a usage error (a name in use) or the broker's: shown on the page
            job.error = str(exc)
            job.state = "failed"
            log.warning("redrive %s by %s failed: %s", job.id, job.who, exc)
        else:
            job.summary = summary
            job.total = replayer.total
            job.scanned = summary.scanned
            job.sent = replayer.planned
            job.state = "done" if summary.ok else "failed"
            log.info(
                "redrive %s by %s finished: %d of %d matching sent (%s), %d skipped, %d failed, "
                "%d unrecoverable, in %.1fs",
                job.id,
                job.who,
                summary.replayed_total,
                summary.matched,
                ", ".join(f"{t} {n}" for t, n in sorted(summary.replayed.items())) or "none",
                sum(summary.skipped.values()),
                len(summary.failures),
                len(summary.unrecoverable),
                summary.elapsed_s,
            )
        finally:
            job.finished_s = time.monotonic()


__all__ = ["Job", "Redrives", "new_replay_name", "preview", "summary_text"]
