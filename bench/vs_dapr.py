"""The sidecar side by side with Dapr (daprd v1.14.0, its Kafka pub/sub), ``python -m bench --scenarios
dapr-vs-sidecar``: the same broker, records, app and machine, one sidecar each, runs alternated.

Scenarios (each selected by name or prefix; ``all`` does not include them, since they need daprd,
built once by ``scripts/install-daprd``):

    dapr-vs-sidecar-single  saturation: the topic's records as fast as they go, one record per request
                            (the sidecar's single mode, TCP, ordering key; Dapr's subscription)
    dapr-vs-sidecar-bulk    the same, many records per request (the sidecar's batch mode, 100 records
                            or 5 ms; Dapr's bulk subscribe, maxMessagesCount 100, maxAwaitDurationMs 5)
    dapr-vs-sidecar-rates   CPU per record at each ``--rates`` offered (100 and 1,000 records/s), and
                            the added latency p50 / p99 at ``--latency-rate`` over a raw consumer
                            measured in the same rounds
    dapr-vs-sidecar-idle    CPU with the partitions assigned and no records

The app is the bench app (``bench.benchapp``: asyncio + httptools), answering at once in either
contract: an empty 200 for the sidecar, ``{"status":"SUCCESS"}`` (one status per entry in bulk) for
Dapr. CPU is the measured process's utime + stime from /proc (all its threads), from its first record
to its last; records/s from the app's first record to the last one done (the sidecar: every offset
committable; Dapr: the app has answered every record, since sarama marks a record's offset when its
handler returns); peak RSS is VmHWM. Each round runs the contenders in turn, the order flipped every
round, so a change in the machine's load hits both alike.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from bench.app import App
from bench.broker import PARTITIONS, VALUE_BYTES, Broker
from bench.dapr import DAPR_VERSION, DaprSetup, running_daprd, wait_group_assigned
from bench.measure import (
    ROOT,
    busiest_thread_shares,
    cpu_seconds,
    percentile,
    proc_status_kb,
    schedstat,
    wakeups,
)
from bench.runs import run_idle, run_latency, run_sidecar_throughput
from bench.sidecars import Side, wait_until

DAPR_SCENARIOS = [
    "dapr-vs-sidecar-single",
    "dapr-vs-sidecar-bulk",
    "dapr-vs-sidecar-rates",
    "dapr-vs-sidecar-idle",
]
CONTENDERS = ("sidecar", "dapr")
# The sidecar's scenario in each (bench.sidecars.sidecar_config's names).
SIDECAR_SCENARIO = {"dapr-vs-sidecar-single": "c-tcp-key", "dapr-vs-sidecar-bulk": "d-tcp-key"}
TARGETS = {  # sidecar ÷ Dapr
    "cpu_per_record_100": ("<=", 0.7),
    "cpu_per_record_1000": ("<=", 0.7),
    "saturation_single": (">=", 2.0),
    "saturation_bulk": (">=", 1.2),
    "added_p50_1000": ("<=", 1.0),
    "added_p99_1000": ("<=", 1.0),
}


def selected(wanted: list[str]) -> list[str]:
    return [s for s in DAPR_SCENARIOS if any(s == w or s.startswith(w) for w in wanted)]


# ------------------------------------------------------------------------------------- Dapr runs


def run_dapr_throughput(
    broker: Broker, topic: str, total: int, app: App, directory: str, name: str, bulk: bool
) -> dict[str, Any]:
    group = f"bench-dapr-{name}-{uuid.uuid4().hex[:8]}"
    app.reset()
    setup = DaprSetup(broker.bootstrap, topic, group, app.port, bulk=bulk)
    with running_daprd(setup, directory, name) as proc:
        wait_until(lambda: app.stats()["records"] > 0, 90, "daprd's first record", proc)
        cpu0, sched0, t0 = cpu_seconds(proc.pid), schedstat(proc.pid), time.monotonic()
        wait_until(lambda: app.stats()["records"] >= total, 300, "every record (daprd)", proc)
        end_ns = time.monotonic_ns()
        cpu1 = cpu_seconds(proc.pid)
        shares = busiest_thread_shares(sched0, schedstat(proc.pid), time.monotonic() - t0)
        rss_peak_kb = proc_status_kb(proc.pid, "VmHWM")
        stats = app.stats()
    elapsed = (end_ns - stats["first_ns"]) / 1e9
    return {
        "records_per_s": total / elapsed,
        "cpu_s_per_10k": (cpu1 - cpu0) / total * 10_000,
        "peak_rss_mb": rss_peak_kb / 1024,
        "app_requests": stats["requests"],
        "app_records": stats["records"],
        **shares,
    }


def run_dapr_latency(
    broker: Broker, app: App, directory: str, rate: float, seconds: float
) -> dict[str, Any]:
    """Records offered at ``rate`` through daprd: receive - produce per record, and daprd's CPU (as
    ``bench.runs.run_latency`` measures the sidecar)."""
    topic = broker.create_topic(f"bench-lat-dapr-{uuid.uuid4().hex[:6]}")
    group = f"bench-lat-dapr-{uuid.uuid4().hex[:8]}"
    count = int(rate * seconds)
    app.reset(latency=1)
    setup = DaprSetup(broker.bootstrap, topic, group, app.port)
    with running_daprd(setup, directory, f"lat-{int(rate)}") as proc:
        wait_group_assigned(broker.bootstrap, group, PARTITIONS, proc)
        time.sleep(1.0)
        cpu0, t0, wakes0 = cpu_seconds(proc.pid), time.monotonic(), wakeups(proc.pid)
        acks = broker.produce_at_rate(topic, rate, seconds)
        wait_until(lambda: len(app.stats()["latencies_ns"]) >= count, 60, "every record", proc)
        cpu = cpu_seconds(proc.pid) - cpu0
        wakes = wakeups(proc.pid) - wakes0
        share = cpu / (time.monotonic() - t0)
        rss_peak_kb = proc_status_kb(proc.pid, "VmHWM")
    latencies = app.stats()["latencies_ns"]
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
        "sidecar_cpu_share": share,
        "sidecar_cpu_us_per_record": cpu / max(1, count) * 1e6,
        "wakeups_per_record": wakes / max(1, count),
        "peak_rss_mb": rss_peak_kb / 1024,
    }


def run_dapr_idle(broker: Broker, app: App, directory: str, seconds: float) -> dict[str, Any]:
    topic = broker.create_topic(f"bench-idle-dapr-{uuid.uuid4().hex[:6]}")
    group = f"bench-idle-dapr-{uuid.uuid4().hex[:8]}"
    setup = DaprSetup(broker.bootstrap, topic, group, app.port)
    with running_daprd(setup, directory, "idle") as proc:
        wait_group_assigned(broker.bootstrap, group, PARTITIONS, proc)
        time.sleep(2.0)  # start-up work is not idling (as run_idle)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        cpu = cpu_seconds(proc.pid) - cpu0
        elapsed = time.monotonic() - t0
        rss_peak_kb = proc_status_kb(proc.pid, "VmHWM")
        if proc.poll() is not None:
            raise RuntimeError(f"daprd exited ({proc.returncode}) while idle")
    return {
        "seconds": elapsed,
        "cpu_s": cpu,
        "cpu_share": cpu / elapsed,
        "peak_rss_mb": rss_peak_kb / 1024,
    }


# ------------------------------------------------------------------------------------- the part


def part_dapr(
    broker: Broker, app: App, directory: str, args: Any, scenarios: list[str]
) -> dict[str, Any]:
    """Every selected scenario, ``args.runs`` rounds (``args.part_runs`` for rates and idle), the
    contenders alternated; the medians and the targets' ratios."""
    from bench.measure import git_commit

    side = Side("new", ROOT)
    out: dict[str, Any] = {
        "dapr_version": DAPR_VERSION,
        "commit": git_commit(ROOT),
        "records": args.records,
        "value_bytes": VALUE_BYTES,
        "partitions": PARTITIONS,
        "load_average_start": os.getloadavg(),
        "runs": {},
    }
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def order(round_no: int) -> tuple[str, ...]:
        return CONTENDERS if round_no % 2 == 0 else CONTENDERS[::-1]

    saturation = [s for s in scenarios if s in SIDECAR_SCENARIO]
    if saturation:
        topic = broker.create_topic(f"bench-vs-dapr-{uuid.uuid4().hex[:8]}")
        print(f"producing {args.records:,} records (1 KiB, 10k keys) to {topic} ...", flush=True)
        broker.produce_bulk(topic, args.records, VALUE_BYTES)
        ends = broker.end_offsets(topic)
        total = sum(ends.values())
        for round_no in range(args.runs):
            for scenario in saturation:
                for who in order(round_no):
                    name = f"{scenario}-{round_no}"
                    if who == "sidecar":
                        r = run_sidecar_throughput(
                            SIDECAR_SCENARIO[scenario], broker, topic, ends, app, directory,
                            round_no, side,
                        )  # fmt: skip
                    else:
                        bulk = scenario.endswith("bulk")
                        r = run_dapr_throughput(broker, topic, total, app, directory, name, bulk)
                    runs.setdefault((scenario, who), []).append(r)
                    print(
                        f"  {scenario} {who:<8} run {round_no + 1}: {r['records_per_s']:>8,.0f} rec/s"
                        f"  {r['cpu_s_per_10k'] * 100:.0f} µs/record  {r['peak_rss_mb']:.0f} MB;"
                        f" busiest thread ran {r.get('busiest_ran_share', 0) * 100:.0f} %,"
                        f" waited for a core {r.get('busiest_waited_share', 0) * 100:.0f} %",
                        flush=True,
                    )
    if "dapr-vs-sidecar-rates" in scenarios:
        rates = sorted(set([*args.rate_list, args.latency_rate]))
        for round_no in range(args.part_runs):
            raw = run_latency(
                "a", broker, app, directory, args.latency_rate, args.rate_seconds, side
            )
            runs.setdefault((f"rate-{args.latency_rate:g}", "raw"), []).append(raw)
            print(
                f"  {args.latency_rate:,.0f}/s raw consumer: p50 {raw['p50_ms']:.2f}"
                f" p99 {raw['p99_ms']:.2f} ms",
                flush=True,
            )
            for rate in rates:
                for who in order(round_no):
                    if who == "sidecar":
                        r = run_latency(
                            "c-tcp-key", broker, app, directory, rate, args.rate_seconds, side
                        )
                    else:
                        r = run_dapr_latency(broker, app, directory, rate, args.rate_seconds)
                    runs.setdefault((f"rate-{rate:g}", who), []).append(r)
                    print(
                        f"  {rate:>7,.0f}/s {who:<8}: {r['sidecar_cpu_us_per_record']:.0f} µs/record,"
                        f" {r['sidecar_cpu_share'] * 100:.1f} % of a core,"
                        f" {r['wakeups_per_record']:.1f} wake-ups; p50 {r['p50_ms']:.2f}"
                        f" p99 {r['p99_ms']:.2f} ms",
                        flush=True,
                    )
    if "dapr-vs-sidecar-idle" in scenarios and args.idle_seconds > 0:
        for round_no in range(args.part_runs):
            for who in order(round_no):
                if who == "sidecar":
                    r = run_idle(broker, app, directory, args.idle_seconds, side)
                else:
                    r = run_dapr_idle(broker, app, directory, args.idle_seconds)
                runs.setdefault(("idle", who), []).append(r)
                print(f"  idle {who:<8}: {r['cpu_share'] * 100:.2f} % of a core", flush=True)
    out["load_average_end"] = os.getloadavg()
    for (what, who), found in runs.items():
        out["runs"].setdefault(what, {})[who] = {"median": medians(found), "runs": found}
    out["figures"] = figures_of(out["runs"], args.latency_rate)
    out["targets"] = targets_of(out["figures"])
    return out


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def figures_of(runs: dict[str, Any], latency_rate: float) -> dict[str, dict[str, float]]:
    """figure name -> {"sidecar": ..., "dapr": ...}: the medians the table and the targets use."""
    out: dict[str, dict[str, float]] = {}

    def put(name: str, what: str, key: str, scale: float = 1.0) -> None:
        found = runs.get(what, {})
        if all(who in found and key in found[who]["median"] for who in CONTENDERS):
            out[name] = {who: found[who]["median"][key] * scale for who in CONTENDERS}

    put("saturation_single", "dapr-vs-sidecar-single", "records_per_s")
    put("saturation_bulk", "dapr-vs-sidecar-bulk", "records_per_s")
    put("cpu_per_record_single", "dapr-vs-sidecar-single", "cpu_s_per_10k", 100)
    put("cpu_per_record_bulk", "dapr-vs-sidecar-bulk", "cpu_s_per_10k", 100)
    put("waited_single", "dapr-vs-sidecar-single", "busiest_waited_share", 100)
    put("waited_bulk", "dapr-vs-sidecar-bulk", "busiest_waited_share", 100)
    for what, found in runs.items():
        if what.startswith("rate-") and "sidecar" in found:
            rate = what.removeprefix("rate-")
            put(f"cpu_per_record_{rate}", what, "sidecar_cpu_us_per_record")
            put(f"cpu_share_{rate}", what, "sidecar_cpu_share", 100)
            put(f"wakeups_{rate}", what, "wakeups_per_record")
    lat = f"rate-{latency_rate:g}"
    raw = runs.get(lat, {}).get("raw")
    if raw and all(who in runs[lat] for who in CONTENDERS):
        for q in ("p50", "p99"):
            out[f"{q}_{latency_rate:g}"] = {
                who: runs[lat][who]["median"][f"{q}_ms"] for who in CONTENDERS
            }
            out[f"added_{q}_{latency_rate:g}"] = {
                who: runs[lat][who]["median"][f"{q}_ms"] - raw["median"][f"{q}_ms"]
                for who in CONTENDERS
            }
    put("idle_cpu_share", "idle", "cpu_share", 100)
    peaks: dict[str, float] = {}
    for found in runs.values():
        for who in CONTENDERS:
            for r in found.get(who, {}).get("runs", []):
                if "peak_rss_mb" in r:
                    peaks[who] = max(peaks.get(who, 0.0), r["peak_rss_mb"])
    if all(who in peaks for who in CONTENDERS):
        out["peak_rss_mb"] = peaks
    return out


def targets_of(figures: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, (op, wanted) in TARGETS.items():
        found = figures.get(name)
        if not found:
            continue
        if name.startswith("added_"):
            # "no more added latency": the sidecar's added latency at most Dapr's
            met = found["sidecar"] <= found["dapr"]
            out[name] = {"sidecar": found["sidecar"], "dapr": found["dapr"], "met": met}
            continue
        ratio = found["sidecar"] / found["dapr"] if found["dapr"] else float("nan")
        met = ratio <= wanted if op == "<=" else ratio >= wanted
        out[name] = {"ratio": ratio, "wanted": f"{op} {wanted:g}", "met": met}
    return out


LABELS = {
    "saturation_single": ("records/s, single (one record per request)", "{:,.0f}"),
    "saturation_bulk": ("records/s, batch / bulk (100 records or 5 ms)", "{:,.0f}"),
    "cpu_per_record_single": ("CPU per record at saturation, single (µs)", "{:,.0f}"),
    "cpu_per_record_bulk": ("CPU per record at saturation, batch / bulk (µs)", "{:,.0f}"),
    "waited_single": ("busiest thread queued for a core, single (%)", "{:.0f}"),
    "waited_bulk": ("busiest thread queued for a core, batch / bulk (%)", "{:.0f}"),
    "cpu_per_record_100": ("CPU per record at 100 records/s offered (µs)", "{:,.0f}"),
    "cpu_per_record_1000": ("CPU per record at 1,000 records/s offered (µs)", "{:,.0f}"),
    "cpu_share_100": ("share of a core at 100 records/s (%)", "{:.1f}"),
    "cpu_share_1000": ("share of a core at 1,000 records/s (%)", "{:.1f}"),
    "wakeups_100": ("thread wake-ups per record at 100/s", "{:.1f}"),
    "wakeups_1000": ("thread wake-ups per record at 1,000/s", "{:.1f}"),
    "p50_1000": ("latency p50 at 1,000/s (ms)", "{:.2f}"),
    "p99_1000": ("latency p99 at 1,000/s (ms)", "{:.2f}"),
    "added_p50_1000": ("added p50 over a raw consumer (ms)", "{:.2f}"),
    "added_p99_1000": ("added p99 over a raw consumer (ms)", "{:.2f}"),
    "idle_cpu_share": ("idle CPU, partitions assigned (% of a core)", "{:.2f}"),
    "peak_rss_mb": ("peak RSS over the runs (MB)", "{:.0f}"),
}


def print_dapr(result: dict[str, Any]) -> None:
    print(
        f"\nThe sidecar ({result['commit']}) and Dapr {result['dapr_version']} (Kafka pub/sub),"
        f" {result['records']:,} records of {result['value_bytes']} B, {result['partitions']}"
        f" partitions; load average {result['load_average_start'][0]:.1f} at the start,"
        f" {result['load_average_end'][0]:.1f} at the end"
    )
    print(f"| {'figure':<50} | {'sidecar':>9} | {'Dapr':>9} | {'sidecar ÷ Dapr':>14} |")
    print(f"|{'-' * 52}|{'-' * 11}|{'-' * 11}|{'-' * 16}|")
    for name, found in result["figures"].items():
        label, fmt = LABELS.get(name, (name, "{:.2f}"))
        ratio = found["sidecar"] / found["dapr"] if found["dapr"] else float("nan")
        print(
            f"| {label:<50} | {fmt.format(found['sidecar']):>9} | {fmt.format(found['dapr']):>9}"
            f" | {ratio:>14.2f} |"
        )
    print("targets (sidecar ÷ Dapr, from this run):")
    for name, t in result["targets"].items():
        state = "met" if t["met"] else "MISSED"
        if "ratio" in t:
            print(f"  {name:<22} {t['ratio']:.2f} (wanted {t['wanted']}): {state}")
        else:
            print(f"  {name:<22} {t['sidecar']:.2f} against {t['dapr']:.2f} ms: {state}")
