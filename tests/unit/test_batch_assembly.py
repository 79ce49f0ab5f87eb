"""When a batch leaves (sidecar.engines.batching.BatchAssembler, and the pipeline's workers around it).

The rule (issue 19, item 4: "a record waits at most the linger plus one round trip"): a batch goes to a
worker when it holds `batch.max.records`, or `batch.linger.ms` after its first record arrived, whichever
comes first, at once when a worker is free. Time is trio's autojump clock, so "at once" and "after the
linger" are exact and no test depends on how loaded the machine is.

The regression: each worker took one record from the queue and then waited for the one lingering
worker's lock, so at 1,000 records/s with 64 workers and a 5 ms linger a record waited up to 64 lingers
(p99 344 ms in the issue's measurement).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import trio
from trio.testing import MockClock, wait_all_tasks_blocked

from sidecar.config import Config, parse_config
from sidecar.core.outcome import Ack
from sidecar.core.record import SourceRecord, Tracked
from sidecar.core.wire import AckItem, Answer, RecordView
from sidecar.engines.interfaces import Answered, Settled, Until
from sidecar.engines.pipeline import BatchAssembler, Delivery, Pipeline

LINGER_S = 0.005


class Sent:
    """What the assembler handed to the workers, and when (trio time)."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[int]]] = []

    def __call__(self, items: list[int]) -> None:
        self.batches.append((trio.current_time(), items))


def assembler(
    sent: Sent, *, max_records: int = 100, linger_s: float = LINGER_S, workers: int = 4
) -> BatchAssembler[int]:
    return BatchAssembler(max_records, linger_s, workers, sent)


async def test_a_lone_record_leaves_when_the_linger_is_over(autojump_clock: MockClock) -> None:
    sent = Sent()
    batches = assembler(sent)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batches.run_timer)
        await trio.sleep(1)  # the timer sleeps while nothing is open
        start = trio.current_time()
        batches.add(1)
        await trio.sleep(LINGER_S / 2)
        assert sent.batches == []
        await trio.sleep(1)
        assert sent.batches == [(pytest.approx(start + LINGER_S), [1])]
        nursery.cancel_scope.cancel()


async def test_what_arrives_within_the_linger_shares_the_batch(autojump_clock: MockClock) -> None:
    """A record every millisecond, 5 ms linger: batches of five, each record waits ≤ the linger."""
    sent = Sent()
    batches = assembler(sent, workers=50)  # none is given back: enough for every batch
    arrived: dict[int, float] = {}
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batches.run_timer)
        for i in range(50):
            arrived[i] = trio.current_time()
            batches.add(i)
            await trio.sleep(0.001)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert sorted(i for _, items in sent.batches for i in items) == list(range(50))
    for at, items in sent.batches:
        assert at == pytest.approx(arrived[items[0]] + LINGER_S)
        assert all(at - arrived[i] <= LINGER_S + 1e-9 for i in items)
    assert len(sent.batches) <= 10


async def test_a_full_batch_leaves_at_once(autojump_clock: MockClock) -> None:
    sent = Sent()
    batches = assembler(sent, max_records=3)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batches.run_timer)
        start = trio.current_time()
        for i in range(7):
            batches.add(i)
        assert [items for _, items in sent.batches] == [[0, 1, 2], [3, 4, 5]]
        assert all(at == start for at, _ in sent.batches)
        await trio.sleep(1)
        assert sent.batches[2] == (pytest.approx(start + LINGER_S), [6])
        nursery.cancel_scope.cancel()


async def test_with_every_worker_busy_a_due_batch_fills_and_leaves_when_one_is_free(
    autojump_clock: MockClock,
) -> None:
    sent = Sent()
    batches = assembler(sent, max_records=4, workers=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batches.run_timer)
        batches.add(0)
        await trio.sleep(1)
        assert [items for _, items in sent.batches] == [[0]]  # the one worker is busy from now on
        for i in range(1, 7):
            batches.add(i)
            await trio.sleep(0.1)  # each much later than the linger: due, no worker
        assert len(sent.batches) == 1, "a batch left with no worker free"
        assert batches.queued() == 6
        freed = trio.current_time()
        batches.slot_free()
        # The oldest batch, full (it went on filling while due), leaves at once; the next one was
        # due long ago too but waits for the next free worker.
        assert sent.batches[1] == (freed, [1, 2, 3, 4])
        await trio.sleep(1)
        assert len(sent.batches) == 2
        batches.slot_free()
        assert sent.batches[2][1] == [5, 6]
        await trio.sleep(1)
        batches.add(7)  # a worker is free again (the last batch's): linger from its arrival
        start = trio.current_time()
        await trio.sleep(1)
        assert len(sent.batches) == 3, "no worker is free: the batch waits"
        batches.slot_free()
        assert sent.batches[3][1] == [7]
        assert sent.batches[3][0] > start
        nursery.cancel_scope.cancel()


async def test_linger_zero_groups_what_one_task_adds_in_one_go(autojump_clock: MockClock) -> None:
    sent = Sent()
    batches = assembler(sent, linger_s=0.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batches.run_timer)
        start = trio.current_time()
        for i in range(5):
            batches.add(i)
        assert sent.batches == []
        await wait_all_tasks_blocked()
        assert sent.batches == [(start, [0, 1, 2, 3, 4])]
        nursery.cancel_scope.cancel()


async def test_single_mode_sends_each_record_at_once_without_a_timer() -> None:
    sent = Sent()
    batches = assembler(sent, max_records=1, linger_s=0.0, workers=2)
    assert not batches.needs_timer
    for i in range(3):
        batches.add(i)
    assert [items for _, items in sent.batches] == [[0], [1]]
    batches.slot_free()
    assert [items for _, items in sent.batches] == [[0], [1], [2]]


async def test_the_timer_does_not_wake_while_nothing_is_open(
    autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No busy timer: idle, the timer task is parked on an event, not on a sleep."""
    sent = Sent()
    batches = assembler(sent)
    sleeps: list[float] = []
    real_sleep_until = trio.sleep_until

    async def counting_sleep_until(deadline: float) -> None:
        sleeps.append(deadline)
        await real_sleep_until(deadline)

    monkeypatch.setattr(trio, "sleep_until", counting_sleep_until)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(batches.run_timer)
        await trio.sleep(3600)
        assert sleeps == []
        batches.add(1)
        await trio.sleep(3600)
        assert len(sleeps) == 1 and len(sent.batches) == 1
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------------- the pipeline's requests


class FakeState:
    """A StateAdapter that accepts every answer (the pipeline's requests are under test)."""

    def answered(self, delivery: Delivery, ack: Ack, answer: Answer | AckItem) -> Answered:
        # What a ledger would decide below the limit.
        return _SETTLED[ack]

    def wake(self, *, now: bool = False) -> None:
        pass

    async def not_reached(self, deliveries: Sequence[Delivery]) -> bool:
        raise AssertionError("the fake app is always reachable")


class FakePool:
    """What the pipeline gives the app client's pool when it builds the client."""

    def __init__(self, after_round: Callable[[], None] | None) -> None:
        self.after_round = after_round

    def abandon(self, exchange: object) -> None:
        pass


class FakeApp:
    """Answers every batch after `round_trip_s`, noting when each record was sent (trio time)."""

    def __init__(self, round_trip_s: float) -> None:
        self.round_trip_s = round_trip_s
        self.sent_at: dict[int, float] = {}
        self.batch_sizes: list[int] = []
        self.pool = FakePool(None)

    def client(
        self,
        _config: Config,
        *,
        after_round: Callable[[], None],
        on_error: Callable[[BaseException], None],
    ) -> FakeApp:
        """The pipeline's app client factory: this app, with the pipeline's callbacks."""
        self.pool = FakePool(after_round)
        return self

    def start_batch(
        self,
        records: Sequence[RecordView],
        timeout_s: float,
        done: Callable[[dict[str, Answer]], None],
    ) -> None:
        now = trio.current_time()
        self.batch_sizes.append(len(records))
        for r in records:
            self.sent_at[r.offset] = now
        trio.lowlevel.spawn_system_task(self._answer, list(records), done)

    async def _answer(
        self, records: list[RecordView], done: Callable[[dict[str, Answer]], None]
    ) -> None:
        await trio.sleep(self.round_trip_s)
        done({r.delivery_id: Answer("accept") for r in records})
        if self.pool.after_round is not None:
            self.pool.after_round()

    async def aclose(self) -> None:
        pass


def batch_config(max_in_flight: int) -> Config:
    return parse_config(
        {
            "kafka": {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"},
            "source": {"topics": ["t"]},
            "app": {
                "url": "http://127.0.0.1:8080/records",
                "mode": "batch",
                "batch.max.records": 100,
                "batch.linger.ms": int(LINGER_S * 1000),
                "max.in.flight": max_in_flight,
            },
        }
    )


def tracked(offset: int) -> Tracked:
    return Tracked(SourceRecord("t", 0, offset, None, b"v", (), 0, "create"))


async def test_at_1000_records_per_second_a_record_waits_at_most_the_linger(
    autojump_clock: MockClock,
) -> None:
    """64 workers, 5 ms linger, 2 ms app round trip, a record every millisecond (issue 19's case)."""
    app = FakeApp(round_trip_s=0.002)
    pipe = Pipeline(batch_config(64), lambda _p: FakeState(), app_client=app.client)  # type: ignore[arg-type,return-value]
    arrived: dict[int, float] = {}
    async with trio.open_nursery() as nursery:
        pipe.start_requests(nursery)
        for offset in range(1000):
            arrived[offset] = trio.current_time()
            pipe.outlet.send(pipe.outlet.issue(tracked(offset), 1, None))
            await trio.sleep(0.001)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert sorted(app.sent_at) == list(range(1000))
    waits = [app.sent_at[o] - arrived[o] for o in range(1000)]
    assert max(waits) <= LINGER_S + 1e-6, f"a record waited {max(waits) * 1000:.1f} ms"
    assert min(app.batch_sizes) >= 1 and len(app.batch_sizes) <= 1000 / 4
    assert pipe.outlet.sending == 0 and pipe.outlet.room().in_flight == 0


async def test_the_workers_send_full_batches_at_once(autojump_clock: MockClock) -> None:
    """A backlog handed out in one go leaves as full batches without waiting for the linger."""
    app = FakeApp(round_trip_s=0.010)
    pipe = Pipeline(batch_config(4), lambda _p: FakeState(), app_client=app.client)  # type: ignore[arg-type,return-value]
    async with trio.open_nursery() as nursery:
        pipe.start_requests(nursery)
        start = trio.current_time()
        for offset in range(450):
            pipe.outlet.send(pipe.outlet.issue(tracked(offset), 1, None))
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert app.batch_sizes == [100, 100, 100, 100, 50]
    assert [app.sent_at[o] for o in (0, 100, 200, 300)] == [start] * 4
    # The fifth waited for a free worker, no longer: the first answer came after 10 ms.
    assert app.sent_at[400] == pytest.approx(start + 0.010)


async def test_waiting_for_a_reachable_app_returns_at_once(autojump_clock: MockClock) -> None:
    """The share engine asks before every poll: with the app reachable the answer is immediate.

    The regression: the pipeline's "app is back" event started unset, so each share consumer waited
    its whole 0.5 s timeout before every poll (share-engine throughput halved).
    """
    pipe = Pipeline(batch_config(4), lambda _p: FakeState())  # type: ignore[arg-type,return-value]
    start = trio.current_time()
    assert await pipe.outlet.wait(Until.APP_REACHABLE, start + 0.5) is True
    assert await pipe.outlet.wait(Until.INTAKE_OPEN, start + 0.5) is True
    assert trio.current_time() == start


_SETTLED = {
    Ack.ACCEPT: Settled.ACCEPTED,
    Ack.RELEASE: Settled.REDELIVERED,
    Ack.REJECT: Settled.DEAD_LETTERED,
    Ack.RENEW: Settled.KEPT,
}
