"""The benchmark's tables, targets and new/old comparison (``python -m bench``).

Pure presentation of a results dict (the JSON ``python -m bench`` writes; the parts that fill
it are in ``bench.sidecar_bench``, their runs in ``bench.runs`` and ``bench.killer``): no broker,
no processes.
A results dict holds one side's figures at its top level ("new": this checkout) and, with
``--baseline``, the other side's under ``"baseline"`` ("old"), in the same shape:

    scenarios  name -> records/s, CPU s per 10k records, peak RSS (medians of the runs)
    latency    name -> p50/p99 ms at the offered rate, the broker's produce->ack share, CPU
    rates      offered records/s -> sidecar CPU µs per record and share of a core
    floor      offered records/s -> a bare consumer's CPU µs per record at that rate (new only)
    app_alone  tcp | unix -> the sidecar's app client's CPU per request at saturation (new only)
    idle       sidecar CPU share with partitions assigned and no records
    backlogs   100B | 10KiB | 1MiB -> RSS over time behind a slow app
    killer     consumer-none | consumer-key | share -> deaths, DLQ contents, the killer's counts
    targets    the issues' targets checked against the figures above
"""

from __future__ import annotations

import statistics
from typing import Any

ALL_SCENARIOS = [
    "a",
    "b",
    "c-tcp-key",
    "c-tcp-none",
    "c-unix-key",
    "c-unix-none",
    "d-tcp-key",
    "d-unix-none",
    "e-tcp-key",
    "e-txn",
    "e-routes",
    "f-off",
    "f-on",
    "f-on-10pct",
    "g-share",
    "g-share-journal",
    "t-tiers",
    "t-memory",
]
DESCRIPTIONS = {
    "a": "raw consumer (ceiling)",
    "b": "hand-written bridge",
    "c-tcp-key": "sidecar single, TCP, key",
    "c-tcp-none": "sidecar single, TCP, none",
    "c-unix-key": "sidecar single, unix, key",
    "c-unix-none": "sidecar single, unix, none",
    "d-tcp-key": "sidecar batch, TCP, key",
    "d-unix-none": "sidecar batch, unix, none",
    "e-tcp-key": "sidecar 5% rej + 5% rel, DLQ",
    "e-txn": "... transactional DLQ",
    "e-routes": "... DLQ routes (3 rules, 3 topics)",
    "f-off": "tracing off (exporter none)",
    "f-on": "tracing on, all sampled",
    "f-on-10pct": "tracing on, 10 % parent-based",
    "g-share": "engine share, single, TCP, none",
    "g-share-journal": "... with share.journal.path",
    "t-tiers": "10 % released to a 2 s retry tier",
    "t-memory": "10 % released, 2 s kept in memory",
}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["records_per_s"] for r in runs]
    out: dict[str, Any] = {
        "records_per_s": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "cpu_s_per_10k": statistics.median(r["cpu_s_per_10k"] for r in runs),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "runs": runs,
    }
    if "longest_gap_ms" in runs[0]:
        out["longest_gap_ms"] = statistics.median(r["longest_gap_ms"] for r in runs)
    if "app_cpu_share" in runs[0]:
        out["app_cpu_share"] = statistics.median(r["app_cpu_share"] for r in runs)
    return out


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One dict of the medians of every number the runs share; the runs themselves under "runs"."""
    out: dict[str, Any] = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
    if len(runs) > 1:
        out["runs"] = runs
    return out


def print_table(figures: dict[str, Any], reference: dict[str, Any] | None = None) -> None:
    """The throughput table; ``reference`` gives a and b when ``figures`` has none (baseline)."""
    scenarios = figures["scenarios"]
    if not scenarios:
        return
    ref = (reference or figures)["scenarios"]
    ceiling = scenarios.get("a", ref.get("a", {})).get("records_per_s")
    baseline = scenarios.get("b", ref.get("b", {})).get("records_per_s")
    latency = figures.get("latency", {})
    print(
        f"{'scenario':<12}{'':<31}{'rec/s':>9}{'min-max':>17}{'/a':>8}{'/b':>7}"
        f"{'CPU s/10k':>10}{'RSS MB':>8}{'app CPU':>8}{'p50 ms':>8}{'p99 ms':>8}"
    )
    for name in ALL_SCENARIOS:
        if name not in scenarios:
            continue
        s = scenarios[name]
        label = DESCRIPTIONS[name]
        if "unavailable" in s:
            print(f"{name:<12}{label:<31}  not available: {s['unavailable']}")
            continue
        rate = s["records_per_s"]
        to_a = f"{rate / ceiling:.2g}" if ceiling else "-"
        to_b = f"{rate / baseline:.1f}" if baseline else "-"
        lat = latency.get(name)
        p50 = f"{lat['p50_ms']:.2f}" if lat else ""
        p99 = f"{lat['p99_ms']:.2f}" if lat else ""
        app_cpu = f"{s['app_cpu_share'] * 100:.0f}%" if "app_cpu_share" in s else ""
        spread = f"{s['min']:,.0f}-{s['max']:,.0f}"
        print(
            f"{name:<12}{label:<31}{rate:>9,.0f}{spread:>17}"
            f"{to_a:>8}{to_b:>7}{s['cpu_s_per_10k']:>10.2f}{s['peak_rss_mb']:>8.0f}"
            f"{app_cpu:>8}{p50:>8}{p99:>8}"
        )


def saturation_us(figures: dict[str, Any], reference: dict[str, Any] | None = None) -> float | None:
    """Sidecar CPU per record at saturation: the c-tcp-key throughput run."""
    for source in (figures, reference or {}):
        s = source.get("scenarios", {}).get("c-tcp-key", {})
        if "cpu_s_per_10k" in s:
            value: float = s["cpu_s_per_10k"] * 100  # CPU s per 10k records -> µs per record
            return value
    return None


def floor_us(
    rate: str, figures: dict[str, Any], reference: dict[str, Any] | None = None
) -> dict[str, float] | None:
    """The floor at an offered rate (issue 29): what the work itself costs per record.

    A bare confluent-kafka consumer's CPU per record at that rate (poll, commit every 1,000) plus
    the sidecar's own app client's CPU per request (the app-alone run over TCP): a sidecar in
    single mode can do no less than consume each record and send it. None when either is missing.
    """
    for source in (figures, reference or {}):
        consumer = source.get("floor", {}).get(rate)
        client = source.get("app_alone", {}).get("tcp", {}).get("client_cpu_us_per_request")
        if consumer and client is not None:
            c = float(consumer["consumer_cpu_us_per_record"])
            return {"consumer": c, "client": float(client), "total": c + float(client)}
    return None


def saturation_floor_us(
    figures: dict[str, Any], reference: dict[str, Any] | None = None
) -> float | None:
    """The floor at saturation: the raw consumer's (a) CPU per record plus the app client's."""
    for source in (figures, reference or {}):
        a = source.get("scenarios", {}).get("a", {})
        client = source.get("app_alone", {}).get("tcp", {}).get("client_cpu_us_per_request")
        if "cpu_s_per_10k" in a and client is not None:
            return float(a["cpu_s_per_10k"]) * 100 + float(client)
    return None


def backlogs_of(figures: dict[str, Any]) -> dict[str, Any]:
    if "backlogs" in figures:
        found: dict[str, Any] = figures["backlogs"]
        return found
    # A run saved before session 5 had one backlog, of 100 B records.
    return {"100B": figures["backlog"]} if "backlog" in figures else {}


def check_targets(
    figures: dict[str, Any], reference: dict[str, Any] | None = None, linger_ms: float = 5.0
) -> list[dict[str, Any]]:
    """The issues' targets, as ratios of this run's own figures (issue 19's where it set one).

    ``reference`` is the other side of a baseline comparison, for figures only one side has
    (a and b run once: they do not depend on the sidecar's code).
    """
    ref = reference or {}
    rate = {
        name: s["records_per_s"]
        for source in (ref, figures)
        for name, s in source.get("scenarios", {}).items()
        if "records_per_s" in s
    }
    out: list[dict[str, Any]] = []

    def add(what: str, value: float, op: str, target: float) -> None:
        met = value >= target if op == ">=" else value <= target if op == "<=" else value == target
        out.append({"target": what, "value": value, "wanted": f"{op} {target:g}", "met": met})

    ratios: list[tuple[str, str, str, float]] = [
        ("single mode / bridge", "c-tcp-key", "b", 10.0),
        ("batch mode / raw consumer", "d-tcp-key", "a", 0.15),
        ("DLQ path (10 % failing) / clean", "e-tcp-key", "c-tcp-key", 0.8),
        ("transactional DLQ (5 % rejects) / clean", "e-txn", "c-tcp-key", 0.6),
        ("tracing, all sampled / off", "f-on", "f-off", 0.5),
        ("tracing, 10 % sampled / off", "f-on-10pct", "f-off", 0.85),
        ("engine share / consumer engine (single, TCP, none)", "g-share", "c-tcp-none", 1.0),
    ]
    for what, num, den, target in ratios:
        if num in figures.get("scenarios", {}) and num in rate and den in rate:
            add(what, rate[num] / rate[den], ">=", target)
    saturation = saturation_us(figures, reference)
    at_1000 = figures.get("rates", {}).get("1000")
    if at_1000 and saturation:
        add(
            "CPU/record at 1,000/s / at saturation",
            at_1000["sidecar_cpu_us_per_record"] / saturation,
            "<=",
            1.5,
        )
    # Issue 29: CPU per record against the floor measured in the same run.
    for rate_key, label, target in (("1000", "1,000", 1.5), ("100", "100", 2.0)):
        at = figures.get("rates", {}).get(rate_key)
        floor = floor_us(rate_key, figures, reference)
        if at and floor:
            add(
                f"CPU/record at {label}/s / the floor",
                at["sidecar_cpu_us_per_record"] / floor["total"],
                "<=",
                target,
            )
    if "idle" in figures:
        add("idle CPU, % of a core", figures["idle"]["cpu_share"] * 100, "<=", 0.5)
    latency = figures.get("latency", {})
    raw = latency.get("a", ref.get("latency", {}).get("a"))
    if raw and "c-tcp-key" in latency:
        add("added p50 ms at 1,000/s (c-tcp-key - a)", latency["c-tcp-key"]["p50_ms"] - raw["p50_ms"], "<=", 0.5)  # fmt: skip
        add("added p99 ms at 1,000/s (c-tcp-key - a)", latency["c-tcp-key"]["p99_ms"] - raw["p99_ms"], "<=", 2.0)  # fmt: skip
    if raw and "d-tcp-key" in latency:
        add(
            "batch: added p99 ms (d-tcp-key - a)",
            latency["d-tcp-key"]["p99_ms"] - raw["p99_ms"],
            "<=",
            linger_ms + 5,
        )
    for name, b in backlogs_of(figures).items():
        add(f"peak RSS MB, backlog of {name} records", b["peak_rss_mb"], "<=", 150)
    for variant, k in figures.get("killer", {}).items():
        add(f"killer {variant}: innocent records in DLQ", k["innocent_dead_lettered"], "==", 0)
        add(f"killer {variant}: killer in the DLQ (1 = yes)", int(k["killer_in_dlq"]), "==", 1)
        add(f"killer {variant}: deaths", k["deaths"], "<=", k["limit"] + 1)
        if k["engine"] == "consumer" and "innocent_counts_raised" in k:
            # Issue 19, item 1: no other record's count goes up because of the deaths (a share
            # group's broker charges every record in flight; there it is a measurement).
            add(f"killer {variant}: other counts raised", k["innocent_counts_raised"], "==", 0)
    return out


def flat_figures(
    figures: dict[str, Any], reference: dict[str, Any] | None = None
) -> dict[str, float]:
    """Every figure of one side by name, for the new/old comparison."""
    out: dict[str, float] = {}
    for name in ALL_SCENARIOS:
        s = figures.get("scenarios", {}).get(name, {})
        if "records_per_s" in s:
            out[f"{name} rec/s"] = s["records_per_s"]
            out[f"{name} CPU s/10k"] = s["cpu_s_per_10k"]
            out[f"{name} peak RSS MB"] = s["peak_rss_mb"]
            if "longest_gap_ms" in s:
                out[f"{name} longest gap ms"] = s["longest_gap_ms"]
    for name, lat in figures.get("latency", {}).items():
        out[f"latency {name} p50 ms"] = lat["p50_ms"]
        out[f"latency {name} p99 ms"] = lat["p99_ms"]
        if "sidecar_cpu_us_per_record" in lat:
            out[f"latency {name} sidecar CPU µs/record"] = lat["sidecar_cpu_us_per_record"]
    for rate, r in figures.get("rates", {}).items():
        out[f"CPU at {rate}/s, µs/record"] = r["sidecar_cpu_us_per_record"]
        out[f"CPU at {rate}/s, % of a core"] = r["sidecar_cpu_share"] * 100
        floor = floor_us(rate, figures, reference)
        if floor:
            out[f"CPU at {rate}/s / the floor"] = r["sidecar_cpu_us_per_record"] / floor["total"]
    if "idle" in figures:
        out["idle CPU, % of a core"] = figures["idle"]["cpu_share"] * 100
    for name, b in backlogs_of(figures).items():
        out[f"backlog {name} peak RSS MB"] = b["peak_rss_mb"]
        if "cpu_share" in b:
            out[f"backlog {name} sidecar CPU, % of a core"] = b["cpu_share"] * 100
    for variant, k in figures.get("killer", {}).items():
        out[f"killer {variant} deaths"] = k["deaths"]
        out[f"killer {variant} innocent in DLQ"] = k["innocent_dead_lettered"]
        if "innocent_counts_raised" in k:
            out[f"killer {variant} other counts raised"] = k["innocent_counts_raised"]
        out[f"killer {variant} killer deliveries"] = k["killer_deliveries"]
    return out


def print_targets(results: dict[str, Any]) -> None:
    base = results.get("baseline")
    old = {t["target"]: t for t in base["targets"]} if base else {}
    head = "targets (this run's own ratios)"
    print(f"\n{head:<52}{'new':>9}" + (f"{'old':>9}" if base else "") + "  wanted")
    for t in results["targets"]:
        verdict = "met" if t["met"] else "MISSED"
        other = old.get(t["target"])
        old_text = ""
        if base:
            old_text = f"{other['value']:>9.2f}" if other else f"{'-':>9}"
        print(f"  {t['target']:<50}{t['value']:>9.2f}{old_text}  {t['wanted']:<7} {verdict}")


def print_details(figures: dict[str, Any], reference: dict[str, Any] | None = None) -> None:
    for name, lat in figures.get("latency", {}).items():
        cpu = (
            f"; sidecar CPU {lat['sidecar_cpu_share'] * 100:.0f} % of a core,"
            f" {lat['sidecar_cpu_us_per_record']:.0f} µs/record"
            if "sidecar_cpu_us_per_record" in lat
            else ""
        )
        print(
            f"  latency {name}: p50 {lat['p50_ms']:.2f} ms p99 {lat['p99_ms']:.2f} ms;"
            f" produce->ack p50 {lat['produce_ack_p50_ms']:.2f} ms"
            f" p99 {lat['produce_ack_p99_ms']:.2f} ms (the broker's share){cpu}"
        )
    saturation = saturation_us(figures, reference)
    for rate, r in figures.get("rates", {}).items():
        ratio = (
            f", {r['sidecar_cpu_us_per_record'] / saturation:.1f} x saturation"
            if saturation
            else ""
        )
        floor = floor_us(rate, figures, reference)
        if floor:
            ratio += f", {r['sidecar_cpu_us_per_record'] / floor['total']:.2f} x the floor"
        print(
            f"  sidecar CPU at {float(rate):,.0f} records/s offered (c-tcp-key):"
            f" {r['sidecar_cpu_us_per_record']:.0f} µs/record,"
            f" {r['sidecar_cpu_share'] * 100:.1f} % of a core{ratio}"
        )
        if floor and reference is None:
            print(
                f"    the floor at {float(rate):,.0f}/s: {floor['total']:.0f} µs/record ="
                f" a bare consumer {floor['consumer']:.0f} µs/record (poll, commit every 1,000)"
                f" + the app client {floor['client']:.0f} µs/request (app alone, TCP)"
            )
    if saturation:
        sat_floor = saturation_floor_us(figures, reference)
        vs = (
            f"; the floor there {sat_floor:.0f} µs (raw consumer a + app client),"
            f" {saturation / sat_floor:.2f} x"
            if sat_floor
            else ""
        )
        print(f"  sidecar CPU at saturation (c-tcp-key run): {saturation:.0f} µs/record{vs}")
    if "idle" in figures:
        i = figures["idle"]
        print(
            f"  idle (partitions assigned, no records): {i['cpu_share'] * 100:.2f} % of a core"
            f" ({i['cpu_s']:.2f} CPU s in {i['seconds']:.0f} s)"
        )
    for name, b in backlogs_of(figures).items():
        print(
            f"  backlog {b['backlog_records']:,} records of {name}, app {b['app_delay_ms']} ms per"
            f" answer, {b['seconds']:.0f} s: RSS first {b['rss_first_mb']:.0f} MB, max in the 2nd"
            f" half {b['rss_second_half_max_mb']:.0f} MB, peak {b['peak_rss_mb']:.0f} MB,"
            f" at most {b['held_in_sidecar_max']:,} records held"
            + (
                f"; sidecar CPU {b['cpu_share'] * 100:.1f} % of a core,"
                f" {b['cpu_us_per_record']:.0f} µs/record"
                if "cpu_share" in b
                else ""
            )
        )
    for variant, k in figures.get("killer", {}).items():
        limits = f"limit {k['limit']}" + (
            f", group limit {k['group_limit']}" if k.get("group_limit") else ""
        )
        if k["killer_in_dlq"]:
            fate = f"killer in the DLQ (its count there {k['killer_dlq_delivery_count']})"
        else:
            fate = "killer NOT in the DLQ: dropped without a DLQ record"
        print(
            f"  killer {variant} ({k['records']} records held {k['hold_ms']} ms, {limits}):"
            f" {k['deaths']} deaths, {fate}, delivered {k['killer_deliveries']} times"
            f" (counts {k['killer_counts_seen']}), {k['innocent_dead_lettered']} innocent records"
            f" dead-lettered, {k.get('innocent_counts_raised', '?')} others delivered with a"
            f" count above 1; {k['outcome']}, after {k['seconds']:.0f} s"
            + (f" (deaths at {k['death_times_s']} s)" if k.get("death_times_s") else "")
        )
        if k["dlq_messages"]:
            print(f"    DLQ reasons: {k['dlq_messages']}")
    for transport, app_figures in figures.get("app_alone", {}).items():
        print(
            f"  app alone over {transport}: {app_figures['requests_per_s']:,} req/s,"
            f" app CPU {app_figures['app_cpu_us_per_request']} µs/req, the sidecar's app client"
            f" {app_figures['client_cpu_us_per_request']} µs/req"
        )


def print_comparison(results: dict[str, Any]) -> None:
    new, old = flat_figures(results), flat_figures(results["baseline"], results)
    print(f"\nnew ({results.get('commit', '?')}) vs old ({results['baseline'].get('commit', '?')})")
    print(f"  {'figure':<50}{'new':>11}{'old':>11}{'new/old':>9}")
    for name, value in new.items():
        if name not in old:
            continue
        ratio = f"{value / old[name]:.2f}" if old[name] else "-"
        print(f"  {name:<50}{value:>11,.2f}{old[name]:>11,.2f}{ratio:>9}")


def print_report(results: dict[str, Any]) -> None:
    """The scenarios' table and the comparison (the side-by-side parts print their own first)."""
    base = results.get("baseline")
    side_parts = any(k in results for k in ("dapr", "spring", "schemas", "scale"))
    if side_parts and not results["scenarios"] and not base:
        print(f"\nwall time {results['wall_s']} s; command: {results['command']}")
        return
    if base:
        print(f"new: {results.get('path', '.')} ({results.get('commit', '?')})")
    print_table(results)
    if base:
        print(f"\nold: {base['path']} ({base.get('commit', '?')})")
        print_table(base, results)
    print_targets(results)
    print("\nnew" if base else "")
    print_details(results)
    if base:
        print("old")
        print_details(base, results)
        print_comparison(results)
    print(f"\nwall time {results['wall_s']} s; command: {results['command']}")
