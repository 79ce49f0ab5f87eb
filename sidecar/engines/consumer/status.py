"""The consumer-group engine's status: what the pipeline's readiness, `/v1/status` and metrics read.

:class:`ConsumerView` is the engine's :class:`~sidecar.engines.interfaces.StateView`, built by
:class:`~sidecar.engines.consumer.group.ConsumerGroupEngine` with the parts it reads (the source,
the partitions, the committer, the pipeline's room); it changes nothing. Must not import the
pipeline, the share engine, or confluent-kafka.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sidecar.config import Config
from sidecar.core.budget import memory_needed_bytes, partitions_within
from sidecar.engines.consumer.commits import Committer
from sidecar.engines.consumer.partitions import PartitionRef, Partitions
from sidecar.engines.interfaces import Outlet, PartitionKey
from sidecar.kafka.source import KafkaSource

log = logging.getLogger("sidecar.engine")

# Readiness reports `commits_ok: false` once every commit has failed for this long.
COMMITS_FAILING_NOT_READY_S = 30.0
# Where the container's memory limit is: cgroup v2, then v1.
CGROUP_MEMORY_FILES = (
    Path("/sys/fs/cgroup/memory.max"),
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
)
_NO_LIMIT = 1 << 60  # cgroup v1 reports "no limit" as a number near 2**63


def memory_limit_bytes(files: tuple[Path, ...] = CGROUP_MEMORY_FILES) -> int | None:
    """The process's memory limit from its cgroup, or None (no limit, or none readable)."""
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < _NO_LIMIT:
            return int(text)
        return None
    return None


class ConsumerView:
    """Readiness, status and per-partition figures of the consumer-group engine."""

    def __init__(
        self,
        config: Config,
        source: KafkaSource,
        partitions: Partitions,
        committer: Committer,
        outlet: Outlet[PartitionRef],
        *,
        horizon: bool,
        tier_topics: Mapping[str, str] | None = None,
    ) -> None:
        self._config = config
        self._source = source
        self._partitions = partitions
        self._states = partitions.by_key
        self._committer = committer
        self._outlet = outlet
        self._horizon = horizon
        self._tier_topics = tier_topics or {}  # tier topic -> its tier's label
        self._memory_limit = memory_limit_bytes()
        self._over_memory = False  # the last assignment was past what the memory limit holds

    def stalled(self) -> str | None:
        """Why the sidecar cannot make progress and should be restarted (None: it can).

        Every commit failing for `commit.stall.timeout.ms` means nothing is handed out (delivery
        counts are committed first) and nothing is marked done. A broker that is down recovers by
        itself; a consumer whose group coordinator lookup is wedged inside librdkafka does not,
        and a new process with a new consumer does. /healthz reports it so a liveness probe acts.
        """
        limit_ms = self._config.commit_stall_timeout_ms
        since = self._committer.failing_since
        if limit_ms <= 0 or since is None:
            return None
        failing_s = time.monotonic() - since
        if failing_s * 1000 < limit_ms:
            return None
        return f"every offset commit has failed for {failing_s:.0f}s (commit.stall.timeout.ms)"

    def readiness(self) -> dict[str, bool]:
        return {
            "assigned": bool(self._source.assigned),
            "broker_reachable": self._source.broker_ok,
            "commits_ok": self._committer.failing_since is None
            or time.monotonic() - self._committer.failing_since < COMMITS_FAILING_NOT_READY_S,
        }

    def broker_error(self) -> str | None:
        return self._source.broker_error

    def paused(self) -> set[PartitionKey]:
        return set(self._source.paused)

    def lag(self) -> dict[PartitionKey, int]:
        return self._source.lag()

    def commit_metadata_bytes(self) -> dict[PartitionKey, int]:
        return {k: len(s.last_commit[1]) for k, s in self._states.items() if s.last_commit}

    def memory(self) -> dict[str, Any]:
        """What the assigned partitions and a full budget may take, against the container's
        memory limit (None when it has none): `/v1/status` `memory`."""
        budget = self._config.delivery.max_buffered_bytes
        assigned = len(self._source.assigned)
        limit = self._memory_limit
        return {
            "partitions_assigned": assigned,
            "needed_bytes": memory_needed_bytes(budget, assigned),
            "limit_bytes": limit,
            "partitions_within_limit": None if limit is None else partitions_within(limit, budget),
        }

    def check_memory(self) -> None:
        """After an assignment: say once when the partitions assigned are past what the memory
        limit holds beside a full budget (and once when they are back within it)."""
        m = self.memory()
        within = m["partitions_within_limit"]
        over = within is not None and m["partitions_assigned"] > within
        if over and not self._over_memory:
            log.warning(
                "%d partitions assigned: with max.buffered.bytes full this sidecar may take %d MiB,"
                " past its memory limit of %d MiB (which holds %d partitions); raise the limit,"
                " lower max.buffered.bytes or run more replicas (docs/scaling.md)",
                m["partitions_assigned"],
                m["needed_bytes"] // 2**20,
                m["limit_bytes"] // 2**20,
                within,
            )
        elif self._over_memory and not over:
            log.info(
                "%d partitions assigned: within the memory limit again", m["partitions_assigned"]
            )
        self._over_memory = over

    def status_fields(self) -> dict[str, Any]:
        since = self._committer.failing_since
        out: dict[str, Any] = {
            # Seconds every commit has been failing (null: the last one succeeded).
            "commits_failing_s": None if since is None else round(time.monotonic() - since, 3),
            "crash_accounting": "horizon" if self._horizon else "write_ahead",
            "memory": {**self.memory(), "over_limit": self._over_memory},
        }
        out.update(self.isolation_summary())
        if self._tier_topics:
            out["retry_tiers"] = self.tier_summary()
        return out

    def tier_summary(self) -> dict[str, dict[str, int | None]]:
        """Per retry tier (its label): records waiting (written, not yet done: from the tier
        partitions' committed offsets to their high watermarks; None before any is known) and
        of those the ones fetched and held until due (`/v1/status`, metrics)."""
        stopping = self._outlet.room().stopping
        high = self._source.high_watermarks() if not stopping else {}
        out: dict[str, dict[str, int | None]] = {
            label: {"waiting": None, "held": 0} for label in self._tier_topics.values()
        }
        for (topic, partition), state in self._states.items():
            label = self._tier_topics.get(topic)
            if label is None:
                continue
            st = state.ledger.statistics()
            row = out[label]
            row["held"] = (row["held"] or 0) + st.buffered
            hi = high.get((topic, partition))
            if hi is not None:
                committed = state.last_commit[0] if state.last_commit else st.committable_offset
                row["waiting"] = (row["waiting"] or 0) + max(0, hi - committed)
        return out

    def isolation_summary(self) -> dict[str, Any]:
        """Crash isolation across the assigned partitions (`/v1/status`, metrics)."""
        statuses = [s.ledger.horizon_status() for s in self._states.values()]
        return {
            "isolation_active": any(h.pass_active for h in statuses),
            "suspects_left": sum(h.suspects_left for h in statuses),
            "suspects_total": sum(h.suspects_total for h in statuses),
            "isolated_total": sum(h.isolated_total for h in statuses),
        }

    def partitions(self) -> list[dict[str, Any]]:
        stopping = self._outlet.room().stopping
        lag = self._source.lag() if not stopping else {}
        high = self._source.high_watermarks() if not stopping else {}
        paused = self._source.paused
        out = []
        for (topic, partition), state in sorted(self._states.items()):
            st = state.ledger.statistics()
            hz = state.ledger.horizon_status()
            # Records not finished: from the committed offset (the committable one before this
            # process's first commit) to the high watermark, held records included.
            hi = high.get((topic, partition))
            committed = state.last_commit[0] if state.last_commit else st.committable_offset
            out.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "committable_offset": st.committable_offset,
                    "last_committed_offset": state.last_commit[0] if state.last_commit else None,
                    "in_flight": st.in_flight,
                    "buffered": st.buffered,
                    "buffered_bytes": st.buffered_bytes,
                    "archiving": st.archiving,
                    "paused": (topic, partition) in paused,
                    "lag": lag.get((topic, partition)),
                    "committed_lag": None if hi is None else max(0, hi - committed),
                    "horizon_committed": hz.horizon_committed,
                    "isolation": hz.isolation.value,
                    "suspects_left": hz.suspects_left,
                    "suspects_total": hz.suspects_total,
                    "isolated_total": hz.isolated_total,
                }
            )
        for topic, partition in sorted(self._partitions.pending):
            # Assigned with no committed offset and nothing fetched yet: no ledger so far.
            out.append(
                {
                    "topic": topic,
                    "partition": partition,
                    "committable_offset": None,
                    "last_committed_offset": None,
                    "in_flight": 0,
                    "buffered": 0,
                    "buffered_bytes": 0,
                    "archiving": 0,
                    "paused": (topic, partition) in paused,
                    "lag": lag.get((topic, partition)),
                }
            )
        return out


__all__ = ["COMMITS_FAILING_NOT_READY_S", "ConsumerView", "memory_limit_bytes"]
