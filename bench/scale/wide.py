"""*scale-wide*: one sidecar assigned many partitions over several topics.

Per partition count: ``TOPICS`` topics share the partitions; one record is produced to every
partition before the sidecar starts, so each partition's first delivery after its assignment can be
timed (from the sidecar's ``assigned`` log line to the app's journal entry). Then, with nothing to
read: steady RSS, CPU and the commits it sends while idle; then records at ``--scale-rate`` spread
over every partition: CPU per record and commits per second under load. Peak RSS is VmHWM.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.app import App
from bench.broker import Broker
from bench.measure import cpu_seconds, percentile, proc_status_kb, thread_cpu_seconds
from bench.scale.journal import Journal
from bench.sidecars import Side, api_get, running_sidecar, sidecar_config, wait_until

TOPICS = 4


def produce_one_each(broker: Broker, topics: dict[str, int]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for topic, partitions in topics.items():
        for p in range(partitions):
            producer.produce(topic, b"first", b"k", partition=p)
    if producer.flush(60) != 0:
        raise RuntimeError("produce did not complete")


def produce_spread(
    broker: Broker, topics: dict[str, int], rate: float, seconds: float, stop: threading.Event
) -> int:
    """``rate`` records/s for ``seconds``, round-robin over every partition of every topic."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    targets = [(t, p) for t, n in topics.items() for p in range(n)]
    count = int(rate * seconds)
    start = time.monotonic()
    for i in range(count):
        if stop.is_set():
            count = i
            break
        pause = start + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        topic, partition = targets[i % len(targets)]
        producer.produce(topic, b"%08d" % i + b"x" * 92, b"key-%05d" % i, partition=partition)
        producer.poll(0)
    producer.flush(30)
    return count


def assigned_at_ns(log_path: Path) -> int | None:
    """Wall-clock ns of the sidecar's first assignment: its ``assigned`` log line less the time the
    assignment took before it (``took_ms``: the committed offsets read, the start offsets looked
    up, the ledgers opened)."""
    if not log_path.exists():
        return None
    for line in log_path.read_text(errors="replace").splitlines():
        if '"assigned ' not in line:
            continue
        try:
            fields = json.loads(line)
            ts = fields["ts"]
        except (ValueError, KeyError):
            continue
        at = int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1e9)
        return at - int(float(fields.get("took_ms", 0)) * 1e6)
    return None


def counters(api_path: str) -> dict[str, int]:
    status = api_get(api_path, "/v1/status") or {}
    c = status.get("counters", {})
    return {
        k: int(c.get(k, 0)) for k in ("commits", "committed_partitions", "commit_metadata_bytes")
    }


def run_wide(
    broker: Broker,
    app: App,
    directory: str,
    partitions: int,
    side: Side,
    *,
    idle_s: float,
    rate: float,
    load_s: float,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    per_topic = partitions // TOPICS
    topics = {
        broker.create_topic(f"bench-wide-{partitions}-{i}-{tag}", per_topic): per_topic
        for i in range(TOPICS)
    }
    total = per_topic * TOPICS
    produce_one_each(broker, topics)
    journal_path = os.path.join(directory, f"wide-{partitions}-{tag}.journal")
    app.reset(journal=journal_path)
    name = f"wide-{partitions}"
    api_path = os.path.join(directory, f"api-{side.name}-{name}.sock")
    group = f"bench-wide-{side.name}-{partitions}-{tag}"
    config = sidecar_config(
        "c-tcp-key",
        broker.bootstrap,
        "",
        group,
        app,
        api_path,
        topics=list(topics),
        extra={"logging": {"level": "info", "format": "json"}, **(extra or {})},
    ).replace("logging:\n  level: warning\n", "")
    log_path = Path(directory) / f"{side.name}-{name}.log"

    def journal_lines() -> list[str]:
        app.stats()  # flushes the journal
        return Path(journal_path).read_text().splitlines()

    def first_deliveries() -> dict[tuple[str, int], int]:
        return Journal.parse(journal_lines()).first_delivery_ns()

    with running_sidecar(config, directory, name, side) as proc:
        started = time.monotonic()
        found = wait_until(
            lambda: f if len(f := first_deliveries()) >= total else None,
            180,
            f"a first delivery on each of {total} partitions",
            proc,
        )
        to_all_s = time.monotonic() - started
        assigned = assigned_at_ns(log_path)
        firsts_ms = sorted((ns - assigned) / 1e6 for ns in found.values()) if assigned else []
        rss_startup_peak_kb = proc_status_kb(proc.pid, "VmHWM")
        # Idle: every first record done and committed; what it costs to hold the partitions.
        time.sleep(3.0)
        c0, cpu0, t0 = counters(api_path), cpu_seconds(proc.pid), time.monotonic()
        threads0 = thread_cpu_seconds(proc.pid)
        time.sleep(idle_s)
        c1, cpu1, t1 = counters(api_path), cpu_seconds(proc.pid), time.monotonic()
        threads1 = thread_cpu_seconds(proc.pid)
        idle_rss_kb = proc_status_kb(proc.pid, "VmRSS")
        idle_elapsed = t1 - t0
        # Load: records spread over every partition.
        stop = threading.Event()
        delivered0 = len(journal_lines())
        cpu2, t2 = cpu_seconds(proc.pid), time.monotonic()
        c2 = counters(api_path)
        produced = produce_spread(broker, topics, rate, load_s, stop)
        wait_until(
            lambda: len(journal_lines()) - delivered0 >= produced,
            120,
            "every record of the load",
            proc,
        )
        cpu3, t3 = cpu_seconds(proc.pid), time.monotonic()
        c3 = counters(api_path)
        load_rss_kb = proc_status_kb(proc.pid, "VmRSS")
        peak_kb = proc_status_kb(proc.pid, "VmHWM")
        status = api_get(api_path, "/v1/status") or {}
    load_elapsed = t3 - t2

    def rate_of(a: dict[str, int], b: dict[str, int], key: str, seconds: float) -> float:
        return (b[key] - a[key]) / seconds

    return {
        "partitions": total,
        "topics": TOPICS,
        "to_all_first_deliveries_s": round(to_all_s, 2),
        "first_delivery_p50_ms": percentile(firsts_ms, 50),
        "first_delivery_p99_ms": percentile(firsts_ms, 99),
        "first_delivery_max_ms": max(firsts_ms) if firsts_ms else float("nan"),
        "startup_peak_rss_mb": rss_startup_peak_kb / 1024,
        "idle_rss_mb": idle_rss_kb / 1024,
        "idle_cpu_share": (cpu1 - cpu0) / idle_elapsed,
        # By thread (10 ms ticks: rough; the total above is exact): trio's, librdkafka's, others.
        "idle_threads_cpu_share": {
            n: round((threads1[n] - threads0.get(n, 0.0)) / idle_elapsed, 4)
            for n in sorted(threads1)
            if threads1[n] > threads0.get(n, 0.0)
        },
        "idle_commits_per_s": rate_of(c0, c1, "commits", idle_elapsed),
        "idle_partition_commits_per_s": rate_of(c0, c1, "committed_partitions", idle_elapsed),
        "idle_metadata_bytes_per_s": rate_of(c0, c1, "commit_metadata_bytes", idle_elapsed),
        "load_rate": produced / load_s,
        "load_records": produced,
        "load_cpu_us_per_record": (cpu3 - cpu2) / max(1, produced) * 1e6,
        "load_cpu_share": (cpu3 - cpu2) / load_elapsed,
        "load_commits_per_s": rate_of(c2, c3, "commits", load_elapsed),
        "load_partition_commits_per_s": rate_of(c2, c3, "committed_partitions", load_elapsed),
        "load_metadata_bytes_per_s": rate_of(c2, c3, "commit_metadata_bytes", load_elapsed),
        "load_metadata_bytes_per_partition_commit": (
            (c3["commit_metadata_bytes"] - c2["commit_metadata_bytes"])
            / max(1, c3["committed_partitions"] - c2["committed_partitions"])
        ),
        "load_rss_mb": load_rss_kb / 1024,
        "peak_rss_mb": peak_kb / 1024,
        "assigned_in_status": len(status.get("partitions", [])),
    }
