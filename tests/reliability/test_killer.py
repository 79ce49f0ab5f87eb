"""A record that kills the sidecar on every delivery (docs/guarantees.md crash isolation), both engines.

The app SIGKILLs the sidecar whenever the killer record reaches it, holds every other record a
while (so many are in flight at each death), and the sidecar is restarted after each death.
Consumer engine: the killer reaches the DLQ after at most `limit + 1` deaths, nothing is lost, no
other record is dead-lettered, and no other record's delivery count goes up because of the deaths.
Share engine (one share consumer): the broker charges every held record, but the isolation pass
keeps every other record out of the DLQ; the killer is there after `limit` deaths.
"""

from __future__ import annotations

import http.client
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio

from sidecar.http.server import Response
from tests.faults.workload import (
    AppServer,
    JournalApp,
    RecordPlan,
    Seen,
    assert_clean,
    open_run,
    plan_records,
)
from tests.harness import sidecar

LIMIT = 3
HOLD_S = 0.05  # every other record is held this long: several are in flight at each death
N_RECORDS = 90
STUCK_S = 290  # one incarnation: a death or the end (the waits below allow 300 s)


@dataclass
class KillerApp(JournalApp):
    """JournalApp, plus: the record of kind `killer` makes the app SIGKILL the sidecar `kill_pid`."""

    kill_pid: int = 0
    kills: int = 0
    killer_counts: tuple[int, ...] = ()
    killer_coord: tuple[str, int, int] | None = None

    async def respond(self, seen: Seen) -> Response:
        if seen.kind != "killer":
            return await super().respond(seen)
        self.note(seen, "killed")
        self.killer_counts = (*self.killer_counts, seen.count)
        self.killer_coord = seen.coord
        if self.kill_pid:
            pid, self.kill_pid = self.kill_pid, 0
            os.kill(pid, signal.SIGKILL)
            self.kills += 1
        await trio.sleep_forever()  # the sidecar is gone; its connection closes under us
        raise AssertionError("unreachable")


class KillerServer(AppServer):
    def __init__(self, app: JournalApp, port: int) -> None:
        super().__init__(KillerApp(app.journal, delay_s=app.delay_s), port)


def _plans(n: int, killer_at: int, seed: int) -> list[RecordPlan]:
    plans = plan_records(n, seed=seed, poison_ratio=0.0)
    victim = plans[killer_at]
    plans[killer_at] = RecordPlan(
        victim.id, "killer", victim.key, f"{victim.id}:killer:".encode() + b"x" * 40
    )
    return plans


async def _report_if_stuck(sc: Any, run: Any) -> None:
    """Fail with the sidecar's status and log when it neither dies nor finishes in time."""
    await trio.sleep(STUCK_S)
    status = await sc.status()
    raise AssertionError(
        f"neither a death nor done after {STUCK_S}s; status {status}\n{sc.log_text()[-4000:]}"
    )


async def _until_it_survives(
    run: Any,
    app: KillerApp,
    cfg: Path,
    wait_done: Callable[[Any], Awaitable[None]] | None = None,
) -> tuple[int, dict[str, Any]]:
    """Restart the sidecar after each death until it finishes the run; the deaths and its status."""
    deaths = 0
    status: dict[str, Any] = {}
    for _ in range(LIMIT + 3):
        async with sidecar(cfg) as sc:
            app.kill_pid = sc.proc.pid
            kills_before = app.kills
            outcome = ""
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_report_if_stuck, sc, run)

                async def died() -> None:
                    nonlocal outcome
                    await sc.wait_exit(300)
                    outcome = "died"
                    nursery.cancel_scope.cancel()

                async def finished() -> None:
                    nonlocal outcome
                    if wait_done is None:
                        await run.wait_done(300)
                    else:
                        await wait_done(sc)
                    outcome = "done"
                    nursery.cancel_scope.cancel()

                nursery.start_soon(died)
                nursery.start_soon(finished)
            if outcome == "done":
                status = await sc.status()
                assert await sc.stop() == 0
                break
            assert app.kills == kills_before + 1, (
                f"the sidecar died by itself:\n{sc.log_text()[-3000:]}"
            )
            assert sc.proc.returncode == -signal.SIGKILL
            deaths += 1
            run.fault("sidecar_kill", f"pid {sc.proc.pid}: the killer arrived")
    else:
        raise AssertionError(f"not done after {deaths} deaths")
    return deaths, status


@pytest.mark.parametrize("ordering", ["key", "none"])
async def test_killer_record_is_dead_lettered_alone(
    bootstrap: str, tmp_path: Path, ordering: str
) -> None:
    async with open_run(
        tmp_path,
        bootstrap=bootstrap,
        name=f"killer-{ordering}",
        limit=LIMIT,
        app_delay_s=HOLD_S,
        server_class=KillerServer,
    ) as run:
        app = run.server.app
        assert isinstance(app, KillerApp)
        n = await run.produce(_plans(N_RECORDS, killer_at=40, seed=19))
        cfg = run.config(extra={"engine": "consumer", "ordering": ordering})
        deaths, status = await _until_it_survives(run, app, cfg)
        report = await run.check()
        dlq = await run.dlq_by_source()
    assert_clean(report, f"killer, ordering {ordering}: {deaths} deaths")
    assert n == N_RECORDS
    killer = app.killer_coord
    assert killer is not None
    # Only the killer is dead-lettered, after at most limit + 1 deaths: its first death happens in
    # normal delivery (uncharged), every later one with it alone in flight and charged.
    assert sorted(dlq) == [killer], sorted(dlq)
    assert 1 <= deaths <= LIMIT + 1, (deaths, app.killer_counts)
    assert len(app.killer_counts) == deaths
    # No other record's count went up because of a death (the checker's crash_charged rule).
    assert set(report.crash_charged) <= {killer}, report.crash_charged
    assert status["isolation_active"] is False
    assert status["suspects_left"] == 0
    assert status["crash_accounting"] == "horizon"


async def test_share_engine_killer_is_dead_lettered_alone(bootstrap: str, tmp_path: Path) -> None:
    """engine: share, one share consumer (`app.max.in.flight: 1`): the broker charges every record
    the dead sidecar held, but after the first death those come back as suspects and go to the app
    one at a time, with every other outcome already at the broker and in alternating offset order,
    so no other record reaches the limit: only the killer is dead-lettered, after at most `limit`
    deaths (the broker counts the first death too). With four consumers a death can charge a
    record up to four times (docs/engines.md, "What a death charges"): not promised there."""
    async with open_run(
        tmp_path,
        bootstrap=bootstrap,
        name="killer-share",
        limit=LIMIT,
        app_delay_s=HOLD_S,
        server_class=KillerServer,
    ) as run:
        app = run.server.app
        assert isinstance(app, KillerApp)
        n = await run.produce(_plans(N_RECORDS, killer_at=40, seed=19))
        app.keep_history = True
        # Without a journal (share.journal.path: null): the broker's counts, the case above.
        cfg = run.config(
            extra={"engine": "share", "ordering": "none", "share.journal.path": None},
            app_extra={"max.in.flight": 1},
        )

        async def share_done(sc: Any) -> None:
            # A share group commits no offsets: done once every record was answered by the app
            # or is in the DLQ, and the sidecar holds nothing.
            while True:
                answered = {s.coord for s in app.history if s.kind != "killer"}
                dead = set(await run.dlq_by_source())
                try:
                    st = (await sc.status())["share"]
                except (OSError, http.client.HTTPException):
                    await trio.sleep(0.5)  # killed while answering: `died` sees it
                    continue
                settled = not st["batches_in_flight"] and not st["suspects_waiting"]
                if settled and len(answered | dead) >= n:
                    return
                await trio.sleep(0.5)

        deaths, status = await _until_it_survives(run, app, cfg, share_done)
        dlq = await run.dlq_by_source()
    assert n == N_RECORDS
    killer = app.killer_coord
    assert killer is not None
    assert sorted(dlq) == [killer], sorted(dlq)
    # Never sent past the limit, nothing lost.
    assert max(s.count for s in app.history) <= LIMIT
    assert len({s.coord for s in app.history} | set(dlq)) == n
    assert 1 <= deaths <= LIMIT, (deaths, app.killer_counts)
    assert len(app.killer_counts) == deaths
    share = status["share"]
    assert share["isolation_active"] is False
    assert share["suspects_waiting"] == 0
    # One consumer: each death charged the killer once (1, 2, 3), the last incarnation
    # dead-lettered it at acquisition (count 4) without sending it.
    assert app.killer_counts == (1, 2, 3), app.killer_counts
