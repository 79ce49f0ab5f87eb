"""The delivery pipeline both engines run.

Owns `Pipeline`, the one `Engine`: the app requests and answers, the app prober, status and the
shutdown order, around one `StateAdapter` (where the engines differ: `sidecar.engines.consumer`,
`sidecar.engines.share`). Its parts live beside it (outlet, pull, batching, breaker_gate, dlq_step,
tier_step, decoding, app_route); the record's path through them is told in docs/architecture.md.

Must not import either engine, the ledger, or confluent-kafka.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from sidecar.config import AppMode, Config
from sidecar.core.breaker import BreakerState, Transition
from sidecar.core.outcome import ACK_BY_WORD, Ack
from sidecar.core.record import LiveIds, custom_dead_letter
from sidecar.core.wire import AckItem, Answer, RecordView
from sidecar.engines.app_route import AppRoute
from sidecar.engines.attempts import (
    AppClientFactory,
    abandon_attempt_span,
    app_client_for,
    attempt_view,
    end_attempt_span,
)
from sidecar.engines.batching import BatchAssembler
from sidecar.engines.breaker_gate import BreakerGate, breaker_for
from sidecar.engines.decoding import decoding_for
from sidecar.engines.dlq_step import DlqStep, dlq_topics, dlq_writer_for
from sidecar.engines.interfaces import (
    AckResult,
    AdapterFactory,
    Counters,
    Delivery,
    Engine,
    EngineParts,
    Figures,
    Health,
    PartitionKey,
    PulledRecord,
    Settled,
    StateAdapter,
)
from sidecar.engines.outlet import PipelineFlags, PipelineOutlet, Reachability
from sidecar.engines.pull import NotPullMode, PullQueue
from sidecar.engines.source_topics import SourceTopics
from sidecar.engines.tier_step import TierStep, tier_topics
from sidecar.http.appclient import AppClient, AppNotReachable, AppRouteMissing, AppTarget
from sidecar.http.exchanges import Exchange
from sidecar.kafka.consumer_config import check_cluster_sync, missing_topics_sync
from sidecar.kafka.dlq import DlqWriter
from sidecar.kafka.log_start import read_log_starts_sync
from sidecar.telemetry.tracing import AttemptContext, Tracing

# Between two start-up checks of a cluster that cannot be used (authentication, TLS, connection).
CLUSTER_RETRY_MAX_S = 10.0
# How long one start-up check of the cluster waits for an answer (a stop ends it sooner).
CLUSTER_CHECK_S = 10.0

log = logging.getLogger("sidecar.engine")  # the engine's messages, whichever adapter runs

# The app prober's connection attempt.
PROBE_TIMEOUT_S = 2.0


class Pipeline:
    """App requests, app prober, answers, DLQ step, status: one per sidecar, around one adapter.

    It builds its parts in order (tracing, counters, the app client, the DLQ writer, the DLQ circuit
    breaker's gate, the DLQ step, the outlet) and then the adapter, giving it `EngineParts`; it talks to
    the adapter only through `StateAdapter` (and reads its `StateView`), and the adapter to it only
    through the `Outlet`. Nothing is set on a part after it is built. The daemon starts it with
    ``await nursery.start(engine.run)`` and steers it only through `Engine` (``stop``). Every call runs in the trio thread and changes state between two awaits, so each
    change is atomic; who may change what is docs/architecture.md's "Which task owns what".

    Errors: a failure that cannot be retried ends in `fail` (the sidecar stops with exit 1); the
    per-record dispatch (one DLQ write, one batch of a transaction) is the only place that catches broadly.
    """

    def __init__(
        self,
        config: Config,
        adapter: AdapterFactory,
        *,
        tracing: Tracing | None = None,
        random_bytes: Callable[[int], bytes] = secrets.token_bytes,
        app_client: AppClientFactory = app_client_for,
    ) -> None:
        self.config = config
        self.tracing = tracing or Tracing(
            config.tracing.service_name, config.group_id, config.tracing.exporter.value
        )
        self.counters = Counters()
        self.started_at = time.time()
        self._flags = PipelineFlags(
            dlq_ready=not (config.errors.dlq.enabled or config.errors.tiers.enabled)
        )
        self._reachability = Reachability()
        self._route = AppRoute[list[Delivery[Any]]](
            self._reachability,
            self._intake_changed,
            backoff_initial_s=config.app.connect_backoff_initial_ms / 1000,
            backoff_max_s=config.app.connect_backoff_max_ms / 1000,
        )
        self._live: LiveIds[Delivery[Any]] = LiveIds(random_bytes)
        app = config.app
        batch = app.mode == AppMode.BATCH
        self._batch = batch
        self._timeout_s = app.timeout_ms / 1000
        # App requests: the assembler starts one when fewer than `app.max.in.flight` are open.
        self._batches = BatchAssembler[Delivery[Any]](
            app.batch_max_records if batch else 1,
            app.batch_linger_ms / 1000,
            app.max_in_flight,
            self._dispatch,
        )
        self._requests: set[_Request] = set()  # started, not answered
        self._answering = False  # inside one wake-up of the app client's reader
        self._wake_held = False  # the adapter was woken during it: one wake at its end
        self._answers_closed = False  # shutting down: answers arriving now are dropped
        self._pull: PullQueue | None = PullQueue() if app.mode == AppMode.PULL else None
        self._stop = trio.Event()
        self._stop_sync = threading.Event()
        # Why the cluster cannot be used at start-up (authentication, TLS, connection), while it cannot.
        self._cluster_error: str | None = None
        self._sources = SourceTopics(config.kafka, config.source.topics, missing_topics_sync)
        self._drain_cancel = trio.CancelScope()
        self._skip_drain = False
        self._nursery: trio.Nursery | None = None
        self._observe_app: Callable[[float], None] = _ignore
        self._observe_ack: Callable[[float], None] = _ignore
        # The parts, each given its collaborators (the order: `Pipeline`'s docstring).
        self.app: AppClient = app_client(
            config, after_round=self._round_end, on_error=self._answer_failed
        )
        self.dlq: DlqWriter = dlq_writer_for(config)
        circuit = breaker_for(config)
        # The DLQ circuit breaker's gate (None: disabled).
        self.breaker = None if circuit is None else BreakerGate(circuit, self._breaker_moved)
        self._dlq_step = DlqStep(config, self.tracing, self.counters, self.breaker, self.fail)
        # Records with schemas (schemas.decode): None unless a topic decodes.
        self._schemas = decoding_for(
            config,
            reject=lambda d, error: self._apply(d, Answer("reject", error=error)),
            intake_changed=lambda: self._state.intake_changed(),  # noqa: PLW0108 (built below)
            stopping=lambda: self._flags.stopping,
        )
        # What the adapter is given of the pipeline.
        self.outlet = PipelineOutlet(
            self._live,
            self.counters,
            self._flags,
            self._reachability,
            batches=self._batches,
            pull=self._pull,
            # Deliveries the open requests can carry at once (push mode).
            send_capacity=app.max_in_flight * (app.batch_max_records if batch else 1),
            gate=self.breaker,
            dlq_step=self._dlq_step,
            fail=self.fail,
            registry=None if self._schemas is None else self._schemas.registry,
        )
        self._state: StateAdapter = adapter(
            EngineParts(
                config,
                self.counters,
                self.dlq,
                self.outlet,
                TierStep(config, self.counters, self.fail),
            )
        )

    # ------------------------------------------------------------------------- the Engine face

    def observe_latencies(
        self,
        app: Callable[[float], None],
        dlq: Callable[[float], None],
        acks: Callable[[float], None],
    ) -> None:
        """Latency observers (seconds), Prometheus histograms: app requests, DLQ writes, and the
        delay of answers through /v1/acks (from the pull, or the `deferred` answer, to the ack)."""
        self._observe_app, self._observe_ack = app, acks
        self._dlq_step.observe_latency(dlq)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Check the DLQ topics (DlqStartupError before `started`), run, and shut down in order.

        Shutdown order: stop intake → let in-flight attempts and DLQ writes finish within
        `shutdown.drain.timeout.ms` (skipped after a failure or `stop(drain=False)`) → the adapter's final
        commits and close, shielded → drop the open requests, cancel the tasks → close the app
        client and the tracer.
        """
        config = self.config
        flags = self._flags
        if not await self._wait_cluster_usable():
            task_status.started()  # stopped before the cluster could be used: nothing to undo
            return
        await self._sources.check_now()
        if config.errors.dlq.enabled or config.errors.tiers.enabled:
            # The default DLQs, every routed topic and the tier topics, created or checked alike;
            # none for a source topic that does not exist (the writer prepares its topic at its
            # first record, should it appear).
            existing = self._sources.existing()
            topics = dlq_topics(config, existing) + tier_topics(config, existing)
            await trio.to_thread.run_sync(self.dlq.prepare_topics_sync, topics)
            flags.dlq_ready = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await nursery.start(self.dlq.run)
                await nursery.start(self._state.run)
                self.start_requests(nursery)
                if self.breaker is not None:
                    nursery.start_soon(self.breaker.run_timer)
                nursery.start_soon(self._sources.watch)
                nursery.start_soon(self._dlq_step.summary.run)
                nursery.start_soon(
                    self._dlq_step.payload_watch.run, self.dlq.admin, read_log_starts_sync
                )
                task_status.started()
                await self._stop.wait()
                flags.intake_stopped = True
                self._state.intake_changed()
                if flags.failure is None and not self._skip_drain:
                    await self._drain(config.shutdown_drain_timeout_ms / 1000)
                flags.stopping = True
                self._state.wake()
                with trio.CancelScope(shield=True):
                    await self._state.finish()
                self._close_requests()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.app.aclose()
                await trio.to_thread.run_sync(self.tracing.shutdown)
                if self._schemas is not None:
                    self._schemas.close()
                self._dlq_step.close()

    async def _wait_cluster_usable(self) -> bool:
        """Until the cluster answers with the configured credentials and certificates: not ready,
        with the reason, retried with backoff (False when a stop was requested meanwhile). A wrong
        password or CA is fixed in a Secret, not by a restart: exiting here would only turn it into
        a crash loop that hides the cause."""
        delay_s = 1.0
        while True:
            reason = await trio.to_thread.run_sync(
                check_cluster_sync, self.config.kafka, CLUSTER_CHECK_S, self._stop_sync
            )
            if self._stop.is_set():
                return False  # a stop during the check: say nothing more, stop
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

    async def _drain(self, deadline_s: float) -> None:
        """Stop handing out records; wait (up to the deadline) for in-flight attempts and DLQ writes."""
        self._flags.draining = True
        self._state.intake_changed()
        if self._pull is not None:
            self._pull.release_waiters()  # pull mode: the waiting polls return (empty) at once
        with self._drain_cancel, trio.move_on_after(deadline_s):
            await self._state.wait_drained()

    def stop(self, *, drain: bool = True) -> None:
        """Stop; without `drain` (a second signal), without waiting for in-flight work."""
        if not drain:
            self._skip_drain = True
            self._drain_cancel.cancel()
        self._stop.set()
        self._stop_sync.set()  # the start-up check's worker thread sees it too
        if self._pull is not None:
            # The waiting polls return (empty) now, whether or not the engine got to run: a stop
            # during start-up never reaches the drain that releases them too.
            self._pull.release_waiters()
        self._wake()

    def fail(self, reason: str) -> None:
        """Stop with exit 1: something that must not be retried or skipped went wrong."""
        flags = self._flags
        if flags.failure is None:
            flags.failure = reason
            log.error("stopping: %s", reason)
        flags.stopping = True
        self._stop.set()
        self._wake()

    def _wake(self) -> None:
        """Wake the adapter; within a row of answers, once at its end (`_round_end`)."""
        if self._answering:
            self._wake_held = True
        else:
            self._state.wake()

    def health(self) -> Health:
        view = self._state.view
        flags = self._flags
        checks = view.readiness()
        if self._cluster_error is not None:
            checks["broker_reachable"] = False
        checks["app_reachable"] = self._app_reachable()
        checks["app_route_found"] = not self._route.missing
        checks["dlq_writable"] = flags.dlq_ready and flags.failure is None
        checks["source_topics_exist"] = not self._sources.missing
        if self._pull is not None:
            del checks["app_reachable"]  # pull mode: nothing connects to the app
            del checks["app_route_found"]
        if self.breaker is not None:
            checks["circuit_breaker_closed"] = self.breaker.closed
        if self._schemas is not None:
            checks["schema_registry_reachable"] = self._schemas.registry.reachable
        return Health(
            flags.failure,
            None if flags.stopping else view.stalled(),
            checks,
            self._cluster_error or view.broker_error(),
            self._sources.reason(),
            self._route.reason(),
        )

    def _app_reachable(self) -> bool:
        """The app accepts connections (one that answers route-missing does)."""
        return self._reachability.reachable or self._route.missing

    def figures(self) -> Figures:
        view = self._state.view
        return Figures(
            self.counters,
            len(self._live),
            self._app_reachable(),
            view.paused(),
            view.lag(),
            view.commit_metadata_bytes(),
        )

    def status(self) -> dict[str, Any]:
        view = self._state.view
        return {
            "group": self.config.group_id,
            "engine": self.config.engine.value,
            "app_reachable": self._app_reachable(),
            "app_route_missing": self._route.reason(),
            "draining": self._flags.draining,
            "failure": self._flags.failure,
            "uptime_s": round(time.time() - self.started_at, 3),
            "in_flight": len(self._live),
            "paused_partitions": [f"{t}[{p}]" for t, p in sorted(view.paused())],
            "missing_topics": list(self._sources.missing),
            "partitions": view.partitions(),
            **view.status_fields(),
            **self._pull_status(),
            "circuit_breaker": None if self.breaker is None else self.breaker.status(),
            "dlq_routes": self._dlq_step.route_status(),
            **({} if self._schemas is None else {"schemas": self._schemas.status()}),
            "counters": self.counters.snapshot(),
        }

    # ------------------------------------------------------------------------- answers

    def answer(self, items: Sequence[AckItem]) -> list[tuple[str, str]]:
        """`POST /v1/acks`: apply each answer; per id ok / already / expired / unknown. The
        adapter re-evaluates once, after the last."""
        out: list[tuple[str, str]] = [
            (item.delivery_id, self._answer_one(item.delivery_id, item)) for item in items
        ]
        self._wake()
        return out

    def _answer_one(self, delivery_id: str, answer: Answer | AckItem) -> AckResult:
        """Apply an app answer; 'ok', 'already', 'expired' or 'unknown' (the /v1/acks result words).

        An id that is not live is `already` when it was answered (one of the last answered ids),
        `expired` when it has the shape of our ids (lock expired, fenced by a rebalance, or issued
        before a restart) and `unknown` otherwise: the answer says nothing about any other id.
        """
        delivery = self._live.get(delivery_id)
        if delivery is None:
            self.counters.expired_answers += 1
            return self._live.not_live_answer(delivery_id)
        return self._apply(delivery, answer)

    def _apply(self, delivery: Delivery[Any], answer: Answer | AckItem) -> AckResult:
        """`answer` for a delivery that is live (the caller checked)."""
        if isinstance(answer, Answer) and answer.ack == "deferred":
            delivery.handed_at = time.perf_counter()
            return "ok"  # the app answers later through /v1/acks, before the lock expires
        ack = ACK_BY_WORD[answer.ack]
        settled = self._state.answered(delivery, ack, answer)  # the adapter decides
        if isinstance(settled, str):  # unknown, expired
            self.outlet.retire(delivery)
            self.counters.expired_answers += 1
            return settled
        if settled is not Settled.KEPT:
            if delivery.handed_at is not None:
                self._observe_ack(time.perf_counter() - delivery.handed_at)
            if self.breaker is not None:
                self.breaker.answered(delivery, settled)
            self.outlet.retire(delivery)
            self._live.answered(delivery.id)
            self.counters.outcome(delivery.tracked.record.topic, answer.ack)
            if ack is Ack.REJECT:
                delivery.tracked.custom = custom_dead_letter(answer)
        return "ok"  # the adapter re-evaluates at the end of the row of answers

    # ------------------------------------------------------------------------- app requests

    def start_requests(self, nursery: trio.Nursery) -> None:
        """Start the batch linger timer in `nursery` (pull mode: nothing, the app's polls take the
        deliveries).

        No task per request: a request starts in the task that hands its deliveries out (see
        `_dispatch`), and its answer is applied in the app client's reader task (`_answered`),
        many answers per wake-up, after which the adapter re-evaluates once (`_round_end`, the
        app client's `after_round`, given to it when it was built).
        """
        if self._pull is None and self._batches.needs_timer:
            nursery.start_soon(self._batches.run_timer)

    def _dispatch(self, items: list[Delivery[Any]]) -> None:
        """Start one request (single mode: one delivery; batch mode: a batch) for the live ones
        among `items`; its answer comes to `_answered`."""
        if len(items) == 1:  # single mode: no list comprehension (a frame of its own) a record
            first = items[0]
            live = items if self._live.get(first.id) is first else []
        else:
            live = [d for d in items if self._live.get(d.id) is d]
        if live and self._schemas is not None:
            # Decoded before the first attempt; an undecodable record is rejected (to the DLQ).
            live, missing = self._schemas.ready(live)
            if missing:
                assert self._nursery is not None
                self._nursery.start_soon(self._load_schemas, items, missing)
                return
        if not live:
            self._request_done(items)
            return
        if self._route.probing and not self._route.may_send(items):
            return  # parked, in its slot, until the route's probe is answered
        tracing = self.tracing
        if len(live) == 1:
            first = live[0]
            traced = [attempt_view(tracing, first.tracked, first.delivery_count, first.id)]
            first.sent = True
        else:
            traced = [attempt_view(tracing, d.tracked, d.delivery_count, d.id) for d in live]
            for d in live:
                d.sent = True
        request = _Request(items, live, traced)
        self._requests.add(request)
        answered = functools.partial(self._answered, request)
        if self._batch:
            request.exchange = self.app.start_batch(
                [v for v, _ in traced], self._timeout_s, answered
            )
        else:
            request.exchange = self.app.start_single(traced[0][0], self._timeout_s, answered)

    async def _load_schemas(self, items: list[Delivery[Any]], missing: set[int]) -> None:
        """Load the schemas a request's records need, then send it in its slot; with the
        registry down it is not an attempt (`_not_reached`), and intake pauses until it answers."""
        assert self._schemas is not None and self._nursery is not None
        if await self._schemas.load_or_probe(missing, self._nursery):
            self._dispatch(items)
        else:
            await self._not_reached(items)

    def _request_done(self, items: list[Delivery[Any]]) -> None:
        self.outlet.request_done(len(items))
        self._wake()

    def _answered(
        self, request: _Request, result: Answer | dict[str, Answer] | AppNotReachable
    ) -> None:
        """A request's answer (the app client's reader task): apply it to each delivery."""
        self._requests.discard(request)
        if self._answers_closed:
            return
        self._answering = True  # the adapter's wakes wait for the row's end (`_round_end`)
        live, traced = request.live, request.traced
        if isinstance(result, AppNotReachable):
            for d, (_view, actx) in zip(live, traced, strict=True):
                end_attempt_span(actx, d.tracked, None)
            self.counters.not_attempted += len(live)
            if isinstance(result, AppRouteMissing):
                self._route.lost(result, self._nursery)
            else:
                self._app_unreachable(str(result))
            assert self._nursery is not None
            for items in (request.items, *self._route.settled()):
                self._nursery.start_soon(self._not_reached, items)
            return
        route = self._route
        if route.url is not None:
            route.answered()  # the route is found again
        if (
            route.probing
        ):  # the probe was answered: the requests parked behind it go, in their slots
            assert self._nursery is not None
            for items in route.settled():
                self._nursery.start_soon(self._send_parked, items)
        self.counters.attempts += len(live)
        self._observe_app(time.perf_counter() - request.started)
        if isinstance(result, dict):
            answers = [result.get(d.id) or _MISSING_FROM_BATCH for d in live]
        else:  # single mode: the one delivery's
            answers = [result]
        for d, (_view, actx), answer in zip(live, traced, answers, strict=True):
            if actx is not None:
                end_attempt_span(actx, d.tracked, answer)
            if self._live.get(d.id) is d:  # not answered through /v1/acks meanwhile
                self._apply(d, answer)
            else:
                self.counters.expired_answers += 1
        self._request_done(request.items)

    def _round_end(self) -> None:
        """The app client's reader applied what one wake-up brought: the adapter re-evaluates,
        once, in this task, if any of the answers woke it."""
        self._answering = False
        if self._wake_held:
            self._wake_held = False
            self._state.wake(now=True)

    def _answer_failed(self, exc: BaseException) -> None:
        """A bug while applying an answer: the sidecar stops (exit 1), as a task's crash would."""
        log.error("applying an app answer failed", exc_info=exc)
        self._round_end()
        self.fail(f"internal error applying an app answer: {exc!r}")

    async def _not_reached(self, items: list[Delivery[Any]]) -> None:
        """Not reachable is not an attempt: the adapter decides whether they go again now (share:
        once the app is back, within the batch's lock) or back to their ledger (consumer)."""
        live = [d for d in items if self._live.get(d.id) is d]
        if live and await self._state.not_reached(live):
            self._dispatch(items)  # again, in the same request slot
            return
        self._request_done(items)

    async def _send_parked(self, items: list[Delivery[Any]]) -> None:
        self._dispatch(items)

    def _close_requests(self) -> None:
        """Shutdown: requests still open are dropped, counted as attempts, their spans abandoned."""
        self._answers_closed = True
        self._route.drop_parked()  # never sent
        for request in self._requests:
            self.counters.attempts += len(request.live)
            for _view, actx in request.traced:
                abandon_attempt_span(actx)
            if request.exchange is not None:
                self.app.pool.abandon(request.exchange)
        self._requests.clear()

    # ------------------------------------------------------------------------- pull mode

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
        if self._flags.draining or self._flags.stopping:
            return []
        taken = await pull.take(
            max_records, wait_s, lambda d: self._live.get(d.id) is d, self._wake
        )
        if taken and self._schemas is not None:
            assert self._nursery is not None
            taken = await self._schemas.ready_pulled(
                taken,
                lambda d: self._live.get(d.id) is d,
                self._nursery,
                self._state.not_reached,
                pull.put,
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

    def _intake_changed(self) -> None:
        self._state.intake_changed()

    def _app_unreachable(self, reason: str) -> None:
        if not self._reachability.lost():
            return
        log.warning("the app is not reachable (%s): pausing intake until it is back", reason)
        self._state.intake_changed()
        if self._nursery is not None:
            self._nursery.start_soon(self._probe_app)

    async def _probe_app(self) -> None:
        app = self.config.app
        delay_s = app.connect_backoff_initial_ms / 1000
        while not self._flags.stopping:
            await trio.sleep(delay_s)
            try:
                await _probe(self.app.target)
            except (OSError, trio.TooSlowError):
                delay_s = min(delay_s * 2, app.connect_backoff_max_ms / 1000)
                continue
            log.info("the app is reachable again: resuming intake")
            self._reachability.back()
            self._state.intake_changed()
            return

    # ------------------------------------------------------------------------- the circuit breaker

    def _breaker_moved(self, transition: Transition | None) -> None:
        """The gate moved (its `on_change`): a transition, or (None) only its room changed; the
        adapter hears what follows."""
        if transition is not None:
            self._state.intake_changed(held_may_go=transition.after is not BreakerState.OPEN)
        self._wake()


# A pulled record's attempt span ends when it is handed out: the answer comes through /v1/acks.
_PULLED = Answer("deferred")

# A batch answer that leaves a record out releases it (an attempt, retried).
_MISSING_FROM_BATCH = Answer("release", reason="missing from the batch answer")


@dataclass(slots=True, eq=False)
class _Request:
    """One app request in flight: its deliveries (the live ones sent, with their views and
    spans), when it started, and its exchange in the app client (set once it is started)."""

    items: list[Delivery[Any]]
    live: list[Delivery[Any]]
    traced: list[tuple[RecordView, AttemptContext | None]]
    started: float = field(default_factory=time.perf_counter)
    exchange: Exchange | None = None


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


# Names other modules import from here (defined beside the pipeline).
__all__ = [
    "AckResult",
    "BatchAssembler",
    "Counters",
    "Delivery",
    "DlqWriter",
    "Engine",
    "NotPullMode",
    "PartitionKey",
    "Pipeline",
    "PullQueue",
    "PulledRecord",
    "StateAdapter",
    "dlq_writer_for",
]
