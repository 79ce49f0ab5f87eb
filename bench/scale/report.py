"""The scale bench's tables, and its figures against the issue's targets (value, target, ratio)."""

from __future__ import annotations

from typing import Any

KIB = 1024


def _growth_kib_per_partition(wide: list[dict[str, Any]], key: str) -> float | None:
    """The slope of ``key`` (MB) over the partition counts, least squares, in KiB per partition."""
    points = [(w["partitions"], w[key]) for w in wide if key in w]
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((x - mx) ** 2 for x, _ in points)
    if den == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / den * KIB


def scale_targets(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target: its name, the measured value, the target, the ratio (value ÷ target) and
    whether it holds."""
    rows: list[dict[str, Any]] = []

    def row(name: str, value: float | None, op: str, target: float) -> None:
        if value is None:
            return
        ok = value <= target if op == "<=" else value >= target
        ratio = value / target if target else (0.0 if value == 0 else float("inf"))
        rows.append(
            {"target": name, "value": value, "op": op, "goal": target, "ratio": ratio, "ok": ok}
        )

    wide = out.get("wide") or []
    if wide:
        top = max(wide, key=lambda w: w["partitions"])
        row(
            f"idle CPU, {top['partitions']} partitions (% of a core)",
            top["idle_cpu_share"] * 100,
            "<=",
            1.0,
        )
        row(
            "memory per idle assigned partition (KiB)",
            _growth_kib_per_partition(wide, "idle_rss_mb"),
            "<=",
            20.0,
        )
        row(
            f"first delivery after assignment p99, {top['partitions']} partitions (ms)",
            top["first_delivery_p99_ms"],
            "<=",
            1000.0,
        )
    for r in out.get("rollouts") or []:
        if "failed" in r:
            rows.append(
                {"target": f"rollout {r['kind']} {r['signal']}", "value": r["failed"], "ok": False}
            )
            continue
        label = f"{r['members']} x {r['kind']} {r['signal']}" + (
            f" ({r['broker']})" if r.get("broker") else ""
        )
        row(f"{label}: lost", r["lost"], "<=", 0)
        if r["kind"] != "dapr":
            row(f"{label}: innocent records in the DLQ", r["innocent_dead_lettered"], "<=", 0)
            row(f"{label}: counts going backwards", r["counts_backwards"], "<=", 0)
        if r["kind"] == "consumer" and r["signal"] == "term":
            row(f"{label}: duplicates", r["duplicate_deliveries"], "<=", 0)
        elif "not_durable_at_stops" in r:
            # kill -9: what a killed member had not made durable (answered past its last confirmed
            # commit, the records at the app included) is delivered again; every duplicate must be
            # one of those.
            row(
                f"{label}: duplicates <= not durable at the stops (answered or at the app, not committed)",
                r["duplicate_deliveries"],
                "<=",
                r["not_durable_at_stops"],
            )
            row(f"{label}: duplicates no stop explains", r["duplicates_unexplained"], "<=", 0)
        elif r["kind"] != "dapr" and r["in_flight_known"]:
            row(
                f"{label}: duplicates <= in flight at the stops",
                r["duplicate_deliveries"],
                "<=",
                r["in_flight_at_stops"],
            )
    by_kind = {
        (r["kind"], r.get("broker")): r for r in out.get("rollouts") or [] if "failed" not in r
    }
    ours, dapr = by_kind.get(("classic", "beside dapr")), by_kind.get(("dapr", ""))
    if ours and dapr:
        row(
            "side by side: duplicates, sidecar ÷ Dapr",
            ours["duplicate_deliveries"] / max(1, dapr["duplicate_deliveries"]),
            "<=",
            1.0,
        )
    return rows


def print_scale(out: dict[str, Any]) -> None:
    wide = out.get("wide") or []
    if wide:
        print("\nscale-wide: one sidecar, partitions over 4 topics")
        cols = [
            ("partitions", "partitions", "{:.0f}"),
            ("startup_peak_rss_mb", "peak RSS at start MB", "{:.1f}"),
            ("idle_rss_mb", "idle RSS MB", "{:.1f}"),
            ("idle_cpu_share", "idle CPU %", "{:.2%}"),
            ("idle_partition_commits_per_s", "idle offsets committed/s", "{:.1f}"),
            ("load_cpu_us_per_record", "µs/record at load", "{:.0f}"),
            ("load_commits_per_s", "commits/s at load", "{:.2f}"),
            ("load_partition_commits_per_s", "offsets committed/s", "{:.0f}"),
            ("load_metadata_bytes_per_s", "metadata B/s", "{:.0f}"),
            ("first_delivery_p50_ms", "first delivery p50 ms", "{:.0f}"),
            ("first_delivery_p99_ms", "first delivery p99 ms", "{:.0f}"),
            ("peak_rss_mb", "peak RSS MB", "{:.1f}"),
        ]
        for key, name, fmt in cols:
            print(f"  {name:<26}" + "".join(f"{fmt.format(w[key]):>12}" for w in wide))
        growth = _growth_kib_per_partition(wide, "idle_rss_mb")
        if growth is not None:
            print(f"  idle RSS growth: {growth:.1f} KiB per partition (least squares)")
    rollouts = out.get("rollouts") or []
    if rollouts:
        print("\nrollouts: each member stopped and started in turn")
        for r in rollouts:
            if "failed" in r:
                print(f"  {r['members']} x {r['kind']} {r['signal']}: failed: {r['failed']}")
                continue
            print(
                f"  {r['members']} x {r['kind']:<8} {r['signal']:<4} {r.get('broker', '')}: produced"
                f" {r['produced']:,}, lost {r['lost']}, innocent in DLQ {r['innocent_dead_lettered']},"
                f" counts backwards {r['counts_backwards']}, duplicates {r['duplicate_deliveries']}"
                f" ({r['records_duplicated']} records, times {r['duplicated_times']}; in flight at"
                f" stops {r['in_flight_at_stops']}), longest silence {r['longest_silence_s']:.1f} s,"
                f" wall {r['rollout_wall_s']:.0f} s"
            )
            if "not_durable_at_stops" in r:
                ages = sorted(a for a in r["commit_age_s_at_stops"] if a is not None)
                median = ages[len(ages) // 2] if ages else float("nan")
                print(
                    f"    kill -9: not durable at the stops {r['not_durable_at_stops']} (answered past"
                    f" the last commit, or at the app), duplicates no stop explains"
                    f" {r['duplicates_unexplained']}; age of the killed member's last commit"
                    f" median {median:.2f} s, max {max(ages, default=float('nan')):.2f} s"
                )
    targets = out.get("targets") or []
    if targets:
        print("\nscale targets (value, target, ratio value ÷ target)")
        for t in targets:
            if "op" not in t:
                print(f"  FAIL  {t['target']}: {t['value']}")
                continue
            mark = "ok  " if t["ok"] else "MISS"
            print(
                f"  {mark}  {t['target']}: {t['value']:.4g} {t['op']} {t['goal']:g}  (ratio {t['ratio']:.2f})"
            )
