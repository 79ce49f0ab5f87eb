"""Crash isolation: a killer record whose delivery makes the app SIGKILL the sidecar.

``run_killer`` restarts the sidecar after each death until the killer is in the DLQ, and counts
the deaths, the innocent records dead-lettered and the killer's deliveries. Variants: engine
consumer with ordering none and key, and engine share (``KILLER_VARIANTS``).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import dataclass
from typing import Any

from bench.app import App
from bench.broker import Broker
from bench.sidecars import (
    Side,
    log_tail,
    running_sidecar,
    share_idle,
    sidecar_config,
    status_done,
)

KILLER_VARIANTS = {
    "consumer-none": ("consumer", "none"),
    "consumer-key": ("consumer", "key"),
    "share": ("share", "none"),
}


@dataclass(frozen=True)
class KillerSpec:
    records: int = 300
    hold_ms: int = 300
    limit: int = 3  # the sidecar's share.delivery.count.limit
    group_limit: int = 5  # engine share: the share group's share.delivery.count.limit
    group_lock_ms: int = 15_000  # engine share: how soon a dead consumer's records come back
    # Engine share: how long nothing may be delivered before the killer counts as dropped. A dead
    # member keeps its partitions until its share session expires (45 s by default, and a group's
    # share.session.timeout.ms cannot go below the broker's group.share.min.session.timeout.ms,
    # 45 s by default), then its records wait for their locks: 45 + 15 s, and 5 s to spare.
    share_quiet_s: float = 65.0
    share_journal: bool = True  # engine share: share.journal.path set
    incarnation_timeout_s: float = 180.0


def run_killer(
    variant: str, broker: Broker, app: App, directory: str, spec: KillerSpec, side: Side
) -> dict[str, Any]:
    """Crash isolation: the app SIGKILLs the sidecar whenever the killer record reaches it.

    ``spec.records`` records (the killer in the middle) are held ``spec.hold_ms`` each by the
    app, so many are in flight at each death. The sidecar is restarted after each death until it
    survives: the killer is in the DLQ and every other record is done (consumer engine: every
    offset committable; share engine: nothing in flight and nothing delivered for a while, which
    also catches a killer the broker archived without our DLQ record).
    """
    engine, ordering = KILLER_VARIANTS[variant]
    topic = broker.create_topic(f"bench-killer-{variant}-{uuid.uuid4().hex[:6]}")
    dlq = f"dlq.{topic}"
    broker.topics.append(dlq)  # the sidecar creates it; deleted at the end with the bench's own
    killer_index = spec.records // 2
    values = [
        b"bench-kill" if i == killer_index else b"%08d" % i + b"x" * 92 for i in range(spec.records)
    ]
    where = broker.produce_values(topic, values)
    killer = where[killer_index]
    ends = broker.end_offsets(topic)
    group = f"bench-killer-{side.name}-{variant}-{uuid.uuid4().hex[:8]}"
    kafka_extra: dict[str, Any] = {}
    journal: dict[str, Any] = {}
    if engine == "share":
        broker.set_group_config(
            group,
            {
                "share.delivery.count.limit": str(spec.group_limit),
                "share.record.lock.duration.ms": str(spec.group_lock_ms),
            },
        )
        max_deaths = max(spec.limit, spec.group_limit) + 2
        if spec.share_journal:  # kept across the incarnations, as on the chart's emptyDir
            journal = {"share.journal.path": os.path.join(directory, f"journal-{group}")}
        else:  # --killer-no-journal: the broker's counts
            journal = {"share.journal.path": None}
    else:
        # Static membership: a restarted sidecar takes over its dead incarnation's partitions at
        # once instead of after the session timeout.
        kafka_extra = {
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "group.instance.id": f"bench-{group}",
        }
        max_deaths = spec.limit + 3
    app.reset(killer=1, delay_ms=spec.hold_ms)
    deaths = 0
    death_times_s: list[float] = []
    outcome = "gave up"
    started = time.monotonic()

    def dlq_records() -> list[tuple[int, int, dict[str, bytes]]]:
        return broker.read_headers(dlq)

    def killer_dead_lettered() -> bool:
        return any(
            (int(h.get("__dlq.errors.partition", b"-1")), int(h.get("__dlq.errors.offset", b"-1")))
            == killer
            for _, _, h in dlq_records()
        )

    for incarnation in range(max_deaths + 1):
        name = f"killer-{variant}-{incarnation}"
        api_path = os.path.join(directory, f"api-{side.name}-{name}.sock")
        config = sidecar_config(
            "c-tcp-" + ordering,
            broker.bootstrap,
            topic,
            group,
            app,
            api_path,
            ordering=ordering,
            engine=engine,
            kafka_extra=kafka_extra,
            # The limit's old name: a baseline checkout from before `delivery.count.limit` reads it
            # too (the new code logs a deprecation warning).
            extra={"share.delivery.count.limit": spec.limit, **journal},
        )
        with running_sidecar(config, directory, name, side) as proc:
            # Before the sidecar can have fetched anything (its start-up takes a second or more).
            app.set_kill_pid(proc.pid)
            deadline = time.monotonic() + spec.incarnation_timeout_s
            quiet_since, last_deliveries = time.monotonic(), -1
            while time.monotonic() < deadline and proc.poll() is None:
                stats = app.stats()
                if stats["deliveries"] != last_deliveries:
                    quiet_since, last_deliveries = time.monotonic(), stats["deliveries"]
                if engine == "consumer":
                    if status_done(api_path, topic, ends) and killer_dead_lettered():
                        outcome = "survived: every offset done, the killer in the DLQ"
                elif stats["distinct_seen"] >= spec.records and share_idle(api_path):
                    # Quiet for longer than a dead member's records can take to come back, with
                    # everything delivered: the broker archived the killer itself.
                    quiet_s = time.monotonic() - quiet_since
                    if killer_dead_lettered():
                        outcome = "survived: every record delivered, the killer in the DLQ"
                    elif quiet_s > spec.share_quiet_s:
                        outcome = f"survived: nothing delivered for {quiet_s:.0f} s"
                if outcome.startswith("survived"):
                    break
                time.sleep(0.25)
            died = proc.poll() is not None
            returncode = proc.returncode
        if outcome.startswith("survived"):
            break
        if not died:
            outcome = "timed out"
            break
        if returncode != -signal.SIGKILL:
            outcome = f"exited {returncode}: {log_tail(directory, side, name, 400)!r}"
            break
        deaths += 1
        death_times_s.append(round(time.monotonic() - started, 1))
    stats = app.stats()
    app.reset()
    records = dlq_records()
    innocent = [
        (int(h.get("__dlq.errors.partition", b"-1")), int(h.get("__dlq.errors.offset", b"-1")))
        for _, _, h in records
    ]
    killer_headers = [
        h for (p, o), (_, _, h) in zip(innocent, records, strict=True) if (p, o) == killer
    ]
    innocent = [po for po in innocent if po != killer]
    messages: dict[str, int] = {}
    for _, _, h in records:
        text = h.get("__dlq.errors.message", b"").decode(errors="replace")
        messages[text] = messages.get(text, 0) + 1
    killer_dlq_count = (
        int(killer_headers[0].get("__dlq.errors.delivery.count", b"0")) if killer_headers else None
    )
    return {
        "variant": variant,
        "engine": engine,
        "ordering": ordering,
        "records": spec.records,
        "hold_ms": spec.hold_ms,
        "limit": spec.limit,
        "group_limit": spec.group_limit if engine == "share" else None,
        "share_journal": spec.share_journal if engine == "share" else None,
        "outcome": outcome,
        "deaths": deaths,
        "death_times_s": death_times_s,
        "killer_in_dlq": bool(killer_headers),
        "killer_dlq_records": len(killer_headers),
        "killer_dlq_delivery_count": killer_dlq_count,
        "killer_deliveries": len(stats["killer_counts"]),
        "killer_counts_seen": stats["killer_counts"],
        "innocent_dead_lettered": len(innocent),
        # Other records the app saw with a Kafka-Delivery-Count above 1: charged for a death.
        "innocent_counts_raised": stats["innocent_counts_raised"],
        "dlq_messages": messages,
        "distinct_delivered": stats["distinct_seen"],
        "deliveries": stats["deliveries"],
        "seconds": time.monotonic() - started,
    }
