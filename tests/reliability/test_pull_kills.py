"""Pull mode under kill -9: the sidecar dies holding pulled, unanswered records.

The app is a pulling worker (`GET /v1/records`, answers through `POST /v1/acks`) that answers by the
record's kind (tests/faults/workload.py) and journals each answer; before each kill it stops answering
and holds what it pulled. After the restarts nothing is lost (tests/checker.py), the held records come
back at the delivery count they were held at (crash isolation charges no one), and counts of records
released before a kill go on from where they were.
"""

from __future__ import annotations

import base64
import random
import signal
from pathlib import Path
from typing import Any

import trio

from tests.checker import digest
from tests.faults.workload import Run, Seen, assert_clean, env_seed, open_run, plan_records
from tests.harness import sidecar
from tests.pulltools import PullClient, api_listen_of, to_pull_mode


def seen_of(record: dict[str, Any]) -> Seen:
    value = None if record["value"] is None else base64.b64decode(record["value"])
    rid, kind = "?", "ok"
    if value:
        parts = value.split(b":", 2)
        if len(parts) == 3:
            rid, kind = parts[0].decode("ascii", "replace"), parts[1].decode("ascii", "replace")
    return Seen(
        rid=rid,
        kind=kind,
        topic=record["topic"],
        partition=record["partition"],
        offset=record["offset"],
        count=record["delivery_count"],
        delivery_id=record["id"],
        value_sha=digest(value),
    )


class Worker:
    """Pulls and answers; `hold` makes it keep what it pulls unanswered (in `run.app.pending`)."""

    def __init__(self, run: Run, listen: str) -> None:
        self.run = run
        self.client = PullClient(listen, timeout_s=30)
        self.hold = False
        self.history: list[Seen] = []

    async def work(self) -> None:
        client = self.client
        while True:
            try:
                got = await trio.to_thread.run_sync(client.pull, 20, 500)
            except (OSError, AssertionError):
                client.close()
                await trio.sleep(0.2)
                continue
            seen = [seen_of(r) for r in got]
            self.history += seen
            if self.hold:
                for d in seen:
                    self.run.app.pending[d.delivery_id] = d
                continue
            await trio.sleep(0.02)  # an app that takes its time: the kills land mid-stream
            items = self.run.app.ack_items(seen)
            if items:
                try:
                    await trio.to_thread.run_sync(client.ack, items)
                except (OSError, AssertionError):
                    client.close()  # the sidecar died with the answers: they count as sent


async def test_pull_worker_with_records_held_at_three_kills(bootstrap: str, tmp_path: Path) -> None:
    seed = env_seed(2101)
    rng = random.Random(seed)
    n = 3000
    async with open_run(tmp_path, bootstrap=bootstrap, name="pullkill", limit=4) as run:
        await run.produce(plan_records(n, seed=seed, poison_ratio=0.05, release_ratio=0.05))
        cfg = to_pull_mode(run.config(extra={"share.record.lock.duration.ms": 120_000}))
        listen = api_listen_of(cfg)
        held_at: dict[tuple[str, int, int], int] = {}  # coord -> count it was held at
        worker = Worker(run, listen)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.work)
            for kill in range(3):
                async with sidecar(cfg) as sc:
                    await sc.wait_assigned(1)
                    target = run.app.seen + rng.randrange(150, 300)
                    with trio.fail_after(120):
                        while run.app.seen < target:
                            await trio.sleep(0.05)
                    # Past the isolation pass of the last kill's records (one at a time): hold
                    # records of normal delivery, many at once.
                    await sc.wait_status(
                        lambda st: (
                            len(st["partitions"]) == run.partitions and not st["isolation_active"]
                        ),
                        120,
                        "the isolation pass over",
                    )
                    worker.hold = True
                    with trio.fail_after(60):
                        while not run.app.pending:
                            await trio.sleep(0.05)
                    await trio.sleep(rng.uniform(0.2, 1.0))  # the kill lands with records held
                    print(f"kill {kill}: {run.app.seen} answered, {len(run.app.pending)} held")
                    sc.proc.send_signal(signal.SIGKILL)
                    assert await sc.wait_exit(30) == -signal.SIGKILL
                held = run.app.journal_unanswered()
                run.fault("sidecar_kill", f"kill {kill}: {len(held)} pulled records unanswered")
                held_at.update({d.coord: d.count for d in held})
                worker.hold = False
                await run.check_midway()
            before = len(worker.history)
            async with sidecar(cfg) as sc:
                await run.wait_done(240)
                assert await sc.stop() == 0
            nursery.cancel_scope.cancel()
        worker.client.close()
        report = await run.check()
    assert_clean(report, f"pull mode, 3 kills with pulled records held ({run.elapsed_s():.0f}s)")
    assert report.crashes == 3
    assert report.dlq_duplicates == 0 or report.duplicates_allowed
    assert held_at
    # A held record comes back at the count it was held at: the kill charged it nothing, and its
    # earlier deliveries (releases) still count.
    first_after: dict[tuple[str, int, int], int] = {}
    for d in worker.history[before:]:
        first_after.setdefault(d.coord, d.count)
    for coord, count in held_at.items():
        if coord in first_after:
            assert first_after[coord] == count, (coord, count, first_after[coord])
    assert any(k > 1 for k in held_at.values()), "no held record had been released before"
    assert not report.crash_charged, report.crash_charged


async def test_no_poll_no_charge_a_restart_without_pollers_counts_nothing(
    bootstrap: str, tmp_path: Path
) -> None:
    """Killed with pulled records held, restarted with no worker pulling, killed again: the isolation
    pass charges a suspect only for a waiting poll, so the held records come back at their count."""
    async with open_run(tmp_path, bootstrap=bootstrap, name="pullidle", partitions=1) as run:
        await run.produce(plan_records(40, seed=7, poison_ratio=0.0))
        cfg = to_pull_mode(run.config(extra={"share.record.lock.duration.ms": 120_000}))
        listen = api_listen_of(cfg)
        worker = Worker(run, listen)
        worker.hold = True
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.work)
            async with sidecar(cfg) as sc:
                with trio.fail_after(60):
                    while not run.app.pending:
                        await trio.sleep(0.05)
                sc.proc.send_signal(signal.SIGKILL)
                assert await sc.wait_exit(30) == -signal.SIGKILL
            nursery.cancel_scope.cancel()
        worker.client.close()
        held = {d.coord: d.count for d in run.app.journal_unanswered()}
        run.fault("sidecar_kill", f"{len(held)} pulled records unanswered")
        assert held and set(held.values()) == {1}
        async with sidecar(cfg) as sc:
            # Restored: the held records are suspects, the pass is ready to isolate the first. With
            # no poll waiting it must stay so (an absence: watched over twenty status reads; a
            # charge would show within one scheduler turn as `charged` or `in_flight`).
            await sc.wait_status(lambda st: st["suspects_total"] > 0, 60, "the suspects restored")
            for _ in range(20):
                st = await sc.status()
                phases = {p.get("isolation") for p in st["partitions"]}
                assert phases == {"ready"} and st["isolated_total"] == 0, st["partitions"]
                await trio.sleep(0.05)
            sc.proc.send_signal(signal.SIGKILL)
            assert await sc.wait_exit(30) == -signal.SIGKILL
        run.fault("sidecar_kill", "with no poll waiting")
        worker = Worker(run, listen)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker.work)
            async with sidecar(cfg) as sc:
                await run.wait_done(120)
                assert await sc.stop() == 0
            nursery.cancel_scope.cancel()
        worker.client.close()
        report = await run.check()
    assert_clean(report, "pull mode, a restart with no poller between two kills")
    first = {}
    for d in worker.history:
        first.setdefault(d.coord, d.count)
    for coord in held:
        assert first[coord] == 1, (coord, first[coord])
    assert not report.crash_charged, report.crash_charged
