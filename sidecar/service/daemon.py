"""`dlq-sidecar run`: start-up checks, the task tree, signals and the shutdown order.

Owns `run_sidecar` (the shutdown order, written once in its docstring): it starts the engine with
`nursery.start(engine.run)`, serves the local API beside it, and steers it only through
`stop()`.
"""

from __future__ import annotations

import functools
import gc
import logging
import signal
from collections.abc import Callable

import trio

from sidecar.config import Config, ListenAddress
from sidecar.config import Engine as EngineKind
from sidecar.core import compiled, core_build
from sidecar.engines.pipeline import Engine, Pipeline
from sidecar.http.server import serve_http
from sidecar.kafka.dlq import DlqStartupError
from sidecar.kafka.logsummary import flush_summary
from sidecar.service.api import (
    POLL_ANSWER_WAIT_S,
    LocalApi,
    fit_connections,
    listener_limits,
)
from sidecar.service.exits import ExitCollector, ExitRecord, fatal_reason
from sidecar.telemetry.tracing import Tracing

# Objects allocated (net) before a young-generation collection: the record path makes no cycles,
# so a collection finds nothing to free there and the default (700) ran one every few dozen records.
GC_YOUNG_THRESHOLD = 20_000

log = logging.getLogger("sidecar.daemon")

EXIT_OK = 0
EXIT_FAILURE = 1


async def _start_listeners(nursery: trio.Nursery, api: LocalApi, config: Config) -> None:
    """The control API (loopback or a Unix socket) and, when configured, the observability one."""
    observability = config.api.observability_address
    cap = fit_connections(config.api, 1 if observability is None else 2)
    control_limits = listener_limits(config.api, observability=False, max_connections=cap)
    where = await nursery.start(
        functools.partial(
            serve_http,
            api.control,
            config.api.address,
            limits=control_limits,
            stats=api.control_stats,
        )
    )
    shown = _shown(config.api.address, where)
    log.info(
        "control API listening on %s%s",
        shown,
        " (token required on /v1/*)" if config.api.token else "",
        extra={"fields": {"api": shown}},
    )
    if observability is None:
        return
    observability_limits = listener_limits(config.api, observability=True, max_connections=cap)
    where = await nursery.start(
        functools.partial(
            serve_http,
            api.observability,
            observability,
            limits=observability_limits,
            stats=api.observability_stats,
        )
    )
    shown = _shown(observability, where)
    log.info(
        "observability listener (healthz, readyz, metrics) on %s",
        shown,
        extra={"fields": {"observability": shown}},
    )


def _shown(address: ListenAddress, bound: int | str) -> str:
    """``host:port`` (``[v6]:port``) with the port bound, or ``unix:/path``, for the log."""
    if address[0] == "unix":
        return f"unix:{bound}"
    host = address[1]
    return f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"


def open_engine(
    config: Config, *, write_ahead: bool = False, tracing: Tracing | None = None
) -> Engine:
    """The engine `config.engine` names: the pipeline around that engine's delivery state."""
    if config.engine is EngineKind.SHARE:
        from sidecar.engines.tiered_share import share_adapter

        return Pipeline(config, share_adapter, tracing=tracing)
    from sidecar.engines.consumer.group import ConsumerGroupEngine

    return Pipeline(
        config, functools.partial(ConsumerGroupEngine, write_ahead=write_ahead), tracing=tracing
    )


async def run_sidecar(
    config: Config,
    *,
    write_ahead: bool = False,
    tracing: Tracing | None = None,
    on_engine: Callable[[Engine], None] | None = None,
    own_process: bool = False,
) -> int:
    """Run until SIGTERM/SIGINT or a fatal error; returns the exit code.

    `tracing` and `on_engine` let an in-process caller (tests) bring its own span processor and get
    hold of the engine (e.g. to call `stop()` instead of sending a signal). `own_process`:
    the process is the sidecar's alone (`dlq-sidecar run`), so its garbage collector is tuned for
    the record path once running (`_tune_gc`); a caller's process is left as it is.

    Shutdown order (SIGTERM/SIGINT): stop polling and pause intake → let in-flight attempts and DLQ writes finish
    within `shutdown.drain.timeout.ms` → commit every partition's state → close the consumer (its revoke callback
    commits once more and the group sees us leave) → flush the DLQ producer → exit 0. A second signal skips the
    drain; the commits that follow are still safe because a committed offset never passes a record that is not done.
    A fatal error (a DLQ write that cannot succeed, `errors.tolerance: none`) follows the same path without the
    drain and exits 1; with `metrics.exit.record.path` it is counted there first, for the next process's metrics
    (`sidecar.service.exits`).

    The engine (`sidecar.engines.pipeline.Engine`) runs that order itself: this module starts it with
    `nursery.start(engine.run)`, serves the local API beside it, and steers it only through `stop()`.
    """
    for note in config.deprecations:
        log.warning("configuration: %s", note)
    engine = open_engine(config, write_ahead=write_ahead, tracing=tracing)
    if on_engine is not None:
        on_engine(engine)

    exits = None
    if config.metrics.exit_record_path is not None:
        exits = ExitRecord.open(config.metrics.exit_record_path)
        exits.started()
    metrics = None
    if config.metrics.enable:
        from sidecar.service.metrics import Metrics

        metrics = Metrics(engine, config)
        if exits is not None:

            def lost_now() -> dict[str, int]:
                return dict(engine.counters.broker_archived)

            metrics.registry.register(ExitCollector(exits, config.source.topics, lost_now))
    api = LocalApi(
        engine,
        config,
        metrics.render if metrics else None,
        token=config.api.token,
        max_ack_items=config.api.max_ack_items,
    )
    if metrics is not None:
        metrics.registry.register(api.collector())

    async with trio.open_nursery() as nursery:
        # The listeners first: a listen address that cannot be bound stops us before we consume,
        # and readiness can say why a cluster cannot be used yet (see `Pipeline.run`).
        await _start_listeners(nursery, api, config)
        # Signals from the start: a SIGTERM while the cluster cannot be used yet stops cleanly.
        signalled = trio.Event()
        nursery.start_soon(_watch_signals, engine, signalled)
        async with trio.open_nursery() as engine_tasks:
            try:
                # Returns once the DLQ topics are checked and the engine is subscribed and running.
                await engine_tasks.start(engine.run)
            except DlqStartupError as exc:
                log.error("start-up check failed: %s", exc)
                if exits is not None:
                    exits.failed(fatal_reason(0, startup=True))
                nursery.cancel_scope.cancel()
                return EXIT_FAILURE
            if own_process:
                _tune_gc()
            # Stopped before it ran (e.g. the broker was never reached): no "running" line.
            if not signalled.is_set():
                log.info(
                    "dlq-sidecar running (%s)",
                    core_build(),  # compiled by mypyc, or pure Python (see sidecar.core.compiled)
                    extra={
                        "fields": {
                            "group": config.group_id,
                            "topics": list(config.source.topics),
                            "core": "compiled" if compiled() else "pure",
                        }
                    },
                )
        # The engine has drained, committed and closed (see `Pipeline.run`): stop serving, once
        # the long polls the drain released have their (empty) answers on the way.
        await api.polls_answered(POLL_ANSWER_WAIT_S)
        nursery.cancel_scope.cancel()
    flush_summary()  # librdkafka's repeats not said yet, with their counts
    failure = engine.health().failure
    if failure:
        log.error("dlq-sidecar stopped: %s", failure)
        if exits is not None:
            exits.failed(fatal_reason(engine.counters.dlq_failed))
        return EXIT_FAILURE
    log.info("dlq-sidecar stopped cleanly")
    return EXIT_OK


def _tune_gc() -> None:
    """What start-up made (modules, config, clients) lives as long as the process: out of the
    cyclic collector's sight (`gc.freeze`), so a full collection walks only what records made since
    (about 50,000 objects otherwise, 35-45 ms a full collection, on the record path); and the young
    generation collected every `GC_YOUNG_THRESHOLD` net allocations."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


async def _watch_signals(engine: Engine, signalled: trio.Event) -> None:
    """The first SIGTERM/SIGINT drains (and sets `signalled`); a second one stops without waiting."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        stopping = False
        async for signum in signals:
            name = signal.Signals(signum).name
            if not stopping:
                stopping = True
                signalled.set()
                log.info("received %s: draining", name)
                engine.stop()
            else:
                log.warning("received %s again: stopping without waiting", name)
                engine.stop(drain=False)
