"""End-to-end benchmark: the sidecar against a raw consumer and a hand-written bridge (issues 11, 19).

Run: ``python -m bench [--records N] [--runs R] [--scenarios a,b,c,...] [--baseline PATH]``. Not a
test: it prints tables and the targets, and writes the same figures as JSON
(``bench/results/latest.json`` by default).

One run, one broker, one set of records. N records (1 KiB values, 10,000 distinct keys) are
produced once to a 6-partition topic; every throughput scenario then reads all of them with a
fresh consumer group and the figure is records/s from the first record seen to the last one done:

    a           ceiling: confluent-kafka consume() loop, commits, no app
    b           baseline: poll() + one blocking ``requests`` POST per record over a keep-alive
                session, async commit about once a second (what a user writes by hand)
    c-tcp-key   the sidecar, single mode, TCP, ordering key   (also c-tcp-none, c-unix-*)
    d-tcp-key   the sidecar, batch mode (100 records, 5 ms linger)
    e-tcp-key   the sidecar, 5 % rejects + 5 % releases (DLQ path active)
    e-txn       ... with the transactional DLQ mode            (when the engine supports it)
    e-routes    ... with DLQ routes: 3 rules, every DLQ record routed (when the sidecar has routes)
    f-*         tracing on vs off                              (when the sidecar has tracing)
    g-share     ``engine: share`` (a share group), single mode, TCP, ordering none
    g-share-journal  the same with ``share.journal.path`` (the journal of deaths)
    dapr-vs-sidecar-*  the sidecar side by side with Dapr's sidecar (``bench.vs_dapr``); named only,
                never part of ``all``; alone, they run without the parts below
    spring-vs-tiers  the sidecar's retry tiers side by side with Spring Kafka's retry topics
                (``bench.vs_spring``; Java 17+); named only, like the Dapr ones
    schemas-avro  Avro records decoded for the app against the same records undecoded
                (``bench.vs_schemas``; a Schema Registry on Java 21+); named only
    scale-wide, scale-many, scale-share, scale-dapr  the scale bench (``bench.scale``): one sidecar
                on many partitions, many sidecars through a rolling restart; named only

Then, in the same run (each part can be skipped with ``--skip``):

    latency     added latency at a fixed offered rate (1,000 records/s) over the raw consumer,
                single and batch mode and engine share: a ``bench-ts`` header carries the
                produce time, the app notes the receive time; the sidecar's CPU during it
    rates       sidecar CPU (µs per record, share of a core) at 100 and 1,000 records/s offered
                (c-tcp-key), against its CPU per record at saturation (the c-tcp-key run) and
                against the floor, measured in the same rounds: a bare confluent-kafka consumer
                at the same offered rate (poll() per record, an asynchronous commit every 1,000
                records) plus the sidecar's own app client's CPU per request (the app-alone run)
    idle        sidecar CPU with its partitions assigned and no traffic
    backlog     peak RSS with default settings behind a slow app (50 ms per answer): 2,000,000
                records of 100 B, 30,000 of 10 KiB, 100 of 1 MiB
    killer      crash isolation: a killer record whose delivery makes the app SIGKILL the sidecar,
                which is restarted after each death until the killer is in the DLQ; deaths,
                innocent records dead-lettered, the killer's delivery count; engine consumer with
                ordering none and key, and engine share

``--baseline PATH`` runs the sidecar of another checkout (``git worktree add /tmp/base <commit>``)
as well, alternating with this one (A B, then B A: neither always runs first) on the same broker,
records and scenarios, and prints the ratio new/old of every figure.

The app (``bench.benchapp``) is one asyncio process listening on TCP and a Unix socket; it is
measured alone too. Every measured process is a child; CPU comes from /proc/<pid>/stat (all its
threads, librdkafka's included), peak RSS from VmHWM.

The broker is ``$KAFKA_BOOTSTRAP``, or one this command starts with ``scripts/kafka start`` in a
private state directory and stops at the end. Child roles (``--child ceiling|bridge|floor``, see
``bench.children``) are this module run again; they print one JSON line.

This module holds the parts (``part_*``: each repeats its runs over the sides and keeps the
medians), the options and ``main``. The rest: ``bench.measure`` (CPU, memory, percentiles),
``bench.broker``, ``bench.app`` (the app child), ``bench.sidecars`` (the sidecar under test: its
config, running it, its API), ``bench.children``, ``bench.runs`` (throughput, latency, floor, idle,
backlog), ``bench.killer`` (crash isolation) and ``bench.report`` (tables, targets, comparison).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench import flood, sidecars
from bench.app import App, measure_app_alone
from bench.broker import VALUE_BYTES, Broker
from bench.children import child_main, ensure_requests, run_child
from bench.killer import KILLER_VARIANTS, KillerSpec, run_killer
from bench.measure import ROOT, git_commit
from bench.report import (
    ALL_SCENARIOS,
    check_targets,
    median_of,
    print_report,
    summarise,
)
from bench.runs import (
    produce_backlog,
    run_backlog,
    run_floor,
    run_idle,
    run_latency,
    run_sidecar_throughput,
)
from bench.scale import SCALE_SCENARIOS, add_options, part_scale
from bench.scale.report import print_scale
from bench.sidecars import Side, unavailable
from bench.vs_dapr import DAPR_SCENARIOS, part_dapr, print_dapr
from bench.vs_schemas import SCHEMAS_SCENARIOS, part_schemas, print_schemas
from bench.vs_spring import SPRING_SCENARIOS, part_spring, print_spring

LATENCY_SCENARIOS = ["a", "b", "c-tcp-key", "c-unix-none", "d-tcp-key", "g-share"]
PARTS = ["latency", "rates", "idle", "backlog", "killer"]
# Backlogs behind a slow app: name -> (value bytes, the option giving the record count).
BACKLOGS = {
    "100B": (100, "backlog"),
    "10KiB": (10 * 1024, "backlog_10k"),
    "1MiB": (1024 * 1024, "backlog_1m"),
}


def show(results: dict[str, Any]) -> None:
    """Print a run: the side-by-side parts (Dapr, Spring, schemas, scale), then the scenarios and
    the comparison."""
    print()
    if "dapr" in results:
        print_dapr(results["dapr"])
    if "spring" in results:
        print_spring(results["spring"])
    if "schemas" in results:
        print_schemas(results["schemas"])
    if "scale" in results:
        print_scale(results["scale"])
    print_report(results)


@dataclass
class Bench:
    """One run's shared pieces: the options, the broker, the app, the sides and their figures."""

    args: argparse.Namespace
    broker: Broker
    app: App
    directory: str
    sides: list[Side]
    figures: dict[str, dict[str, Any]]  # side name -> that side's results dict

    def tag(self, side: Side) -> str:
        return f" [{side.name}]" if len(self.sides) > 1 else ""

    def sides_for(self, scenario: str, round_no: int = 0) -> list[Side]:
        """The sides a scenario runs on in round `round_no`: new then old, old first in the odd
        rounds (A B B A), so that neither side always runs first after the other's run."""
        # a and b do not depend on the sidecar's code: they run once, on the new side.
        if scenario in ("a", "b"):
            return self.sides[:1]
        return round_order(self.sides, round_no)


def round_order(sides: list[Side], round_no: int) -> list[Side]:
    """The sides in the order they run in round `round_no`: as given in the even rounds,
    reversed in the odd ones."""
    return sides if round_no % 2 == 0 else sides[::-1]


def part_throughput(bench: Bench, selected: list[str]) -> None:
    """The throughput scenarios: one set of records, runs round-robin over scenarios and sides."""
    args, broker, app = bench.args, bench.broker, bench.app
    topic = broker.create_topic(f"bench-{uuid.uuid4().hex[:8]}")
    print(f"producing {args.records:,} records (1 KiB, 10k keys) to {topic} ...", flush=True)
    broker.produce_bulk(topic, args.records, VALUE_BYTES)
    ends = broker.end_offsets(topic)
    total = sum(ends.values())
    bench.figures["new"]["partition_records"] = ends
    # Runs go round-robin over the scenarios and the sides (A B, then B A), so a change in the
    # machine's load (other processes on a shared box) spreads over every figure alike.
    runnable: list[tuple[str, Side]] = []
    for scenario in selected:
        for side in bench.sides_for(scenario):
            reason = unavailable(scenario, side)
            if reason:
                bench.figures[side.name]["scenarios"][scenario] = {"unavailable": reason}
            else:
                runnable.append((scenario, side))
    all_runs: dict[tuple[str, str], list[dict[str, Any]]] = {(s, d.name): [] for s, d in runnable}
    for run in range(args.runs):
        ordered = [
            (scenario, side)
            for scenario in selected
            for side in bench.sides_for(scenario, run)
            if (scenario, side) in runnable
        ]
        for scenario, side in ordered:
            if scenario == "a":
                r = run_child("ceiling", broker, topic, total, None)
            elif scenario == "b":
                app.reset()
                r = run_child("bridge", broker, topic, total, app)
            else:
                r = run_sidecar_throughput(
                    scenario, broker, topic, ends, app, bench.directory, run, side
                )
            r.pop("latencies_ns", None)
            all_runs[scenario, side.name].append(r)
            print(
                f"  {scenario:<12}{bench.tag(side)} run {run + 1}: {r['records_per_s']:>8,.0f} rec/s"
                f"  {r['cpu_s_per_10k']:.2f} CPU s/10k  {r['peak_rss_mb']:.0f} MB"
                f"  longest gap {r.get('longest_gap_ms', 0):.0f} ms",
                flush=True,
            )
    for (scenario, side_name), runs in all_runs.items():
        if runs:  # --runs 0: the other parts only
            bench.figures[side_name]["scenarios"][scenario] = summarise(runs)


def part_latency(bench: Bench, selected: list[str]) -> None:
    """Added latency at a fixed offered rate; rounds alternate the sides like the throughput runs."""
    args = bench.args
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for round_no in range(args.part_runs):
        for scenario in LATENCY_SCENARIOS:
            if scenario not in selected:
                continue
            for side in bench.sides_for(scenario, round_no):
                if unavailable(scenario, side):
                    continue
                lat = run_latency(
                    scenario, bench.broker, bench.app, bench.directory,
                    args.latency_rate, args.latency_seconds, side,
                )  # fmt: skip
                runs.setdefault((scenario, side.name), []).append(lat)
                cpu = lat.get("sidecar_cpu_share")
                print(
                    f"  latency {scenario:<12}{bench.tag(side)} p50 {lat['p50_ms']:.2f} ms"
                    f"  p99 {lat['p99_ms']:.2f} ms  max {lat['max_ms']:.2f} ms"
                    f"  (produce->ack p50 {lat['produce_ack_p50_ms']:.2f}"
                    f" p99 {lat['produce_ack_p99_ms']:.2f} ms)"
                    + (f"  sidecar CPU {cpu * 100:.0f} %" if cpu is not None else ""),
                    flush=True,
                )
    for side in bench.sides:
        bench.figures[side.name]["latency"] = {
            scenario: median_of(found)
            for (scenario, name), found in runs.items()
            if name == side.name
        }


def part_rates(bench: Bench, rates: list[float]) -> None:
    """Sidecar CPU at fixed offered rates (c-tcp-key): µs per record and share of a core; and the
    floor at each rate (a bare consumer), measured in the same rounds, right before the sidecars."""
    print(
        "sidecar CPU at offered rates (c-tcp-key), and the floor (a bare consumer) ...", flush=True
    )
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {side.name: {} for side in bench.sides}
    floors: dict[str, list[dict[str, Any]]] = {}
    for round_no in range(bench.args.part_runs):
        for rate in rates:
            f = run_floor(bench.broker, rate, bench.args.rate_seconds)
            floors.setdefault(f"{rate:g}", []).append(f)
            print(
                f"  {rate:>7,.0f}/s floor (bare consumer): {f['consumer_cpu_us_per_record']:.0f}"
                f" µs/record, {f['consumer_cpu_share'] * 100:.1f} % of a core",
                flush=True,
            )
            for side in bench.sides_for("c-tcp-key", round_no):
                r = run_latency(
                    "c-tcp-key", bench.broker, bench.app, bench.directory, rate,
                    bench.args.rate_seconds, side,
                )  # fmt: skip
                runs[side.name].setdefault(f"{rate:g}", []).append(r)
                print(
                    f"  {rate:>7,.0f}/s{bench.tag(side)}:"
                    f" {r['sidecar_cpu_us_per_record']:.0f} µs/record,"
                    f" {r['sidecar_cpu_share'] * 100:.1f} % of a core;"
                    f" by thread {r.get('threads_us_per_record', {})};"
                    f" wake-ups {r.get('wakeups_per_record', 0):.2f} a record,"
                    f" by thread {r.get('wakeups_by_thread', {})}",
                    flush=True,
                )
    for side in bench.sides:
        bench.figures[side.name]["rates"] = {k: median_of(v) for k, v in runs[side.name].items()}
    bench.figures["new"]["floor"] = {k: median_of(v) for k, v in floors.items()}


def part_idle(bench: Bench) -> None:
    seconds = bench.args.idle_seconds
    print(f"idle CPU ({seconds:g} s, partitions assigned) ...", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {side.name: [] for side in bench.sides}
    for round_no in range(bench.args.part_runs):
        for side in bench.sides_for("idle", round_no):
            i = run_idle(bench.broker, bench.app, bench.directory, seconds, side)
            runs[side.name].append(i)
            print(f"  idle{bench.tag(side)}: {i['cpu_share'] * 100:.2f} % of a core", flush=True)
    for side in bench.sides:
        bench.figures[side.name]["idle"] = median_of(runs[side.name])


def part_backlog(bench: Bench) -> None:
    """Peak RSS behind a slow app; each backlog is produced once and read by every side."""
    args = bench.args
    for name, (value_bytes, option) in BACKLOGS.items():
        count = getattr(args, option)
        if count <= 0:
            continue
        print(f"backlog: {count:,} records of {name} behind a slow app ...", flush=True)
        topic = produce_backlog(bench.broker, count, value_bytes)
        for side in bench.sides:
            b = run_backlog(
                bench.broker, topic, bench.app, bench.directory, count, value_bytes,
                args.slow_ms, args.backlog_seconds, side,
            )  # fmt: skip
            bench.figures[side.name].setdefault("backlogs", {})[name] = b
            print(
                f"  {name}{bench.tag(side)}: RSS first {b['rss_first_mb']:.0f} MB,"
                f" max in 2nd half {b['rss_second_half_max_mb']:.0f} MB,"
                f" peak {b['peak_rss_mb']:.0f} MB, held {b['held_in_sidecar_max']:,} records",
                flush=True,
            )


def part_killer(bench: Bench, variants: list[str]) -> None:
    args = bench.args
    spec = KillerSpec(
        records=args.killer_records,
        hold_ms=args.killer_hold_ms,
        limit=args.killer_limit,
        group_limit=args.killer_group_limit,
        share_quiet_s=args.killer_share_quiet_s,
        share_journal=not args.killer_no_journal,
    )
    for variant in variants:
        for side in bench.sides:
            if KILLER_VARIANTS[variant][0] == "share" and unavailable("g-share", side):
                continue
            print(f"killer {variant}{bench.tag(side)} ...", flush=True)
            k = run_killer(variant, bench.broker, bench.app, bench.directory, spec, side)
            bench.figures[side.name].setdefault("killer", {})[variant] = k
            print(
                f"  {k['deaths']} deaths, killer in DLQ: {k['killer_in_dlq']},"
                f" delivered {k['killer_deliveries']} times,"
                f" {k['innocent_dead_lettered']} innocent dead-lettered ({k['outcome']})",
                flush=True,
            )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--records", type=int, default=15_000, help="records per throughput run")
    add("--runs", type=int, default=3, help="runs per scenario (median shown)")
    add(
        "--scenarios",
        default="all",
        help="throughput and latency scenarios, comma-separated names or prefixes: "
        + ",".join(
            ALL_SCENARIOS + DAPR_SCENARIOS + SPRING_SCENARIOS + SCHEMAS_SCENARIOS + SCALE_SCENARIOS
        ),
    )
    add("--skip", default="", help="parts left out, comma-separated: " + ",".join(PARTS))
    add(
        "--baseline",
        metavar="PATH",
        help="another checkout (git worktree or clone) whose sidecar runs too, alternating",
    )
    add(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config key for this checkout's sidecar in every run (not the baseline's), e.g. "
        "source.intake=signal; repeatable; the value is read as YAML",
    )
    add("--latency-rate", type=float, default=1000.0, help="records/s offered")
    add("--latency-seconds", type=float, default=5.0)
    add("--no-latency", action="store_true", help="the same as --skip latency")
    add("--part-runs", type=int, default=1, help="runs of latency, rates and idle (median shown)")
    add("--rates", default="100,1000", help="records/s offered for the CPU part")
    add("--rate-seconds", type=float, default=10.0)
    add("--idle-seconds", type=float, default=20.0, help="0 skips the idle part")
    add("--backlog", type=int, default=2_000_000, help="records of 100 B; 0 skips")
    add("--backlog-10k", type=int, default=30_000, help="records of 10 KiB; 0 skips")
    add("--backlog-1m", type=int, default=100, help="records of 1 MiB; 0 skips")
    add("--backlog-seconds", type=float, default=20.0)
    add("--slow-ms", type=int, default=50, help="the slow app's answer time in the backlogs")
    add("--killer-variants", default=",".join(KILLER_VARIANTS), help="of " + ",".join(KILLER_VARIANTS))  # fmt: skip
    add("--killer-records", type=int, default=KillerSpec.records)
    add("--killer-hold-ms", type=int, default=KillerSpec.hold_ms)
    add("--killer-limit", type=int, default=KillerSpec.limit, help="share.delivery.count.limit")
    add("--killer-group-limit", type=int, default=KillerSpec.group_limit, help="engine share: the group's")  # fmt: skip
    add("--killer-no-journal", action="store_true", help="engine share: without share.journal.path")
    add("--killer-share-quiet-s", type=float, default=KillerSpec.share_quiet_s, help="engine share: quiet before the killer counts as dropped")  # fmt: skip
    add("--app-seconds", type=float, default=2.0, help="app-alone run length")
    add("--idle-connections", type=int, default=0, help="held open on an observability listener during throughput runs (bench.flood)")  # fmt: skip
    add_options(parser)
    add("--json", default=str(ROOT / "bench" / "results" / "latest.json"))
    add("--show", metavar="JSON", help="print the tables of a saved run and exit")
    # Child roles.
    add("--child", choices=["ceiling", "bridge", "floor"], help=argparse.SUPPRESS)
    add("--bootstrap", help=argparse.SUPPRESS)
    add("--topic", help=argparse.SUPPRESS)
    add("--group", help=argparse.SUPPRESS)
    add("--expect", type=int, help=argparse.SUPPRESS)
    add("--url", help=argparse.SUPPRESS)
    add("--latency", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child or args.show:
        return args
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        sidecars.NEW_SIDE_KEYS[key.strip()] = yaml.safe_load(value)
    wanted = [w.strip() for w in args.scenarios.split(",") if w.strip()]
    args.selected = [
        s
        for s in ALL_SCENARIOS
        if "all" in wanted or any(s == w or s.startswith(w) for w in wanted)
    ]
    args.dapr_selected = [
        s for s in DAPR_SCENARIOS if any(s == w or s.startswith(w) for w in wanted)
    ]
    args.spring_selected = [
        s for s in SPRING_SCENARIOS if any(s == w or s.startswith(w) for w in wanted)
    ]
    args.scale_selected = [
        s for s in SCALE_SCENARIOS if any(s == w or s.startswith(w) for w in wanted)
    ]
    args.schemas_selected = [
        s for s in SCHEMAS_SCENARIOS if any(s == w or s.startswith(w) for w in wanted)
    ]
    args.skip_parts = {w.strip() for w in args.skip.split(",") if w.strip()}
    side_by_side = (
        args.dapr_selected or args.spring_selected or args.schemas_selected or args.scale_selected
    )
    if side_by_side and not args.selected:
        args.skip_parts |= set(PARTS)  # the side-by-side runs alone
    if args.no_latency:
        args.skip_parts.add("latency")
    if args.skip_parts - set(PARTS):
        parser.error(f"--skip: unknown {sorted(args.skip_parts - set(PARTS))}; parts: {PARTS}")
    args.variants = [v.strip() for v in args.killer_variants.split(",") if v.strip()]
    if set(args.variants) - set(KILLER_VARIANTS):
        parser.error(f"--killer-variants: of {list(KILLER_VARIANTS)}")
    args.rate_list = [float(r) for r in args.rates.split(",") if r.strip()]
    if (
        not args.selected
        and not args.dapr_selected
        and not args.spring_selected
        and not args.schemas_selected
        and not args.scale_selected
        and set(PARTS) <= args.skip_parts
    ):
        parser.error(f"no scenario matches {args.scenarios!r} and every part is skipped")
    if args.baseline and not (Path(args.baseline) / "sidecar" / "__main__.py").exists():
        parser.error(f"--baseline {args.baseline}: no sidecar/__main__.py there")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    flood.set_idle_connections(args.idle_connections)
    if args.child:
        child_main(args)
        return
    if args.show:
        show(json.loads(Path(args.show).read_text()))
        return
    sides = [Side("new", ROOT)]
    if args.baseline:
        sides.append(Side("old", Path(args.baseline).resolve()))
    has_requests = ensure_requests() if "b" in args.selected else False
    started = time.monotonic()
    broker = Broker.open()
    results: dict[str, Any] = {
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "broker": broker.bootstrap,
        "path": str(ROOT),
        "commit": git_commit(ROOT),
        "records": args.records,
        "runs": args.runs,
        "bridge_http": "requests" if has_requests else "http.client",
        "scenarios": {},
    }
    if args.baseline:
        results["baseline"] = {
            "path": str(sides[1].root),
            "commit": git_commit(sides[1].root),
            "scenarios": {},
        }
    figures = {"new": results}
    if args.baseline:
        figures["old"] = results["baseline"]
    skip = args.skip_parts
    try:
        # BENCH_KEEP=DIR: the run's files (sidecar configs and logs, journals) are kept in DIR.
        keep = os.environ.get("BENCH_KEEP")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
        with (
            contextlib.nullcontext(keep) if keep else tempfile.TemporaryDirectory(prefix="bench-")
        ) as directory:
            app = App(directory)
            bench = Bench(args, broker, app, directory, sides, figures)
            try:
                print("app alone (sidecar AppClient, 64 in flight) ...", flush=True)
                results["app_alone"] = measure_app_alone(app, args.app_seconds)
                print(f"  {results['app_alone']}", flush=True)
                if args.selected:
                    part_throughput(bench, args.selected)
                if "latency" not in skip:
                    part_latency(bench, args.selected)
                if "rates" not in skip and args.rate_list:
                    part_rates(bench, args.rate_list)
                if "idle" not in skip and args.idle_seconds > 0:
                    part_idle(bench)
                if "backlog" not in skip:
                    part_backlog(bench)
                if "killer" not in skip:
                    part_killer(bench, args.variants)
                if args.dapr_selected:
                    results["dapr"] = part_dapr(broker, app, directory, args, args.dapr_selected)
                if args.spring_selected:
                    results["spring"] = part_spring(broker, app, directory, args)
                if args.schemas_selected:
                    results["schemas"] = part_schemas(broker, app, directory, args)
                if args.scale_selected:
                    results["scale"] = part_scale(broker, app, directory, args, args.scale_selected)
            finally:
                app.close()
    finally:
        broker.close()
    results["wall_s"] = round(time.monotonic() - started, 1)
    results["targets"] = check_targets(results, results.get("baseline"))
    if "baseline" in results:
        results["baseline"]["targets"] = check_targets(results["baseline"], results)
    show(results)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {args.json}")


if __name__ == "__main__":
    main()
