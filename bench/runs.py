"""The runs of the sidecar and the bare consumers: throughput, latency, the floor, idle, backlog.

Each run returns one dict of figures; ``bench.sidecar_bench`` repeats them over the sides and
takes the medians. The crash-isolation run is ``bench.killer``.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from bench import flood
from bench.app import App
from bench.broker import Broker
from bench.children import run_child
from bench.measure import (
    busiest_thread_shares,
    cpu_seconds,
    percentile,
    proc_status_kb,
    schedstat,
    thread_cpu_seconds,
    wakeups_by_thread,
)
from bench.sidecars import (
    Side,
    api_get,
    running_sidecar,
    share_idle,
    sidecar_config,
    status_done,
    wait_assigned,
    wait_until,
)

# Tracing scenarios: OTLP over HTTP to the bench app, which accepts and drops the spans (its
# /v1/traces route); the sampler and the endpoint come from the standard OTEL_* variables the
# sidecar honours (the endpoint is added per run: the app's port).
SIDECAR_ENV = {
    "f-on": {"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
    "f-on-10pct": {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    },
}


# ---------------------------------------------------------------------------------- throughput


def run_sidecar_throughput(
    scenario: str,
    broker: Broker,
    topic: str,
    ends: dict[int, int],
    app: App,
    directory: str,
    run: int,
    side: Side,
) -> dict[str, Any]:
    total = sum(ends.values())
    group = f"bench-{side.name}-{scenario}-{run}-{uuid.uuid4().hex[:8]}"
    api_path = os.path.join(directory, f"api-{side.name}-{scenario}-{run}.sock")
    config = flood.configure(
        sidecar_config(scenario, broker.bootstrap, topic, group, app, api_path)
    )
    tiers = scenario.startswith("t-")
    app.reset(fail=1 if scenario.startswith("e") else 0, tier=1 if tiers else 0)
    env = dict(SIDECAR_ENV.get(scenario, {}))
    if scenario.startswith("f-on"):
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"http://127.0.0.1:{app.port}/v1/traces"
    share = scenario.startswith("g-")
    with (
        running_sidecar(config, directory, f"{scenario}-{run}", side, env) as proc,
        flood.holding() as held,
    ):
        wait_until(lambda: app.stats()["records"] > 0, 60, "the first record", proc)
        cpu0, app_cpu0 = cpu_seconds(proc.pid), app.cpu()
        sched0, t0 = schedstat(proc.pid), time.monotonic()
        wait_until(lambda: app.stats()["records"] >= total, 300, "every record", proc)
        if tiers:  # and every released record back from its tier (or its backoff)
            wait_until(
                lambda: (st := app.stats())["records"] >= total + st["released"],
                300,
                "every released record again",
                proc,
            )
        if share:
            wait_until(lambda: share_idle(api_path), 120, "every record acknowledged", proc)
        else:
            wait_until(lambda: status_done(api_path, topic, ends), 120, "every offset done", proc)
        end_ns = time.monotonic_ns()
        cpu1, app_cpu1 = cpu_seconds(proc.pid), app.cpu()
        shares = busiest_thread_shares(sched0, schedstat(proc.pid), time.monotonic() - t0)
        rss_peak_kb = proc_status_kb(proc.pid, "VmHWM")
        stats = app.stats()
        status = api_get(api_path, "/v1/status")
    elapsed = (end_ns - stats["first_ns"]) / 1e9
    return {
        "records_per_s": total / elapsed,
        "cpu_s_per_10k": (cpu1 - cpu0) / total * 10_000,
        "peak_rss_mb": rss_peak_kb / 1024,
        "app_cpu_share": (app_cpu1 - app_cpu0) / elapsed,
        "app_requests": stats["requests"],
        # The longest time the app went without a request: a stall in fetching shows here.
        "longest_gap_ms": stats.get("longest_gap_ns", 0) / 1e6,
        "app_records": stats["records"],
        "span_exports": stats.get("span_exports", 0),
        "rejected": stats["rejected"],
        "released": stats["released"],
        **(
            {
                "clean_records_per_s": stats["clean"]
                / ((stats["clean_last_ns"] - stats["first_ns"]) / 1e9)
            }
            if tiers and stats["clean_last_ns"] > stats["first_ns"]
            else {}
        ),
        "counters": status["counters"] if status else None,
        **held.figures(stats["first_ns"]),
        **shares,
    }


# ------------------------------------------------------------------------------------- latency


def warm_up(broker: Broker, topic: str, app: App, proc: Any) -> None:
    """A share group: records offered (20/s) until the app has one, then the app's counts reset.
    A new share member gets its partitions on its second heartbeat (5 s with Kafka's defaults):
    measured from subscribing, that wait would be the latency figure."""
    deadline = time.monotonic() + 60
    while app.stats()["records"] == 0:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("no record reached the app in the warm-up")
        broker.produce_at_rate(topic, 20, 0.25)
    time.sleep(0.5)  # the warm-up's last records answered
    app.reset(latency=1)


def run_latency(
    scenario: str,
    broker: Broker,
    app: App,
    directory: str,
    rate: float,
    seconds: float,
    side: Side,
) -> dict[str, Any]:
    """Records offered at ``rate`` for ``seconds``: receive - produce per record, and the CPU."""
    topic = broker.create_topic(f"bench-lat-{scenario}-{uuid.uuid4().hex[:6]}")
    count = int(rate * seconds)
    extra: dict[str, Any] = {}
    app.reset(latency=1)
    if scenario in ("a", "b"):
        acks: list[int] = []

        def produce() -> None:
            time.sleep(1.0)  # let the first fetch settle
            acks.extend(broker.produce_at_rate(topic, rate, seconds))

        result = run_child(
            "ceiling" if scenario == "a" else "bridge",
            broker,
            topic,
            count,
            app if scenario == "b" else None,
            latency=True,
            on_ready=produce,
        )
        latencies = result["latencies_ns"] if scenario == "a" else app.stats()["latencies_ns"]
    else:
        name = f"lat-{scenario}-{int(rate)}"
        api_path = os.path.join(directory, f"api-{side.name}-{name}.sock")
        group = f"bench-lat-{side.name}-{scenario}-{uuid.uuid4().hex[:8]}"
        config = sidecar_config(scenario, broker.bootstrap, topic, group, app, api_path)
        with running_sidecar(config, directory, name, side) as proc:
            wait_assigned(api_path, proc)
            if scenario.startswith("g-share"):
                warm_up(broker, topic, app, proc)
            time.sleep(1.0)
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            threads0, wakes0 = thread_cpu_seconds(proc.pid), wakeups_by_thread(proc.pid)
            acks = broker.produce_at_rate(topic, rate, seconds)
            wait_until(lambda: len(app.stats()["latencies_ns"]) >= count, 60, "every record", proc)
            cpu = cpu_seconds(proc.pid) - cpu0
            threads1 = thread_cpu_seconds(proc.pid)
            wakes1 = wakeups_by_thread(proc.pid)
            extra["wakeups_per_record"] = (sum(wakes1.values()) - sum(wakes0.values())) / max(
                1, count
            )
            extra["wakeups_by_thread"] = {
                name: round((wakes1[name] - wakes0.get(name, 0)) / max(1, count), 2)
                for name in sorted(wakes1)
                if wakes1[name] - wakes0.get(name, 0) > 0
            }
            # µs per record by thread (10 ms ticks each: a rough split, the total above is exact).
            extra["threads_us_per_record"] = {
                name: round((threads1[name] - threads0.get(name, 0.0)) / max(1, count) * 1e6)
                for name in sorted(threads1)
                if threads1[name] - threads0.get(name, 0.0) > 0
            }
            # The share of a core while records are offered; the CPU of the records' delivery
            # after the last one was produced is in the per-record figure too.
            extra["sidecar_cpu_share"] = cpu / (time.monotonic() - t0)
            extra["sidecar_cpu_us_per_record"] = cpu / max(1, count) * 1e6
        latencies = app.stats()["latencies_ns"]
    # The first 10 % are warm-up (connections opening, first fetch).
    kept = [v / 1e6 for v in latencies[len(latencies) // 10 :]]
    acked = [v / 1e6 for v in acks[len(acks) // 10 :]]
    return {
        "records": len(latencies),
        "rate": rate,
        "produce_ack_p50_ms": percentile(acked, 50),
        "produce_ack_p99_ms": percentile(acked, 99),
        "p50_ms": percentile(kept, 50),
        "p99_ms": percentile(kept, 99),
        "max_ms": max(kept) if kept else float("nan"),
        **extra,
    }


def run_floor(broker: Broker, rate: float, seconds: float) -> dict[str, Any]:
    """The floor at an offered rate: a bare consumer's CPU per record (see ``child_main``)."""
    topic = broker.create_topic(f"bench-floor-{uuid.uuid4().hex[:6]}")
    count = int(rate * seconds)

    def produce() -> None:
        time.sleep(1.0)  # let the first fetch settle, as the sidecar's runs do
        broker.produce_at_rate(topic, rate, seconds)

    result = run_child("floor", broker, topic, count, None, on_ready=produce)
    cpu_s = result["cpu_s_per_10k"] * count / 10_000
    return {
        "rate": rate,
        "records": count,
        "consumer_cpu_us_per_record": cpu_s / max(1, count) * 1e6,
        "consumer_cpu_share": cpu_s / seconds,
    }


# ------------------------------------------------------------------------------------- idle


def run_idle(
    broker: Broker, app: App, directory: str, seconds: float, side: Side
) -> dict[str, Any]:
    """The sidecar with its partitions assigned and no records: its CPU over ``seconds``."""
    topic = broker.create_topic(f"bench-idle-{uuid.uuid4().hex[:6]}")
    api_path = os.path.join(directory, f"api-{side.name}-idle.sock")
    group = f"bench-idle-{side.name}-{uuid.uuid4().hex[:8]}"
    config = sidecar_config("c-tcp-key", broker.bootstrap, topic, group, app, api_path)
    with running_sidecar(config, directory, "idle", side) as proc:
        wait_assigned(api_path, proc)
        time.sleep(2.0)  # start-up work (imports, first commits, metadata) is not idling
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        cpu = cpu_seconds(proc.pid) - cpu0
        elapsed = time.monotonic() - t0
        if proc.poll() is not None:
            raise RuntimeError(f"the sidecar exited ({proc.returncode}) while idle")
    return {"seconds": elapsed, "cpu_s": cpu, "cpu_share": cpu / elapsed}


# ------------------------------------------------------------------------------------- backlog


def produce_backlog(broker: Broker, records: int, value_bytes: int) -> str:
    # Larger records than the broker's default limit (1 MiB values plus framing) need the topic's
    # own max.message.bytes.
    config = {"max.message.bytes": str(max(1_048_588, 2 * value_bytes))}
    topic = broker.create_topic(
        f"bench-backlog-{value_bytes}-{uuid.uuid4().hex[:6]}", config=config
    )
    print(f"  producing {records:,} records of {value_bytes:,} B ...", flush=True)
    broker.produce_bulk(topic, records, value_bytes)
    return topic


def run_backlog(
    broker: Broker,
    topic: str,
    app: App,
    directory: str,
    records: int,
    value_bytes: int,
    delay_ms: int,
    seconds: float,
    side: Side,
) -> dict[str, Any]:
    """A backlog of ``records`` behind an app answering after ``delay_ms``: the sidecar's RSS, and
    its CPU while the app holds it back (librdkafka's queue full, the partitions' shares full)."""
    app.reset(delay_ms=delay_ms)
    name = f"backlog-{value_bytes}"
    api_path = os.path.join(directory, f"api-{side.name}-{name}.sock")
    group = f"bench-backlog-{side.name}-{uuid.uuid4().hex[:8]}"
    config = sidecar_config("c-tcp-key", broker.bootstrap, topic, group, app, api_path)
    samples: list[tuple[float, float, int]] = []
    with running_sidecar(config, directory, name, side) as proc:
        wait_until(lambda: app.stats()["records"] > 0, 60, "the first record", proc)
        start = time.monotonic()
        cpu_start, delivered_start = cpu_seconds(proc.pid), app.stats()["records"]
        while time.monotonic() - start < seconds:
            status = api_get(api_path, "/v1/status") or {"partitions": []}
            # The ledger's buffered count includes the records in flight.
            buffered = sum(p["buffered"] for p in status["partitions"])
            samples.append(
                (time.monotonic() - start, proc_status_kb(proc.pid, "VmRSS") / 1024, buffered)
            )
            if proc.poll() is not None:
                raise RuntimeError(f"the sidecar exited ({proc.returncode}) during the backlog")
            time.sleep(0.5)
        peak = proc_status_kb(proc.pid, "VmHWM") / 1024
        cpu_s = cpu_seconds(proc.pid) - cpu_start
        elapsed = time.monotonic() - start
        delivered = app.stats()["records"]
    app.reset()
    half = [rss for t, rss, _ in samples if t >= seconds / 2] or [samples[-1][1]]
    return {
        "backlog_records": records,
        "value_bytes": value_bytes,
        "app_delay_ms": delay_ms,
        "seconds": seconds,
        "delivered": delivered,
        "cpu_share": cpu_s / elapsed,
        "cpu_us_per_record": cpu_s * 1e6 / max(1, delivered - delivered_start),
        "held_in_sidecar_max": max(b for _, _, b in samples),
        "rss_first_mb": samples[0][1],
        "rss_second_half_max_mb": max(half),
        "rss_last_mb": samples[-1][1],
        "peak_rss_mb": peak,
        "samples": [(round(t, 1), round(r, 1), b) for t, r, b in samples],
    }
