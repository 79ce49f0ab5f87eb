"""Soak run (not part of CI): steady load, several sidecars, a seeded random fault schedule, then the checker.

    python -m tests.reliability.soak --minutes 20 [--seed N] [--sidecars 3] [--transactional]

A private broker behind the fault proxy is started for the run (so broker and network faults are possible).
Records flow at `--rate` per second with random outcomes (poison, always-release); every few seconds one fault
from the schedule lands: a sidecar SIGKILLed or restarted, the app down or slow, the broker paused or killed and
restarted, the connection blackholed or slowed, the DLQ refusing writes. After the last fault everything is
healed, the backlog drains, and the checker's table is printed with memory, file descriptors and lag over time.
The seed is printed first: rerun with it to replay the same schedule. Exit 0 clean, 1 violations.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import trio
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from tests.faults.broker import PrivateBroker, free_port
from tests.faults.proxy import BLACKHOLE, LATENCY, PASS, FaultProxy
from tests.faults.workload import Run, open_run, plan_records
from tests.harness import Sidecar, sidecar

FAULTS = {
    "sidecar_kill": 4,
    "sidecar_restart": 2,
    "app_down": 2,
    "app_slow": 1,
    "broker_pause": 2,
    "broker_restart": 1,
    "blackhole": 2,
    "latency": 1,
    "dlq_outage": 1,
}


@dataclass
class Slot:
    """One sidecar replica that faults may kill or restart."""

    config: Path
    sc: Sidecar | None = None
    stack: contextlib.AsyncExitStack | None = None
    unexpected_exits: list[int] = field(default_factory=list)

    async def start(self) -> None:
        self.stack = contextlib.AsyncExitStack()
        self.sc = await self.stack.enter_async_context(sidecar(self.config))

    async def kill(self) -> None:
        assert self.sc is not None and self.stack is not None
        self.sc.proc.send_signal(signal.SIGKILL)
        await self.sc.wait_exit(30)
        await self.stack.aclose()
        self.sc = None

    async def stop(self) -> None:
        if self.stack is not None:
            await self.stack.aclose()  # SIGTERM, then wait
        self.sc = None

    def pid(self) -> int | None:
        if self.sc is None or self.sc.proc.returncode is not None:
            return None
        return int(self.sc.proc.pid)


def _proc_sample(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open file descriptors) of a process, from /proc."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _set_min_isr(bootstrap: str, topic: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("min.insync.replicas", value, incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([res])[res].result(timeout=30)


async def soak(args: argparse.Namespace, workdir: Path) -> int:
    rng = random.Random(args.seed)  # the fault schedule
    load_rng = random.Random(
        args.seed + 1
    )  # record outcomes: its own stream, so the schedule replays
    proxy_port = free_port()
    samples: list[str] = []
    with (
        PrivateBroker(advertised_port=proxy_port) as broker,
        FaultProxy(broker.upstream, proxy_port) as proxy,
    ):
        print(f"starting a private broker ({await trio.to_thread.run_sync(broker.start):.0f}s)")
        async with open_run(
            workdir,
            bootstrap=broker.external,
            direct=broker.direct,
            name="soak",
            partitions=6,
            transactional=args.transactional,
            app_delay_s=0.005,
        ) as run:
            slots = [Slot(run.config()) for _ in range(args.sidecars)]
            for s in slots:
                await s.start()
            deadline = time.monotonic() + args.minutes * 60
            produced = 0
            producing_done = trio.Event()

            async def producer() -> None:
                nonlocal produced
                try:
                    await _produce_until_deadline()
                finally:
                    producing_done.set()

            async def _produce_until_deadline() -> None:
                nonlocal produced
                while time.monotonic() < deadline:
                    batch = plan_records(
                        args.rate,
                        seed=load_rng.randrange(1 << 30),
                        poison_ratio=0.04,
                        release_ratio=0.01,
                        start=produced,
                    )
                    produced += await run.produce(batch)
                    await trio.sleep(1.0)

            async def sampler() -> None:
                while True:
                    rows = []
                    for i, s in enumerate(slots):
                        pid = s.pid()
                        if pid is None:
                            rows.append(f"sc{i}: down")
                            continue
                        with contextlib.suppress(OSError):
                            rss, fds = _proc_sample(pid)
                            rows.append(f"sc{i}: {rss // 1024} MiB {fds} fds")
                    with contextlib.suppress(Exception):
                        done, total = await trio.to_thread.run_sync(_progress, run)
                        rows.append(f"lag {total - done}")
                    line = f"t={run.elapsed_s():6.0f}s  " + "  ".join(rows)
                    samples.append(line)
                    print(line, flush=True)
                    await trio.sleep(args.sample_s)

            async def watchdog() -> None:
                # A replica that exits on its own is a finding (a sidecar must ride out these faults):
                # note it and start it again so the run goes on.
                while True:
                    for i, s in enumerate(slots):
                        if s.sc is not None and s.sc.proc.returncode is not None:
                            code = s.sc.proc.returncode
                            s.unexpected_exits.append(code)
                            run.fault("sidecar_exit", f"sc{i} exited {code}")
                            print(f"!! sc{i} exited on its own with {code}; restarting", flush=True)
                            await s.stop()
                            await s.start()
                    await trio.sleep(1.0)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(producer)
                nursery.start_soon(sampler)
                nursery.start_soon(watchdog)
                names, weights = zip(*FAULTS.items(), strict=True)
                while time.monotonic() < deadline:
                    await trio.sleep(rng.uniform(args.gap_min_s, args.gap_max_s))
                    if time.monotonic() >= deadline:
                        break
                    kind = rng.choices(names, weights)[0]
                    await _inject(kind, rng, run, slots, broker, proxy)
                # The last batch may still be on its way: drain only once it is in the topic, or
                # the drain could end before it lands and the checker would call it lost.
                await producing_done.wait()
                print("load and faults over; draining", flush=True)
                await run.wait_done(600)
                nursery.cancel_scope.cancel()
            for s in slots:
                await s.stop()
            report = await run.check()
    print()
    print("\n".join(samples[-40:]))
    print()
    print(f"seed {args.seed}, {args.minutes} min, {args.sidecars} sidecars, workdir {workdir}")
    print(report.table())
    exits = [c for s in slots for c in s.unexpected_exits]
    if exits:
        print(f"sidecars exited on their own: {exits}")
    return 0 if report.ok else 1


def _progress(run: Run) -> tuple[int, int]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": run.direct, "group.id": run.group})
    try:
        return run._progress(consumer)
    finally:
        consumer.close()


async def _inject(
    kind: str,
    rng: random.Random,
    run: Run,
    slots: list[Slot],
    broker: PrivateBroker,
    proxy: FaultProxy,
) -> None:
    hold_s = rng.uniform(3.0, 10.0)
    print(f"t={run.elapsed_s():6.0f}s  fault {kind} ({hold_s:.1f}s)", flush=True)
    if kind in ("sidecar_kill", "sidecar_restart"):
        slot = rng.choice([s for s in slots if s.sc is not None] or slots)
        if slot.sc is None:
            await slot.start()
            return
        run.fault(kind)
        if kind == "sidecar_kill":
            await slot.kill()
        else:
            await slot.stop()
        await trio.sleep(rng.uniform(0.0, 3.0))
        await slot.start()
    elif kind == "app_down":
        run.server.down()
        run.fault(kind)
        await trio.sleep(hold_s)
        await run.server.up()
    elif kind == "app_slow":
        run.fault(kind)
        before, run.app.delay_s = run.app.delay_s, 0.5
        await trio.sleep(hold_s)
        run.app.delay_s = before
    elif kind == "broker_pause":
        broker.pause()
        run.fault(kind)
        try:
            await trio.sleep(hold_s)
        finally:
            broker.resume()
    elif kind == "broker_restart":
        run.fault(kind)
        await trio.to_thread.run_sync(broker.restart)
    elif kind in ("blackhole", "latency"):
        run.fault(kind)
        mode = BLACKHOLE if kind == "blackhole" else LATENCY
        await trio.to_thread.run_sync(proxy.set_mode, mode, 0.2)
        await trio.sleep(hold_s)
        await trio.to_thread.run_sync(proxy.set_mode, PASS)
    elif kind == "dlq_outage":
        run.fault(kind)
        await trio.to_thread.run_sync(_set_min_isr, run.direct, run.dlq_topic, "2")
        await trio.sleep(hold_s)
        await trio.to_thread.run_sync(_set_min_isr, run.direct, run.dlq_topic, "1")
    else:
        raise AssertionError(kind)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--sidecars", type=int, default=2)
    parser.add_argument("--rate", type=int, default=100, help="records produced per second")
    parser.add_argument("--transactional", action="store_true")
    parser.add_argument("--gap-min-s", type=float, default=5.0)
    parser.add_argument("--gap-max-s", type=float, default=20.0)
    parser.add_argument("--sample-s", type=float, default=15.0)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    print(f"soak seed {args.seed}", flush=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dlq-soak-"))
    return trio.run(soak, args, workdir)


if __name__ == "__main__":
    sys.exit(main())
