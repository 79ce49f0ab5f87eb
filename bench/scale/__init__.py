"""The scale bench: ``python -m bench --scenarios scale-wide,scale-many,scale-share,scale-dapr``.

Its own part, runnable alone (named only, never part of ``all``):

    scale-wide   one sidecar assigned ``--scale-partitions`` (100, 300, 1,000) over 4 topics
                 (``bench.scale.wide``)
    scale-many   ``--scale-members`` sidecars in one group on a ``--scale-topic-partitions`` topic at
                 ``--scale-rate`` records/s, a rolling restart per ``--scale-protocols`` (classic
                 cooperative-sticky, ``static``: classic with static membership,
                 ``group.protocol: consumer``) and ``--scale-signals`` (SIGTERM,
                 kill -9) (``bench.scale.rollout``)
    scale-share  the same with engine share on a share group, SIGTERM and kill -9; again on a broker
                 of its own for each ``--scale-share-heartbeats`` value other than Kafka's default
                 (``group.share.heartbeat.interval.ms``, with its minimum lowered to match)
    scale-dapr   ``--scale-dapr-members`` daprd beside as many sidecars (classic), each a rolling
                 restart with SIGTERM (daprd: ``bench.dapr``)

``bench.scale.journal`` judges a rollout; ``bench.scale.report`` prints the figures and their
ratios to the issue's targets.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.app import App
from bench.broker import Broker
from bench.measure import ROOT
from bench.scale.report import scale_targets
from bench.scale.rollout import Rollout, run_rollout
from bench.scale.wide import run_wide
from bench.sidecars import Side

SCALE_SCENARIOS = ["scale-wide", "scale-many", "scale-share", "scale-dapr"]
KAFKA_SHARE_HEARTBEAT_MS = 5000  # group.share.heartbeat.interval.ms, Kafka's default


def add_options(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--scale-partitions", default="100,300,1000", help="scale-wide: partition counts")
    add("--scale-idle-seconds", type=float, default=20.0, help="scale-wide: idle measurement")
    add("--scale-load-seconds", type=float, default=20.0, help="scale-wide: load measurement")
    add(
        "--scale-rate", type=float, default=1000.0, help="records/s offered (wide's load, rollouts)"
    )
    add("--scale-members", type=int, default=24, help="scale-many, scale-share: sidecars")
    add("--scale-topic-partitions", type=int, default=96, help="rollouts: the topic's partitions")
    add(
        "--scale-protocols",
        default="classic,consumer",
        help="scale-many: classic, consumer, static (classic with group.instance.id kept per slot)",
    )
    add("--scale-signals", default="term,kill", help="scale-many, scale-share: term, kill")
    add("--scale-share-heartbeats", default="5000,1000", help="scale-share: broker heartbeats, ms")
    add("--scale-dapr-members", type=int, default=8, help="scale-dapr: daprd and sidecars each")


def part_scale(
    broker: Broker, app: App, directory: str, args: argparse.Namespace, selected: list[str]
) -> dict[str, Any]:
    side = Side("new", ROOT)
    out: dict[str, Any] = {}
    signals = [s.strip() for s in args.scale_signals.split(",") if s.strip()]
    parts = args.scale_topic_partitions
    if "scale-wide" in selected:
        out["wide"] = []
        for n in (int(p) for p in args.scale_partitions.split(",") if p.strip()):
            print(f"scale-wide: one sidecar, {n} partitions ...", flush=True)
            w = run_wide(
                broker, app, directory, n, side,
                idle_s=args.scale_idle_seconds, rate=args.scale_rate, load_s=args.scale_load_seconds,
            )  # fmt: skip
            out["wide"].append(w)
            print(
                f"  idle RSS {w['idle_rss_mb']:.1f} MB, idle CPU {w['idle_cpu_share'] * 100:.2f} %,"
                f" first delivery p99 {w['first_delivery_p99_ms']:.0f} ms,"
                f" {w['load_cpu_us_per_record']:.0f} µs/record",
                flush=True,
            )
    rollouts: list[Rollout] = []
    if "scale-many" in selected:
        for protocol in (p.strip() for p in args.scale_protocols.split(",") if p.strip()):
            rollouts += [
                Rollout(protocol, args.scale_members, parts, args.scale_rate, sig)
                for sig in signals
            ]
    if "scale-dapr" in selected:
        n = args.scale_dapr_members
        rollouts += [
            Rollout("classic", n, parts, args.scale_rate, "term", broker_note="beside dapr"),
            Rollout("dapr", n, parts, args.scale_rate, "term"),
        ]
    share_runs: list[tuple[int, Rollout]] = []
    if "scale-share" in selected:
        for beat in (int(b) for b in args.scale_share_heartbeats.split(",") if b.strip()):
            note = f"group.share.heartbeat.interval.ms={beat}"
            share_runs += [
                (beat, Rollout("share", args.scale_members, parts, args.scale_rate, sig, broker_note=note))
                for sig in signals
            ]  # fmt: skip
    out["rollouts"] = []
    for r in rollouts:
        out["rollouts"].append(_one(r, broker, app, directory, side))
    for beat, r in share_runs:
        if beat == KAFKA_SHARE_HEARTBEAT_MS:
            out["rollouts"].append(_one(r, broker, app, directory, side))
            continue
        own = Broker.open(
            {
                "group.share.heartbeat.interval.ms": str(beat),
                "group.share.min.heartbeat.interval.ms": str(min(beat, KAFKA_SHARE_HEARTBEAT_MS)),
            }
        )
        try:
            out["rollouts"].append(_one(r, own, app, directory, side))
        finally:
            own.close()
    out["targets"] = scale_targets(out)
    return out


def _one(r: Rollout, broker: Broker, app: App, directory: str, side: Side) -> dict[str, Any]:
    print(
        f"rollout: {r.members} x {r.kind} {r.broker_note}, {r.partitions} partitions,"
        f" {r.rate:g} records/s, stop by {r.sig} ...",
        flush=True,
    )
    try:
        got = run_rollout(r, broker, app, directory, side)
    except (RuntimeError, TimeoutError) as exc:
        print(f"  failed: {exc}", flush=True)
        return {"kind": r.kind, "members": r.members, "signal": r.sig, "failed": str(exc)}
    print(
        f"  lost {got['lost']}, innocent in DLQ {got['innocent_dead_lettered']}, counts backwards"
        f" {got['counts_backwards']}, duplicates {got['duplicate_deliveries']} (in flight at stops"
        f" {got['in_flight_at_stops']}), longest silence {got['longest_silence_s']:.1f} s,"
        f" wall {got['rollout_wall_s']:.0f} s",
        flush=True,
    )
    for row in got["duplicates_by_stop"]:
        print(
            f"    after stop {row['stop']}: {row['deliveries']} on partitions {row['partitions']},"
            f" answered before: {row['before']}",
            flush=True,
        )
    return got


__all__ = ["SCALE_SCENARIOS", "add_options", "part_scale"]
