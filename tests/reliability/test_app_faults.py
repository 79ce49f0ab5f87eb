"""Faults in the app: deferred answers given out of offset order and then a kill -9, garbage answers, a hang.

What each app answer means is the contract's (docs/app-contract.md): a request that was sent and
then failed — unparseable HTTP, a body declared JSON that does not parse, a truncated answer, a connection
closed mid-answer, no answer within `app.timeout.ms` — is an attempt and a release; a 2xx with a body that is
not declared JSON is an accept. So records that got only such failures up to the delivery limit are archived
("delivery count exceeded", the sidecar's error class), and the tests assert exactly that set from the journal.
"""

from __future__ import annotations

import random
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import trio

from tests.checker import CAUSE_DELIVERY_COUNT, CAUSE_REJECTED, parse_journal, read_journal
from tests.faults.appfaults import (
    ERROR_CLASS_BY_ANSWER,
    GARBAGE,
    GARBAGE_VARIANTS,
    HANG,
    HANG_ANSWER,
    HEALTHY,
    FaultyAppServer,
)
from tests.faults.workload import Run, Seen, assert_clean, env_seed, open_run, plan_records
from tests.harness import Sidecar, sidecar, wait_until, wait_until_thread

Coord = tuple[str, int, int]
H_CLASS = "__dlq.errors.exception.class.name"
H_COUNT = "__dlq.errors.delivery.count"


def _answered_at_the_limit(run: Run) -> set[str]:
    """The answers the app gave so far to a record's last attempt (delivery count at the limit): each
    one that is a failure archives that record with its error class. Reads whole journal lines only
    (the app is still writing)."""
    text = run.journal.path.read_text(encoding="utf-8")
    journal = parse_journal(text[: text.rfind("\n") + 1].splitlines())
    return {d.answer for d in journal.deliveries if d.count == journal.run.limit}


async def _assert_dlq_is_exactly_what_the_answers_make(run: Run) -> dict[str, int]:
    """Derive from the journal which records must be in the DLQ, with which cause, count and error class,
    and compare with the DLQ topic. Returns how many were archived per reason."""
    journal = await trio.to_thread.run_sync(read_journal, run.journal.path)
    limit = journal.run.limit
    answers: dict[Coord, list[tuple[int, str]]] = defaultdict(list)
    for d in journal.deliveries:
        answers[d.coord].append((d.count, d.answer))
    expected: dict[Coord, tuple[str, str, int]] = {}
    for coord, ds in answers.items():
        if any(a == "accept" for _, a in ds):
            continue
        count, last = ds[-1]
        if last == "reject":
            expected[coord] = (CAUSE_REJECTED, "test.Poison", count)
        else:
            # Not rejected and never accepted: only the delivery limit can have archived it, after a
            # failed attempt of the kind the last answer was.
            assert count == limit, (
                f"{coord}: last delivery {count} ({last}) below the limit {limit}"
            )
            expected[coord] = (CAUSE_DELIVERY_COUNT, ERROR_CLASS_BY_ANSWER[last], count)
    dlq = await run.dlq_by_source()
    actual = {
        coord: (
            e[0].header("__dlq.errors.message"),
            e[0].header(H_CLASS),
            int(e[0].header(H_COUNT) or 0),
        )
        for coord, e in dlq.items()
    }
    assert actual.keys() == expected.keys(), (
        f"in the DLQ, not expected: {sorted(actual.keys() - expected.keys())[:5]}; "
        f"expected, not in the DLQ: {sorted(expected.keys() - actual.keys())[:5]}"
    )
    # A hung attempt ends on the app timeout, unless the record's lock runs out first: the lock
    # started at acquisition, before the write-ahead commit, which a loaded machine can stretch past
    # lock - timeout (1.5 s here). Both classes name a hang the sidecar ended.
    for c, (cause, cls, count) in expected.items():
        if cls == "sidecar.AppTimeout" and actual[c][1] == "sidecar.LockTimeout":
            expected[c] = (cause, "sidecar.LockTimeout", count)
    wrong = {c: (actual[c], expected[c]) for c in expected if actual[c] != expected[c]}
    assert not wrong, (
        f"{len(wrong)} DLQ records differ (actual, expected): {list(wrong.items())[:5]}"
    )
    by_reason: dict[str, int] = defaultdict(int)
    for cause, cls, _ in expected.values():
        by_reason[cls if cause == CAUSE_DELIVERY_COUNT else "rejected"] += 1
    return dict(by_reason)


async def test_app_answers_garbage_then_recovers(bootstrap: str, tmp_path: Path) -> None:
    seed = env_seed(1001)
    async with open_run(
        tmp_path, bootstrap=bootstrap, name="garbage", server_class=FaultyAppServer
    ) as run:
        server = run.server
        assert isinstance(server, FaultyAppServer)
        await run.produce(plan_records(3000, seed=seed, poison_ratio=0.05))
        async with sidecar(run.config()) as sc:
            await wait_until(lambda: run.app.seen >= 500, 60, "500 deliveries")
            server.mode = GARBAGE
            run.fault("app_garbage")
            garbage_began = trio.current_time()
            # Garbage for 3 s, and on until every kind of failure was some record's last attempt
            # (what the DLQ assertions below need; a loaded machine makes fewer attempts in 3 s).
            failures = {g.answer for g in GARBAGE_VARIANTS if g.error_class is not None}
            await wait_until_thread(
                lambda: failures <= _answered_at_the_limit(run),
                120,
                "every garbage failure as a last attempt",
                poll_s=0.5,
            )
            await trio.sleep_until(garbage_began + 3.0)
            await run.check_midway()
            server.mode = HEALTHY
            run.fault("app_healthy")
            await run.wait_done(120)
            st = await sc.status()
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"app answers garbage 3 s ({run.elapsed_s():.0f}s)")
    assert st["failure"] is None
    # Every variant was answered during the window (the variant turns with offset and delivery count).
    for g in GARBAGE_VARIANTS:
        if g.answer != "accept":
            assert run.app.answers.get(g.answer, 0) > 0, (g.name, run.app.answers)
    archived = await _assert_dlq_is_exactly_what_the_answers_make(run)
    print(f"archived: {archived}, answers: {run.app.answers}")
    # Records whose three attempts all got garbage reached the limit, each kind of failure as the last
    # attempt for some (its class in the DLQ headers); an accepting 200 with a text body never did.
    for g in GARBAGE_VARIANTS:
        if g.error_class is not None:
            assert archived.get(g.error_class, 0) > 0, (g.error_class, archived)
    assert archived["rejected"] > 0
    # No crash, no rebalance: an accepted record — a 200 with a text body included — is never seen again.
    assert report.redelivered_after_accept == 0
    assert report.max_delivery_count <= run.info.limit


async def test_app_slow_then_hangs_then_recovers(bootstrap: str, tmp_path: Path) -> None:
    seed = env_seed(1002)
    async with open_run(
        tmp_path, bootstrap=bootstrap, name="hang", server_class=FaultyAppServer
    ) as run:
        server = run.server
        assert isinstance(server, FaultyAppServer)
        await run.produce(plan_records(2000, seed=seed, poison_ratio=0.05))
        # A short app timeout so hung attempts end quickly; the lock must outlast it (config rule).
        cfg = run.config(
            extra={"share.record.lock.duration.ms": 3000}, app_extra={"timeout.ms": 1500}
        )
        async with sidecar(cfg) as sc:
            await wait_until(lambda: run.app.seen >= 300, 60, "300 deliveries")
            # Slow, but well within the timeout: every answer counts, nothing is redelivered.
            run.app.delay_s = 0.25
            run.fault("app_slow")
            slow_began = trio.current_time()
            seen = run.app.seen
            await wait_until(lambda: run.app.seen > seen, 30, "answers while slow")  # still flowing
            await trio.sleep_until(slow_began + 2.0)
            run.app.delay_s = 0.0
            server.mode = HANG
            run.fault("app_hang")
            hang_began = trio.current_time()
            # Hung for 6 s, and on until some record's last attempt hung (attempts start about 1.6 s
            # apart: the timeout plus a short backoff; a loaded machine stretches that).
            await wait_until_thread(
                lambda: HANG_ANSWER in _answered_at_the_limit(run),
                120,
                "a last attempt that hung",
                poll_s=0.5,
            )
            await trio.sleep_until(hang_began + 6.0)
            await run.check_midway()
            hung = await sc.status()
            server.mode = HEALTHY
            run.fault("app_healthy")
            await run.wait_done(120)
            st = await sc.status()
            assert await sc.stop() == 0
        report = await run.check()
    assert_clean(report, f"app slow 2 s, hung 6 s ({run.elapsed_s():.0f}s)")
    assert st["failure"] is None
    # Connections were accepted throughout: a hung app is reachable, unlike a stopped one.
    assert hung["app_reachable"]
    assert run.app.answers.get(HANG_ANSWER, 0) > 0
    archived = await _assert_dlq_is_exactly_what_the_answers_make(run)
    print(f"archived: {archived}, answers: {run.app.answers}")
    # The records that hung first reached the limit within the hang, on timeouts alone: in the DLQ as
    # sidecar.AppTimeout.
    assert archived.get("sidecar.AppTimeout", 0) > 0, archived
    assert report.redelivered_after_accept == 0
    assert report.max_delivery_count <= run.info.limit


async def _settled(sc: Sidecar, quiet_s: float = 1.0, timeout_s: float = 60) -> dict[str, Any]:
    """Wait until the sidecar commits nothing new for `quiet_s` and no DLQ write is under way."""
    with trio.fail_after(timeout_s):
        last = await sc.status()
        quiet_since = trio.current_time()
        while True:
            await trio.sleep(0.2)
            st = await sc.status()
            busy = any(p["archiving"] for p in st["partitions"])
            if busy or st["counters"]["commits"] != last["counters"]["commits"]:
                quiet_since = trio.current_time()
            elif trio.current_time() - quiet_since >= quiet_s:
                return st
            last = st


async def test_out_of_order_acks_then_kill_9(bootstrap: str, tmp_path: Path) -> None:
    """The app defers every answer (202) and acknowledges through `POST /v1/acks`, later offsets of a
    partition first, withholding some records for good (holes); the sidecar is SIGKILLed with the holes
    open. Before the kill, each committed offset sits exactly on its partition's first hole; after a
    restart, exactly the records not acknowledged are delivered, once each, their counts not raised."""
    seed = env_seed(1003)
    rng = random.Random(seed)
    n = 2000
    async with open_run(tmp_path, bootstrap=bootstrap, name="ooo", keep_history=True) as run:
        await run.produce(plan_records(n, seed=seed, poison_ratio=0.05))
        run.app.defer = True
        # The lock outlasts the whole phase before the kill: a hole stays a hole, never expires.
        cfg = run.config(
            extra={"share.record.lock.duration.ms": 120_000}, app_extra={"max.in.flight": 64}
        )
        done: set[Coord] = set()  # acknowledged (accept, or reject) with result "ok"
        withheld: set[str] = set()  # delivery ids never answered on purpose
        out_of_order = 0  # acks of an offset while a lower offset of its partition was unanswered
        async with sidecar(cfg) as sc:
            await sc.wait_assigned(3)
            rounds = 0
            while len(done) < 800:
                await wait_until(
                    lambda: len(run.app.pending) - len(withheld) >= 8, 60, "deferred deliveries"
                )
                await trio.sleep(rng.uniform(0.0, 0.1))
                by_partition: dict[int, list[Seen]] = defaultdict(list)
                for d in run.app.pending.values():
                    if d.delivery_id not in withheld:
                        by_partition[d.partition].append(d)
                # Per partition from the highest offset down; partitions interleaved.
                queues: list[list[Seen]] = []
                for part in sorted(by_partition):
                    ds = sorted(by_partition[part], key=lambda d: d.offset, reverse=True)
                    if rounds < 3 and len(ds) >= 2:
                        withheld.add(ds[-1].delivery_id)  # the lowest offset: a hole below the rest
                        ds = ds[:-1]
                    queues.append(ds)
                order: list[Seen] = []
                while any(queues):
                    for q in queues:
                        if q:
                            order.append(q.pop(0))
                for d in order:
                    lower_open = [
                        p
                        for p in run.app.pending.values()
                        if p.partition == d.partition and p.offset < d.offset
                    ]
                    out_of_order += bool(lower_open)
                items = run.app.ack_items(order)
                code, body = await sc.post_json("/v1/acks", {"acks": items})
                assert code == 200, body
                results = {r["id"]: r["result"] for r in body["results"]}
                assert set(results.values()) == {"ok"}, results
                done.update(d.coord for d in order)
                rounds += 1
            # Stop answering: the sidecar hands out records of the keys not yet blocked until its
            # in-flight bound; all of those stay unanswered too.
            while True:
                handed_out = len(run.app.history)
                await trio.sleep(1.0)
                if len(run.app.history) == handed_out:
                    break
            await _settled(sc)
            await run.check_midway()
            # The committed offset is the lowest offset that is not done: exactly the first hole.
            journal = await trio.to_thread.run_sync(read_journal, run.journal.path)
            produced = {p.coord for p in journal.produced}
            first_hole = {
                part: min(off for (_, p, off) in produced - done if p == part)
                for part in range(run.partitions)
            }
            # Commits run on an interval (and a loaded machine can hold one back past the quiet
            # second above): wait for the one that covers the last acks. It never passes a hole.
            with trio.move_on_after(60):
                while (committed := await run.committed()) != first_hole:
                    await trio.sleep(0.5)
            assert committed == first_hole, (committed, first_hole)
            for part in range(run.partitions):
                # Records above the hole were acknowledged: the hole is a real one.
                assert any(p == part and off > first_hole[part] for (_, p, off) in done), part
            sc.proc.send_signal(signal.SIGKILL)
            assert await sc.wait_exit(30) == -signal.SIGKILL
        holes = run.app.journal_unanswered()
        run.fault("sidecar_kill", f"{len(holes)} deliveries unanswered, {len(done)} acknowledged")
        assert {d.delivery_id for d in holes} >= withheld
        before = len(run.app.history)
        run.app.defer = False
        async with sidecar(cfg) as sc:
            await run.wait_done(120)
            assert await sc.stop() == 0
        after = run.app.history[before:]
        report = await run.check()
    assert_clean(
        report, f"out-of-order acks, kill -9 with {len(holes)} holes ({run.elapsed_s():.0f}s)"
    )
    print(f"rounds {rounds}, out-of-order acks {out_of_order}, withheld {len(withheld)}")
    assert out_of_order > 0
    assert len(withheld) >= run.partitions
    # Exactly the records not acknowledged are delivered after the restart, each once.
    redelivered = [d.coord for d in after]
    assert len(redelivered) == len(set(redelivered)), "a record delivered twice after the restart"
    assert set(redelivered) == produced - done
    # Delivery counts survive the kill and the kill charges no one (docs/guarantees.md): a hole, in flight at
    # the kill, is delivered again at the same count; a record never handed out starts at 1.
    count_before = {d.coord: d.count for d in holes}
    for d in after:
        assert d.count == count_before.get(d.coord, 1), (d, count_before.get(d.coord))
    assert report.crashes == 1
    assert report.redelivered_after_accept == 0
    assert report.dlq_duplicates == 0
