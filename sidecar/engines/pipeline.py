"""The delivery pipeline both engines run, and the two interfaces around it.

The engines differ only in where a record's delivery state lives: in the sidecar's per-partition
ledgers plus the offset commit's metadata (``engine: consumer``, :mod:`sidecar.engine`), or in the
broker's share partitions (``engine: share``, :mod:`sidecar.share_engine`). That difference is a
:class:`DeliveryState` adapter; everything else is here, once::

    DeliveryState (intake) ──issue()/send()──▶ batch assembler ──▶ workers ──HTTP──▶ app
          ▲                                                           │
          │ answered()                                                ▼
          └───────────────────────── answer() ◀── the app's answer, or POST /v1/acks
    DeliveryState (archiving) ──dead_letter()──▶ DLQ writer ──confirmed──▶ DeliveryState

    pull mode (app.mode: pull): send() ──▶ PullQueue ◀── GET /v1/records (the app's long polls)

:class:`Pipeline` is the one implementation of :class:`Engine`, the interface the daemon, the local
API and the metrics use. The daemon starts it with ``await nursery.start(engine.run)`` and steers it
only through that interface (``request_stop``, ``skip_drain``); nothing sets its attributes.

Who may change what (every call below runs in the trio thread and changes state synchronously,
between two awaits, so each change is atomic):

- ``_live`` (delivery id → live :class:`Delivery`): ``issue`` (the adapter's intake task), ``retire``
  (the adapter: expiry, revoke, not reachable), ``answer`` (a worker, or the API's request task);
- ``counters``: the pipeline, and the adapter for its own (commits, rebalances);
- app reachability: the workers (not reachable) and the probe task (reachable again);
- the DLQ circuit breaker (:mod:`sidecar.core.breaker`): ``dead_letter`` (hold or write), ``_apply``
  (successes, the probe's verdict), ``issue`` (the half-open probe), its timer task (half-open) and
  ``close_breaker`` (the API); adapters read ``breaker_room`` / ``breaker_open`` and keep the records
  it held until ``release_held``;
- stopping / draining / failure: ``run``'s shutdown sequence, ``fail`` and ``request_stop``;
- delivery state (ledgers, batches): only the adapter; the pipeline never touches it;
- the open app requests (:class:`BatchAssembler`): ``send`` adds, the workers take, the linger
  timer sends what has waited its linger;
- pull mode's :class:`PullQueue`: ``send`` puts, the API's poll tasks take (``pull``), ``_drain``
  releases the waiting polls.

Errors: a failure that cannot be retried ends in :meth:`Pipeline.fail` (the sidecar stops with
exit 1); the per-record dispatch (one DLQ write, one batch of a transaction) is the only place that
catches broadly. Must not import either engine, the ledger, or confluent-kafka.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

import trio
from opentelemetry import trace

from sidecar.config import AppMode, Config, ErrorsTolerance
from sidecar.core.breaker import BreakerPolicy, BreakerState, CircuitBreaker, Transition
from sidecar.core.deadletter import (
    ArchiveOutcome,
    DeadLetterPlan,
    FailedRecord,
    archived_log_fields,
    dead_letter,
)
from sidecar.core.errors import SidecarError
from sidecar.core.outcome import (
    ACK_BY_WORD,
    DLQ_WRITE_FAILED,
    Accept,
    Ack,
    ArchiveReason,
    DeadLetter,
    ErrorInfo,
    decide,
)
from sidecar.core.record import LiveIds, Tracked, custom_dead_letter
from sidecar.core.wire import AckItem, Answer, RecordView
from sidecar.engines.delivery import (
    abandon_attempt_span,
    app_client_for,
    attempt_view,
    end_attempt_span,
)
from sidecar.http.appclient import AppClient, AppNotReachable, AppTarget
from sidecar.kafka.dlq import DlqFatalError, DlqWriter
from sidecar.kafka.source import SourceError, check_cluster_sync
from sidecar.telemetry.tracing import Tracing

# Between two start-up checks of a cluster that cannot be used (authentication, TLS, connection).
CLUSTER_RETRY_MAX_S = 10.0

log = logging.getLogger("sidecar.engine")  # the engine's messages, whichever adapter runs

PartitionKey = tuple[str, int]
AckResult = Literal["ok", "unknown", "expired"]
# Writes one DLQ record; False when the record went to another owner before it could be (its
# new owner archives it); raises DlqFatalError when it cannot be written.
DlqWrite = Callable[[FailedRecord, str], Awaitable[bool]]

# The app prober's connection attempt.
PROBE_TIMEOUT_S = 2.0


@dataclass(slots=True)
class Counters:
    """Plain integers the metrics read at scrape time (the hot path makes no metric calls)."""

    delivered: dict[str, int] = field(default_factory=dict)  # outcome -> count
    attempts: int = 0
    not_attempted: int = 0
    archived: dict[str, int] = field(default_factory=dict)  # reason -> count
    dlq_written: int = 0
    dlq_failed: int = 0
    expired_answers: int = 0
    commits: int = 0
    commit_failures: int = 0
    rebalances: int = 0
    metadata_pauses: int = 0
    # topic -> records the broker archives on its own, with no DLQ record (share engine; a defect to report)
    broker_archived: dict[str, int] = field(default_factory=dict)

    by_topic: dict[tuple[str, str], int] = field(default_factory=dict)  # (topic, outcome) -> count

    def bump(self, table: dict[Any, int], key: Any, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n

    def outcome(self, topic: str, word: str) -> None:
        self.bump(self.delivered, word)
        self.bump(self.by_topic, (topic, word))

    def snapshot(self) -> dict[str, Any]:
        return {
            "delivered": dict(self.delivered),
            "attempts": self.attempts,
            "not_attempted": self.not_attempted,
            "archived": dict(self.archived),
            "dlq_written": self.dlq_written,
            "dlq_failed": self.dlq_failed,
            "expired_answers": self.expired_answers,
            "commits": self.commits,
            "commit_failures": self.commit_failures,
            "rebalances": self.rebalances,
        }


@dataclass(slots=True, eq=False)
class Delivery:
    """One live attempt: a record handed to the app under a fresh random id.

    ``ref`` is the adapter's handle on the record's delivery state (a ledger attempt, a share
    batch); ``answer`` is set by the share adapter when the answer arrives.
    """

    id: str
    tracked: Tracked
    delivery_count: int
    ref: Any
    answer: Answer | AckItem | None = None
    # trio time the lock expires (pull mode tells the app); None: the config's lock from issue.
    lock_deadline: float | None = None
    # perf_counter when the app got it to answer later through /v1/acks (a pull, or a push answered
    # `deferred`): the answer's delay is observed from here. None: answered in its own request.
    handed_at: float | None = None
    sent: bool = False  # a request carrying it went out (share: a lock expiry before is no attempt)

    @property
    def topic(self) -> str:
        return self.tracked.record.topic


class DeliveryState(Protocol):
    """Where delivery state lives: what an engine adds to the pipeline (see the module docstring)."""

    kind: str  # "consumer" | "share": the status's `engine`

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Intake and the adapter's own tasks; started once subscribed. Cancelled at the end."""

    def answered(self, delivery: Delivery, ack: Ack, answer: Answer | AckItem) -> AckResult:
        """Apply an answer to a live delivery (the pipeline retires it and counts the outcome)."""

    async def not_reached(self, deliveries: Sequence[Delivery]) -> bool:
        """The app was not listening (not an attempt): True to send them again now."""

    def wake(self) -> None:
        """Something changed (an answer, a delivery finished): re-evaluate soon."""

    def intake_changed(self) -> None:
        """App reachability, draining or stopping changed: pause or resume intake now."""

    def stop_intake(self) -> None:
        """Shutdown begins: fetch no more records."""

    def release_held(self) -> None:
        """The DLQ circuit breaker is half-open or closed: records it held on their way to the DLQ
        (`ArchiveOutcome.HELD`) may go to the app again (within `Pipeline.breaker_room`)."""

    async def wait_drained(self) -> None:
        """Return once nothing is in flight (the pipeline bounds the wait)."""

    async def finish(self) -> None:
        """Final commits and close (shielded by the caller)."""

    def readiness(self) -> dict[str, bool]: ...
    def broker_error(self) -> str | None: ...
    def stalled(self) -> str | None: ...
    def status_fields(self) -> dict[str, Any]: ...
    def partitions(self) -> list[dict[str, Any]]: ...
    def paused(self) -> set[PartitionKey]: ...
    def lag(self) -> dict[PartitionKey, int]: ...
    def commit_metadata_bytes(self) -> dict[PartitionKey, int]: ...


class Engine(Protocol):
    """What the daemon, the local API and the metrics may do with an engine."""

    @property
    def config(self) -> Config: ...
    @property
    def failure(self) -> str | None: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def app_reachable(self) -> bool: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Prepare (DLQ topics), start, report started, and run until stopped; then shut down."""

    def request_stop(self) -> None: ...
    def skip_drain(self) -> None: ...
    def ack(self, items: Sequence[AckItem]) -> list[tuple[str, str]]: ...
    def readiness(self) -> dict[str, bool]: ...
    def broker_error(self) -> str | None: ...
    def stalled(self) -> str | None: ...
    def status(self) -> dict[str, Any]: ...
    def in_flight_records(self) -> int: ...
    def paused_partitions(self) -> set[PartitionKey]: ...
    def lag(self) -> dict[PartitionKey, int]: ...
    def commit_metadata_bytes(self) -> dict[PartitionKey, int]: ...
    def observe_latencies(
        self,
        app: Callable[[float], None],
        dlq: Callable[[float], None],
        acks: Callable[[float], None],
    ) -> None: ...
    async def pull(self, max_records: int, wait_s: float) -> list[PulledRecord]: ...
    def breaker_status(self) -> dict[str, Any] | None: ...
    def close_breaker(self, reason: str) -> bool: ...


T = TypeVar("T")


# ------------------------------------------------------------------------- pull mode


@dataclass(frozen=True, slots=True)
class PulledRecord:
    """One delivery handed to `GET /v1/records`: its wire view and how long its lock has left."""

    view: RecordView
    lock_remaining_s: float


class NotPullMode(SidecarError):
    """`GET /v1/records` on a sidecar that pushes records to the app (app.mode single/batch)."""


@dataclass(slots=True, eq=False)
class _PullWaiter:
    room: int  # how many more deliveries this poll takes
    items: list[Delivery] = field(default_factory=list)
    got: trio.Event = field(default_factory=trio.Event)


class PullQueue:
    """``app.mode: pull``: deliveries wait here for ``GET /v1/records`` instead of a worker.

    Demand drives intake: :meth:`demand` is what the waiting polls still take, minus what is
    queued, and the consumer-group engine acquires no more than that (``Pipeline.send_room``), so
    a record is acquired — its delivery counted and its lock started — only for a poll that is
    waiting for it, and the queue stays bounded by the polls' ``max``. A share group acquires
    whole broker batches when a poll waits (``Pipeline.wait_intake_open``); what the poll does
    not take waits here for the next one, under the broker's lock.

    Each delivery goes to exactly one poll: `put` gives it to the oldest poll with room (or the
    queue), and a poll takes what the queue holds first. A poll that is cancelled before it
    returned (shutdown, or its client closed the connection) gives its deliveries back, in
    order and uncounted, to the polls still waiting, then to the front of the queue; it wants
    nothing more. Every method runs in the trio thread; `put` never blocks.
    """

    def __init__(self) -> None:
        self._queued: deque[Delivery] = deque()
        self._waiters: deque[_PullWaiter] = deque()
        self._demand = trio.Event()  # set while a poll waits

    def queued(self) -> int:
        return len(self._queued)

    def waiting(self) -> int:
        return len(self._waiters)

    def demand(self) -> int:
        return max(0, sum(w.room for w in self._waiters) - len(self._queued))

    async def wait_demand(self) -> None:
        await self._demand.wait()

    def release_waiters(self) -> None:
        """Shutdown: every waiting poll returns now, with what it has (usually nothing)."""
        for waiter in self._waiters:
            waiter.room = 0
            waiter.got.set()

    def put(self, delivery: Delivery) -> None:
        for waiter in self._waiters:
            if waiter.room > 0:
                waiter.items.append(delivery)
                waiter.room -= 1
                waiter.got.set()
                return
        self._queued.append(delivery)

    async def take(
        self,
        max_records: int,
        wait_s: float,
        live: Callable[[Delivery], bool],
        wake: Callable[[], None],
    ) -> list[Delivery]:
        """Up to `max_records` live deliveries; waits up to `wait_s` for the first one.

        `live` drops what expired while it was queued; `wake` tells the engine there is demand.
        """
        out: list[Delivery] = []
        queued = self._queued
        while queued and len(out) < max_records:
            d = queued.popleft()
            if live(d):
                out.append(d)
        if out or wait_s <= 0:
            return out
        waiter = _PullWaiter(max_records)
        self._waiters.append(waiter)
        self._demand.set()
        try:
            wake()
            with trio.move_on_after(wait_s):
                while not waiter.items and waiter.room > 0:
                    await waiter.got.wait()
            return [d for d in waiter.items if live(d)]
        except BaseException:
            # Cancelled before the response was built (shutdown, or the client closed the
            # connection): nothing was handed out, so nothing was counted as an attempt.
            self._waiters.remove(waiter)
            self._give_back(waiter.items)
            waiter.items = []
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            if not self._waiters:
                self._demand = trio.Event()

    def _give_back(self, items: list[Delivery]) -> None:
        """A cancelled poll's deliveries, in order: to the polls still waiting with room (oldest
        first, as `put` does), the rest to the front of the queue."""
        rest = deque(items)
        for waiter in self._waiters:
            while rest and waiter.room > 0:
                waiter.items.append(rest.popleft())
                waiter.room -= 1
                waiter.got.set()
        self._queued.extendleft(reversed(rest))


@dataclass(slots=True, eq=False)
class _OpenBatch(Generic[T]):
    deadline: float  # trio time: its first record's arrival plus the linger
    items: list[T]


class BatchAssembler(Generic[T]):
    """Deliveries into app requests, and requests to the workers that are free.

    The rule (``app.mode: batch``): a batch goes to a worker when it holds ``max_records``, or
    ``linger_s`` after its first record arrived, whichever comes first — at once if a worker is
    free, else as soon as one is. Nothing else delays it: the linger is timed from the record's
    arrival here (not from a worker's next wake), one timer task sleeps until the oldest open
    batch's deadline and only while there is one, and a batch never waits for another batch's
    linger. While every worker is busy, a due batch goes on filling up to ``max_records`` (what
    arrives meanwhile rides along instead of forming near-empty batches behind it).

    Records stay here, not in a worker, until their batch leaves: a worker that took one record
    and then lingered (or waited for another worker's linger) is what made records wait many
    lingers. Single mode is ``max_records`` 1: every record is a full batch, and no timer runs.
    With linger 0 a batch is due at once but leaves after the adding task's next checkpoint, so
    what one hand-out adds in one go shares a request.

    Every method runs in the trio thread; `add` and `worker_free` never block.
    """

    def __init__(
        self,
        max_records: int,
        linger_s: float,
        workers: int,
        dispatch: Callable[[list[T]], None],
    ) -> None:
        self.max_records = max_records
        self.linger_s = linger_s
        self._dispatch = dispatch
        self._free = workers  # workers neither sending nor given a batch to send
        self._open: deque[_OpenBatch[T]] = deque()
        self._timer_wake = trio.Event()

    @property
    def needs_timer(self) -> bool:
        return self.max_records > 1

    def queued(self) -> int:
        """Records waiting for their batch to leave."""
        return sum(len(b.items) for b in self._open)

    def add(self, item: T) -> None:
        batches = self._open
        if self.max_records == 1 and self._free and not batches:
            self._free -= 1  # single mode with a worker free: straight to it
            self._dispatch([item])
            return
        if batches:
            tail = batches[-1]
            if len(tail.items) < self.max_records:
                tail.items.append(item)
                if len(tail.items) == self.max_records and self._free:
                    self._dispatch_due(trio.current_time())
                return
        if self.max_records == 1:
            batches.append(_OpenBatch(0.0, [item]))
            if self._free:
                self._dispatch_due(0.0)
            return
        batches.append(_OpenBatch(trio.current_time() + self.linger_s, [item]))
        if len(batches) == 1:
            self._timer_wake.set()

    def worker_free(self) -> None:
        """A worker finished its request: give it the oldest due batch, if any."""
        self._free += 1
        if self._open:
            self._dispatch_due(trio.current_time() if self.max_records > 1 else 0.0)

    def _due(self, batch: _OpenBatch[T], now: float) -> bool:
        return len(batch.items) >= self.max_records or now >= batch.deadline

    def _dispatch_due(self, now: float) -> None:
        batches = self._open
        while batches and self._free and self._due(batches[0], now):
            self._free -= 1
            self._dispatch(batches.popleft().items)
        if batches and not self._due(batches[0], now):
            self._timer_wake.set()  # a new oldest batch: the timer sleeps until its deadline

    async def run_timer(self) -> None:
        """Send each batch when its linger is over (the timer task; runs until cancelled)."""
        batches = self._open
        while True:
            now = trio.current_time()
            if not batches or (self._due(batches[0], now) and not self._free):
                # Nothing open, or the oldest batch is due and waits for a worker (`worker_free`
                # sends it): sleep until something is added or a batch left.
                self._timer_wake = trio.Event()
                await self._timer_wake.wait()
            elif self._due(batches[0], now):
                self._dispatch_due(now)
                await trio.lowlevel.checkpoint()
            else:
                await trio.sleep_until(batches[0].deadline)


def dlq_writer_for(config: Config) -> DlqWriter:
    dlq = config.errors.dlq
    return DlqWriter(
        config.kafka,
        config.group_id,
        copy_record=dlq.copy_record_enable,
        stacktrace_max_bytes=dlq.stacktrace_max_bytes,
        retries_timeout_ms=dlq.produce_retries_timeout_ms,
        auto_create=dlq.auto_create_enable,
        topic_partitions=dlq.topic_partitions,
        topic_replication_factor=dlq.topic_replication_factor,
    )


class Pipeline:
    """Workers, app prober, answers, DLQ step, status: one per sidecar, around one DeliveryState."""

    def __init__(
        self,
        config: Config,
        make_state: Callable[[Pipeline], DeliveryState],
        *,
        tracing: Tracing | None = None,
        random_bytes: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self.config = config
        self.tracing = tracing or Tracing(
            config.tracing.service_name, config.group_id, config.tracing.exporter.value
        )
        self.app: AppClient = app_client_for(config)
        self.dlq: DlqWriter = dlq_writer_for(config)
        self.counters = Counters()
        self.started_at = time.time()
        self.stopping = False
        self.draining = False
        self._failure: str | None = None
        self._dlq_ready = not config.errors.dlq.enabled
        self._live: LiveIds[Delivery] = LiveIds(random_bytes)
        # Requests for the workers: the assembler hands one over only when a worker is free, so
        # the channel holds at most one request per worker.
        self._work_send, self._work_recv = trio.open_memory_channel[list[Delivery]](math.inf)
        self.sending = 0  # deliveries handed over by `send` whose request has not finished
        app = config.app
        batch = app.mode == AppMode.BATCH
        self._batches = BatchAssembler[Delivery](
            app.batch_max_records if batch else 1,
            app.batch_linger_ms / 1000,
            app.max_in_flight,
            self._work_send.send_nowait,
        )
        # Deliveries the workers can take at once (push mode; see `send_room`).
        self.send_capacity = app.max_in_flight * (app.batch_max_records if batch else 1)
        self._pull: PullQueue | None = PullQueue() if app.mode == AppMode.PULL else None
        self._app_reachable = True
        self._app_back = trio.Event()  # set while the app is reachable
        self._app_back.set()
        self.app_down_since: float | None = None
        self._stop = trio.Event()
        # Why the cluster cannot be used at start-up (authentication, TLS, connection), while it cannot.
        self._cluster_error: str | None = None
        self._drain_cancel = trio.CancelScope()
        self._skip_drain = False
        self._nursery: trio.Nursery | None = None
        self._observe_app: Callable[[float], None] = _ignore
        self._observe_ack: Callable[[float], None] = _ignore
        self._observe_dlq: Callable[[float], None] = _ignore
        self._probe: Delivery | None = None  # the breaker's half-open probe (its attempt)
        self._init_breaker(config)
        self.state = make_state(self)

    # ------------------------------------------------------------------------- the Engine face

    @property
    def failure(self) -> str | None:
        return self._failure

    @property
    def app_reachable(self) -> bool:
        return self._app_reachable

    @property
    def dlq_ready(self) -> bool:
        return self._dlq_ready

    def observe_latencies(
        self,
        app: Callable[[float], None],
        dlq: Callable[[float], None],
        acks: Callable[[float], None],
    ) -> None:
        """Latency observers (seconds), Prometheus histograms: app requests, DLQ writes, and the
        delay of answers through /v1/acks (from the pull, or the `deferred` answer, to the ack)."""
        self._observe_app, self._observe_dlq, self._observe_ack = app, dlq, acks

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check the DLQ topics (DlqStartupError before `started`), run, and shut down in order.

        Shutdown order: stop intake → let in-flight attempts and DLQ writes finish within
        `shutdown.drain.timeout.ms` (skipped after a failure or `skip_drain`) → the adapter's final
        commits and close, shielded → cancel the workers → close the app client and the tracer.
        """
        config = self.config
        if not await self._wait_cluster_usable():
            task_status.started()  # stopped before the cluster could be used: nothing to undo
            return
        if config.errors.dlq.enabled:
            topics = sorted({t for s in config.source.topics if (t := config.dlq_topic_for(s))})
            await trio.to_thread.run_sync(self.dlq.prepare_topics_sync, topics)
            self._dlq_ready = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.dlq.run)
                await nursery.start(self.state.run)
                self.start_workers(nursery)
                if self.breaker is not None:
                    nursery.start_soon(self._breaker_timer)
                task_status.started()
                await self._stop.wait()
                self.state.stop_intake()
                if self._failure is None and not self._skip_drain:
                    await self._drain(config.shutdown_drain_timeout_ms / 1000)
                self.stopping = True
                self.state.wake()
                with trio.CancelScope(shield=True):
                    await self.state.finish()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.app.aclose()
                await trio.to_thread.run_sync(self.tracing.shutdown)

    async def _wait_cluster_usable(self) -> bool:
        """Until the cluster answers with the configured credentials and certificates: not ready,
        with the reason, retried with backoff (False when a stop was requested meanwhile). A wrong
        password or CA is fixed in a Secret, not by a restart: exiting here would only turn it into
        a crash loop that hides the cause."""
        delay_s = 1.0
        while True:
            reason = await trio.to_thread.run_sync(check_cluster_sync, self.config.kafka)
            self._cluster_error = reason
            if reason is None:
                return True
            log.error(
                "the Kafka cluster cannot be used: %s; not ready, retrying in %gs", reason, delay_s
            )
            with trio.move_on_after(delay_s):
                await self._stop.wait()
            if self._stop.is_set():
                return False
            delay_s = min(delay_s * 2, CLUSTER_RETRY_MAX_S)

    def broker_error(self) -> str | None:
        """Why the broker cannot be used (authentication, TLS, connection), when that is known."""
        return self._cluster_error or self.state.broker_error()

    async def _drain(self, deadline_s: float) -> None:
        """Stop handing out records; wait (up to the deadline) for in-flight attempts and DLQ writes."""
        self.draining = True
        self.state.intake_changed()
        if self._pull is not None:
            self._pull.release_waiters()  # pull mode: the waiting polls return (empty) at once
        with self._drain_cancel, trio.move_on_after(deadline_s):
            await self.state.wait_drained()

    async def run_source(self, poll: Callable[[], Awaitable[None]]) -> None:
        """Run an adapter's poll loop; a source that cannot continue stops the sidecar (exit 1)."""
        try:
            await poll()
        except SourceError as exc:
            self.fail(str(exc))

    def request_stop(self) -> None:
        self._stop.set()
        self.state.wake()

    def skip_drain(self) -> None:
        """Stop without waiting for in-flight work (a second signal)."""
        self._skip_drain = True
        self._drain_cancel.cancel()
        self.request_stop()

    def fail(self, reason: str) -> None:
        """Stop with exit 1: something that must not be retried or skipped went wrong."""
        if self._failure is None:
            self._failure = reason
            log.error("stopping: %s", reason)
        self.stopping = True
        self._stop.set()
        self.state.wake()

    def readiness(self) -> dict[str, bool]:
        state = self.state.readiness()
        if self._cluster_error is not None:
            state["broker_reachable"] = False
        checks = {
            **state,
            "app_reachable": self._app_reachable,
            "dlq_writable": self._dlq_ready and self._failure is None,
        }
        if self._pull is not None:
            del checks["app_reachable"]  # pull mode: nothing connects to the app
        if self.breaker is not None:
            checks["circuit_breaker_closed"] = self.breaker.state is BreakerState.CLOSED
        return checks

    def stalled(self) -> str | None:
        """Why the sidecar cannot make progress and should be restarted (None: it can)."""
        return None if self.stopping else self.state.stalled()

    def in_flight_records(self) -> int:
        return len(self._live)

    def paused_partitions(self) -> set[PartitionKey]:
        return self.state.paused()

    def lag(self) -> dict[PartitionKey, int]:
        return self.state.lag()

    def commit_metadata_bytes(self) -> dict[PartitionKey, int]:
        return self.state.commit_metadata_bytes()

    def status(self) -> dict[str, Any]:
        return {
            "group": self.config.group_id,
            "engine": self.state.kind,
            "app_reachable": self._app_reachable,
            "draining": self.draining,
            "failure": self._failure,
            "uptime_s": round(time.time() - self.started_at, 3),
            "in_flight": self.in_flight_records(),
            "paused_partitions": [f"{t}[{p}]" for t, p in sorted(self.state.paused())],
            "partitions": self.state.partitions(),
            **self.state.status_fields(),
            **self._pull_status(),
            "circuit_breaker": self.breaker_status(),
            "counters": self.counters.snapshot(),
        }

    # ------------------------------------------------------------------------- deliveries

    def issue(
        self, tracked: Tracked, delivery_count: int, ref: Any, *, lock_deadline: float | None = None
    ) -> Delivery:
        """A new live attempt under a fresh random id (not sent yet: see `send`); `lock_deadline`
        (trio time) is when the adapter's lock expires, for the polls of pull mode.

        With the breaker half-open, the first one issued is its probe.
        """
        delivery = self._live.issue(
            lambda i: Delivery(i, tracked, delivery_count, ref, lock_deadline=lock_deadline)
        )
        if self.breaker is not None and self.breaker.room() == 1:
            self.breaker.probe_sent(_now_ms())
            self._probe = delivery
        return delivery

    def send(self, delivery: Delivery) -> None:
        """Hand a delivery to the workers: it leaves in the next request (batch mode: see
        :class:`BatchAssembler` for when); pull mode: to the polls (:class:`PullQueue`)."""
        if self._pull is not None:
            self._pull.put(delivery)
            return
        self.sending += 1
        self._batches.add(delivery)

    def retire(self, delivery: Delivery) -> None:
        """The attempt is over (expired, fenced, not sent): its id answers `expired` from now on."""
        self._live.retire(delivery.id, delivery)
        if delivery is self._probe:
            self._probe_ended(delivery, None)

    def lock_expired(self, topic: str, delivery: Delivery | None, outcome: str) -> None:
        """No answer in time (`lock_expired`), or none before the sidecar stopped (`abandoned`)."""
        if delivery is not None:
            self.retire(delivery)
        self.counters.outcome(topic, outcome)

    def ack(self, items: Sequence[AckItem]) -> list[tuple[str, str]]:
        """`POST /v1/acks`: apply each answer; per id ok / unknown / expired."""
        return [(item.delivery_id, self.answer(item.delivery_id, item)) for item in items]

    def answer(self, delivery_id: str, answer: Answer | AckItem) -> AckResult:
        """Apply an app answer; 'ok', 'unknown' or 'expired' (the /v1/acks result words).

        An id that is not live is `expired` when it has the shape of our ids (answered already,
        lock expired, fenced by a rebalance, or issued before a restart) and `unknown` otherwise:
        the answer says nothing about which, nor about any other id.
        """
        delivery = self._live.get(delivery_id)
        if delivery is None:
            self.counters.expired_answers += 1
            return self._live.not_live_answer(delivery_id)
        return self._apply(delivery, answer)

    def _apply(self, delivery: Delivery, answer: Answer | AckItem) -> AckResult:
        """`answer` for a delivery that is live (the caller checked)."""
        if isinstance(answer, Answer) and answer.ack == "deferred":
            delivery.handed_at = time.perf_counter()
            return "ok"  # the app answers later through /v1/acks, before the lock expires
        ack = ACK_BY_WORD[answer.ack]
        result = self.state.answered(delivery, ack, answer)
        if result != "ok":
            self.retire(delivery)
            self.counters.expired_answers += 1
            return result
        if ack is not Ack.RENEW:
            if delivery.handed_at is not None:
                self._observe_ack(time.perf_counter() - delivery.handed_at)
            if self.breaker is not None:
                self._breaker_answer(delivery, ack)
            self.retire(delivery)
            self.counters.outcome(delivery.topic, answer.ack)
            if ack is Ack.REJECT:
                delivery.tracked.custom = custom_dead_letter(answer)
        self.state.wake()
        return "ok"

    # ------------------------------------------------------------------------- workers

    def start_workers(self, nursery: trio.Nursery) -> None:
        """The `app.max.in.flight` workers and the batch linger timer, in `nursery` (pull mode:
        none, the app's polls take the deliveries)."""
        if self._pull is not None:
            return
        for _ in range(self.config.app.max_in_flight):
            nursery.start_soon(self._worker)
        if self._batches.needs_timer:
            nursery.start_soon(self._batches.run_timer)

    async def _worker(self) -> None:
        timeout_s = self.config.app.timeout_ms / 1000
        batch = self.config.app.mode == AppMode.BATCH
        while True:
            items = await self._work_recv.receive()
            try:
                await self._deliver(items, timeout_s, batch)
            finally:
                self.sending -= len(items)
                self._batches.worker_free()
                self.state.wake()

    async def _deliver(self, items: list[Delivery], timeout_s: float, batch: bool) -> None:
        """Send the live ones (one request, or one batch request) and apply the answers.

        Not reachable is not an attempt: the adapter decides whether they go again now (share:
        once the app is back, within the batch's lock) or back to their ledger (consumer).
        """
        tracing = self.tracing
        while live := [d for d in items if self._live.get(d.id) is d]:
            traced = [attempt_view(tracing, d.tracked, d.delivery_count, d.id) for d in live]
            for d in live:
                d.sent = True
            started = time.perf_counter()
            try:
                if batch:
                    answers = await self.app.deliver_batch([v for v, _ in traced], timeout_s)
                else:
                    single = await self.app.deliver(traced[0][0], timeout_s)
            except AppNotReachable as exc:
                for d, (_view, actx) in zip(live, traced, strict=True):
                    end_attempt_span(actx, d.tracked, None)
                self.counters.not_attempted += len(live)
                self._app_unreachable(str(exc))
                if await self.state.not_reached(live):
                    continue
                return
            except BaseException:
                self.counters.attempts += len(live)
                for _view, actx in traced:
                    abandon_attempt_span(actx)
                raise
            self.counters.attempts += len(live)
            self._observe_app(time.perf_counter() - started)
            if not batch:
                answers = {live[0].id: single}
            for d, (_view, actx) in zip(live, traced, strict=True):
                answer = answers.get(d.id) or _MISSING_FROM_BATCH
                if actx is not None:
                    end_attempt_span(actx, d.tracked, answer)
                if self._live.get(d.id) is d:  # not answered through /v1/acks meanwhile
                    self._apply(d, answer)
                else:
                    self.counters.expired_answers += 1
            return

    # ------------------------------------------------------------------------- pull mode

    def send_room(self) -> int:
        """How many more deliveries may be handed over now: free worker capacity (push mode), or
        what the waiting polls still take (pull mode: records are acquired only for a poll)."""
        if self._pull is not None:
            return self._pull.demand()
        return self.send_capacity - self.sending

    async def wait_intake_open(self, deadline: float) -> bool:
        """Wait (until the trio time `deadline`) for intake to make sense: the app reachable
        (push mode), or a poll waiting (pull mode); whether it does."""
        if self._pull is None:
            return await self.wait_app_reachable(deadline)
        with trio.move_on_at(deadline):
            await self._pull.wait_demand()
        return self._pull.demand() > 0

    async def pull(self, max_records: int, wait_s: float) -> list[PulledRecord]:
        """`GET /v1/records`: up to `max_records` deliveries, waiting up to `wait_s` for one.

        The attempt span ends here, as a deferred answer does in push mode: the app answers
        through `POST /v1/acks`. A poll cancelled while it waits (its client closed the
        connection: the API watches it) hands out nothing and gives back what it had. A delivery
        handed out whose response then cannot reach the client is not lost: its lock expires and
        it is delivered again, counted, as a push request that failed after sending.
        """
        pull = self._pull
        if pull is None:
            raise NotPullMode(
                f"app.mode is {self.config.app.mode}: the sidecar pushes records to the app; "
                "GET /v1/records needs app.mode: pull"
            )
        if self.draining or self.stopping:
            return []
        taken = await pull.take(
            max_records, wait_s, lambda d: self._live.get(d.id) is d, self.state.wake
        )
        now = trio.current_time()
        handed_at = time.perf_counter()
        lock_s = self.config.delivery.lock_duration_ms / 1000
        out = []
        for d in taken:
            d.handed_at = handed_at
            view, actx = attempt_view(self.tracing, d.tracked, d.delivery_count, d.id)
            end_attempt_span(actx, d.tracked, _PULLED)
            deadline = d.lock_deadline if d.lock_deadline is not None else now + lock_s
            out.append(PulledRecord(view, max(0.0, deadline - now)))
        self.counters.attempts += len(out)
        return out

    def _pull_status(self) -> dict[str, Any]:
        pull = self._pull
        if pull is None:
            return {}
        return {"pull": {"waiting_polls": pull.waiting(), "queued": pull.queued()}}

    # ------------------------------------------------------------------------- app reachability

    def _app_unreachable(self, reason: str) -> None:
        if not self._app_reachable:
            return
        log.warning("the app is not reachable (%s): pausing intake until it is back", reason)
        self._app_reachable = False
        self.app_down_since = time.monotonic()
        self._app_back = trio.Event()
        self.state.intake_changed()
        if self._nursery is not None:
            self._nursery.start_soon(self._probe_app)

    async def wait_app_reachable(self, deadline: float) -> bool:
        """Wait (until the trio time `deadline`) for the app to be reachable; whether it is."""
        if self._app_reachable:
            return True
        with trio.move_on_at(deadline):
            await self._app_back.wait()
        return self._app_reachable

    async def _probe_app(self) -> None:
        app = self.config.app
        delay_s = app.connect_backoff_initial_ms / 1000
        while not self.stopping:
            await trio.sleep(delay_s)
            try:
                await _probe(self.app.target)
            except (OSError, trio.TooSlowError):
                delay_s = min(delay_s * 2, app.connect_backoff_max_ms / 1000)
                continue
            log.info("the app is reachable again: resuming intake")
            self._app_reachable = True
            self.app_down_since = None
            self._app_back.set()
            self.state.intake_changed()
            return

    # ------------------------------------------------------------------------- the DLQ step

    async def dead_letter(
        self,
        tracked: Tracked,
        delivery_count: int,
        reason: ArchiveReason,
        error: ErrorInfo | None,
        *,
        consequence: str,
        write: DlqWrite,
        may_hold: bool = True,
    ) -> ArchiveOutcome:
        """Archive one record: stop (errors.tolerance: none), skip (no DLQ), or write its DLQ record.

        The outcome says whether the record is done (`ArchiveOutcome.done`); a write that fails for
        good stops the sidecar. `consequence` says what stopping leaves the record as. While the
        circuit breaker is not closed the record is held (`ArchiveOutcome.HELD`), unless the
        caller cannot keep it (`may_hold` False: the share engine on the broker's last delivery).
        """
        config = self.config
        plan = dead_letter(
            tracked,
            delivery_count,
            reason,
            error,
            group=config.group_id,
            dlq_topic=config.dlq_topic_for(tracked.record.topic),
            tolerate=config.errors.tolerance != ErrorsTolerance.NONE,
            consequence=consequence,
        )
        if plan.stop is not None:
            self.fail(plan.stop)
            return ArchiveOutcome.STOPPED
        if self.breaker is not None and may_hold and not self._breaker_admits():
            return ArchiveOutcome.HELD
        self._log_archived(tracked, delivery_count, plan)
        if plan.failed is None or plan.dlq_topic is None:
            self.counters.bump(self.counters.archived, reason.label)
            return ArchiveOutcome.NO_DLQ
        span, failed = self._start_dlq_span(tracked, plan, plan.failed, plan.dlq_topic)
        started = time.perf_counter()
        try:
            written = await write(failed, plan.dlq_topic)
        except DlqFatalError as exc:
            self.counters.dlq_failed += 1
            if span is not None:
                span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
                span.add_event(
                    "exception",
                    {"exception.type": DLQ_WRITE_FAILED, "exception.message": str(exc)},
                )
                span.end()
            self.fail(str(exc))
            return ArchiveOutcome.FAILED
        except BaseException:
            if span is not None:
                span.end()
            raise
        if not written:
            if span is not None:
                span.end()
            return ArchiveOutcome.HANDED_OVER
        self._observe_dlq(time.perf_counter() - started)
        if span is not None:
            span.end()
        self.counters.dlq_written += 1
        self.counters.bump(self.counters.archived, reason.label)
        return ArchiveOutcome.WRITTEN

    def _start_dlq_span(
        self, tracked: Tracked, plan: DeadLetterPlan, failed: FailedRecord, dlq_topic: str
    ) -> tuple[trace.Span | None, FailedRecord]:
        """The DLQ write's span (linked to the last attempt's); the record carries its context."""
        if not self.tracing.enabled:
            return None, failed
        rec = tracked.record
        last = tracked.last_span
        span, trace_headers = self.tracing.start_dlq_write(
            source_topic=rec.topic,
            partition=rec.partition,
            offset=rec.offset,
            dlq_topic=dlq_topic,
            reason=plan.reason.label,
            traceparent=rec.traceparent,
            tracestate=rec.tracestate,
            links=[trace.Link(last)] if last is not None else [],
        )
        # The DLQ record carries the write's context (overriding a copied traceparent).
        extra = (*failed.extra_headers, *trace_headers)
        return span, dataclasses.replace(failed, extra_headers=extra)

    def _log_archived(self, tracked: Tracked, delivery_count: int, plan: DeadLetterPlan) -> None:
        errors = self.config.errors
        if not errors.log_enable:
            return
        fields = archived_log_fields(
            tracked, delivery_count, plan, include_messages=errors.log_include_messages
        )
        last = tracked.last_span
        if last is not None and last.is_valid:
            fields["trace_id"] = f"{last.trace_id:032x}"
            fields["span_id"] = f"{last.span_id:016x}"
        log.error("record archived", extra={"fields": fields})

    # ------------------------------------------------------------------------- the circuit breaker

    def _init_breaker(self, config: Config) -> None:
        """`errors.deadletterqueue.circuit.breaker.*` (see sidecar.core.breaker)."""
        dlq = config.errors.dlq
        self.breaker: CircuitBreaker | None = None
        if dlq.circuit_breaker_enable:
            policy = BreakerPolicy(
                ratio=dlq.circuit_breaker_ratio,
                window_ms=dlq.circuit_breaker_window_ms,
                min_records=dlq.circuit_breaker_min_records,
                cooldown_ms=dlq.circuit_breaker_cooldown_ms,
            )
            self.breaker = CircuitBreaker(policy, 0)  # may be built before trio runs
        self._breaker_changed = trio.Event()  # the timer re-reads the breaker's deadline
        self._breaker_moved = trio.Event()  # set (and replaced) whenever `breaker_room` may change
        self._breaker_since_wall = time.time()  # when it entered its state (wall clock)
        self.breaker_held = 0  # dead-letters held (counted once per hold)

    async def wait_breaker_room(self, deadline: float) -> bool:
        """Wait (until the trio time `deadline`) for the breaker to let a record out; whether it
        does (at once when it is closed or disabled)."""
        with trio.move_on_at(deadline):
            while self.breaker_room() == 0:
                await self._breaker_moved.wait()
        return self.breaker_room() != 0

    def breaker_room(self) -> int | None:
        """How many more records may go to the app now: None (no limit), 1 (a probe) or 0."""
        return None if self.breaker is None else self.breaker.room()

    @property
    def breaker_open(self) -> bool:
        """Open (not half-open): intake stops."""
        return self.breaker is not None and self.breaker.state is BreakerState.OPEN

    def _breaker_admits(self) -> bool:
        """A record is on its way to the DLQ: whether to write it (False: hold it)."""
        assert self.breaker is not None
        verdict = self.breaker.dead_letter(_now_ms())
        if verdict.transition is not None:
            self._breaker_transition(verdict.transition)
        if not verdict.write:
            self.breaker_held += 1
        return verdict.write

    def _breaker_answer(self, delivery: Delivery, ack: Ack) -> None:
        """An answer that ends an attempt: the probe's verdict, or an accepted record counted."""
        assert self.breaker is not None
        if delivery is self._probe:
            self._probe_ended(delivery, ack)
        elif ack is Ack.ACCEPT:
            self.breaker.succeeded(_now_ms())

    def _probe_ended(self, delivery: Delivery, ack: Ack | None) -> None:
        """The probe's attempt is over: accepted closes, on its way to the DLQ re-opens, else void."""
        assert self.breaker is not None
        self._probe = None
        now = _now_ms()
        if ack is None:
            self.breaker.probe_void(now)
            self._room_changed()
            self.state.wake()
            return
        verdict = decide(ack, delivery.delivery_count, self.config.delivery.delivery_count_limit)
        if isinstance(verdict, Accept):
            self._breaker_transition(self.breaker.probe_succeeded(now))
        elif isinstance(verdict, DeadLetter):
            self._breaker_transition(self.breaker.probe_failed(now))
        else:
            self.breaker.probe_void(now)
            self._room_changed()
            self.state.wake()

    def _room_changed(self) -> None:
        self._breaker_moved.set()
        self._breaker_moved = trio.Event()

    def close_breaker(self, reason: str) -> bool:
        """Close the breaker (the control API); False when it was closed already (or disabled)."""
        if self.breaker is None:
            return False
        transition = self.breaker.close(_now_ms(), reason)
        if transition is None:
            return False
        self._probe = None
        self._breaker_transition(transition)
        return True

    def _breaker_transition(self, t: Transition) -> None:
        """Log it (one line when it trips, one when it closes), and steer intake and held records."""
        assert self.breaker is not None
        self._probe = None  # any state change ends the probe: its answer no longer counts
        self._breaker_since_wall = time.time()
        self._breaker_changed.set()
        self._room_changed()
        if t.before is BreakerState.CLOSED:
            log.warning(
                "DLQ circuit breaker open: %s; dead-lettering and intake stop, held records stay "
                "uncommitted; a probe record in %d ms",
                t.reason,
                self.breaker.policy.cooldown_ms,
            )
        elif t.after is BreakerState.CLOSED:
            log.warning(
                "DLQ circuit breaker closed (%s): held records go to the app again", t.reason
            )
        elif t.after is BreakerState.HALF_OPEN:
            log.info("DLQ circuit breaker %s", t.reason)
        else:
            log.info("DLQ circuit breaker still open: %s", t.reason)
        if t.after is not BreakerState.OPEN:
            self.state.release_held()
        self.state.intake_changed()
        self.state.wake()

    async def _breaker_timer(self) -> None:
        """Half-open once the cool-down is over (the breaker says when)."""
        assert self.breaker is not None
        while True:
            self._breaker_changed = trio.Event()
            deadline = self.breaker.next_deadline_ms()
            if deadline is None:
                await self._breaker_changed.wait()
                continue
            with trio.move_on_after(max(0.0, (deadline - _now_ms()) / 1000)):
                await self._breaker_changed.wait()
            transition = self.breaker.tick(_now_ms())
            if transition is not None:
                self._breaker_transition(transition)

    def breaker_status(self) -> dict[str, Any] | None:
        """The breaker and its window for `/v1/status` and the API (None: disabled)."""
        if self.breaker is None:
            return None
        now = _now_ms()
        st = self.breaker.status(now)
        policy = self.breaker.policy
        ratio = st.observed_ratio
        return {
            "state": st.state.value,
            "since": _iso(self._breaker_since_wall),
            "reason": st.reason,
            "finished": st.finished,
            "dead_lettered": st.dead_lettered,
            "ratio": None if ratio is None else round(ratio, 4),
            "trips": st.trips,
            "held": self.breaker_held,
            "probe_out": st.probe_out,
            "half_open_in_ms": None
            if st.half_open_at_ms is None
            else max(0, st.half_open_at_ms - now),
            "policy": {
                "ratio": policy.ratio,
                "window_ms": policy.window_ms,
                "min_records": policy.min_records,
                "cooldown_ms": policy.cooldown_ms,
            },
        }


def _now_ms() -> int:
    # The breaker's clock: trio's (monotonic; the cool-down timer sleeps on it too).
    return int(trio.current_time() * 1000)


def _iso(wall_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall_s))


# A pulled record's attempt span ends when it is handed out: the answer comes through /v1/acks.
_PULLED = Answer("deferred")

# A batch answer that leaves a record out releases it (an attempt, retried).
_MISSING_FROM_BATCH = Answer("release", reason="missing from the batch answer")


async def _probe(target: AppTarget) -> None:
    """Open and close one connection to the app: OSError (or TooSlowError) when nothing answers."""
    stream: trio.abc.Stream
    with trio.fail_after(PROBE_TIMEOUT_S):
        if target.unix_path is not None:
            stream = await trio.open_unix_socket(target.unix_path)
        else:
            stream = await trio.open_tcp_stream(target.host, target.port)
    await stream.aclose()


def _ignore(_seconds: float) -> None:
    return None


__all__ = [
    "AckResult",
    "BatchAssembler",
    "Counters",
    "Delivery",
    "DeliveryState",
    "Engine",
    "NotPullMode",
    "Pipeline",
    "PullQueue",
    "PulledRecord",
    "dlq_writer_for",
]
