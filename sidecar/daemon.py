"""`dlq-sidecar run`: start-up checks, the task tree, signals and the shutdown order.

Shutdown order (SIGTERM/SIGINT): stop polling and pause intake → let in-flight attempts and DLQ writes finish
within `shutdown.drain.timeout.ms` → commit every partition's state → close the consumer (its revoke callback
commits once more and the group sees us leave) → flush the DLQ producer → exit 0. A second signal skips the
drain; the commits that follow are still safe because a committed offset never passes a record that is not done.
A fatal error (a DLQ write that cannot succeed, `errors.tolerance: none`) follows the same path without the
drain and exits 1.
"""

from __future__ import annotations

import functools
import logging
import signal
from collections.abc import Callable
from typing import cast

import trio

from sidecar.api import LocalApi
from sidecar.config import Config
from sidecar.config import Engine as EngineKind
from sidecar.dlq import DlqStartupError
from sidecar.engine import Engine
from sidecar.httpserver import Limits, serve_http
from sidecar.source import SourceError, check_cluster_sync
from sidecar.tracing import Tracing

log = logging.getLogger("sidecar.daemon")

EXIT_OK = 0
EXIT_FAILURE = 1
# Between two start-up checks of a cluster that cannot be used (authentication, TLS, connection).
CLUSTER_RETRY_MAX_S = 10.0


async def wait_cluster_usable(engine: Engine, config: Config) -> None:
    """Until the cluster answers with the configured credentials and certificates: not ready (with
    the reason), retried with backoff. A wrong password or CA is fixed in a Secret, not by a restart:
    exiting here would only turn it into a crash loop that hides the cause."""
    delay_s = 1.0
    while (reason := await trio.to_thread.run_sync(check_cluster_sync, config.kafka)) is not None:
        engine.source.broker_ok = False
        engine.source.broker_error = reason
        log.error(
            "the Kafka cluster cannot be used: %s; not ready, retrying in %gs", reason, delay_s
        )
        await trio.sleep(delay_s)
        delay_s = min(delay_s * 2, CLUSTER_RETRY_MAX_S)
    engine.source.broker_ok = True
    engine.source.broker_error = None


# Only GETs reach the observability listener: no request there needs a body.
_OBSERVABILITY_MAX_REQUEST_BYTES = 64 * 1024


async def _start_listeners(nursery: trio.Nursery, api: LocalApi, config: Config) -> None:
    """The control API (loopback or a Unix socket) and, when configured, the observability one."""
    control_limits = Limits(
        max_request_bytes=config.api.max_request_bytes,
        max_connections=config.api.max_connections,
    )
    where = await nursery.start(
        functools.partial(
            serve_http,
            api.control,
            config.api.address,
            limits=control_limits,
            stats=api.control_stats,
        )
    )
    log.info(
        "control API listening on %s%s",
        where,
        " (token required on /v1/*)" if config.api.token else "",
        extra={"fields": {"api": str(where)}},
    )
    observability = config.api.observability_address
    if observability is None:
        return
    observability_limits = Limits(
        max_request_bytes=_OBSERVABILITY_MAX_REQUEST_BYTES,
        max_connections=config.api.max_connections,
    )
    where = await nursery.start(
        functools.partial(
            serve_http,
            api.observability,
            observability,
            limits=observability_limits,
            stats=api.observability_stats,
        )
    )
    log.info(
        "observability listener (healthz, readyz, metrics) on %s",
        where,
        extra={"fields": {"observability": str(where)}},
    )


async def run_sidecar(
    config: Config,
    *,
    write_ahead: bool = True,
    tracing: Tracing | None = None,
    on_engine: Callable[[Engine], None] | None = None,
) -> int:
    """Run until SIGTERM/SIGINT or a fatal error; returns the exit code.

    `tracing` and `on_engine` let an in-process caller (tests) bring its own span processor and get
    hold of the engine (e.g. to call `request_stop()` instead of sending a signal).
    """
    if config.engine is EngineKind.SHARE:
        from sidecar.share_engine import ShareEngine

        # ShareEngine has the surface this function, the local API and the metrics use.
        engine = cast(Engine, ShareEngine(config, tracing=tracing))
    else:
        engine = Engine(config, write_ahead=write_ahead, tracing=tracing)
    if on_engine is not None:
        on_engine(engine)

    metrics = None
    if config.metrics.enable:
        from sidecar.metrics import Metrics

        metrics = Metrics(engine)
    api = LocalApi(
        engine,
        metrics.render if metrics else None,
        token=config.api.token,
        max_ack_items=config.api.max_ack_items,
    )
    if metrics is not None:
        metrics.registry.register(api.collector())

    second_signal = False
    async with trio.open_nursery() as nursery:
        engine.attach(nursery)
        # The API first, so that readiness can say why a cluster cannot be used yet.
        await _start_listeners(nursery, api, config)
        await wait_cluster_usable(engine, config)
        if config.errors.dlq.enabled:
            dlq_topics = sorted({t for s in config.source.topics if (t := config.dlq_topic_for(s))})
            try:
                await trio.to_thread.run_sync(engine.dlq.prepare_topics_sync, dlq_topics)
            except DlqStartupError as exc:
                log.error("start-up check failed: %s", exc)
                nursery.cancel_scope.cancel()
                return EXIT_FAILURE
            engine.dlq_ready = True
        await nursery.start(engine.dlq.run)

        engine.source.start()

        async def poll() -> None:
            try:
                await engine.source.run()
            except SourceError as exc:
                engine.fail(str(exc))

        nursery.start_soon(poll)
        nursery.start_soon(engine.scheduler)
        nursery.start_soon(engine.committer)
        if engine.transactional:
            nursery.start_soon(engine.txn_loop)
        for _ in range(config.app.max_in_flight):
            nursery.start_soon(engine.worker)

        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:

            async def watch_signals() -> None:
                nonlocal second_signal
                async for signum in signals:
                    if not engine.stop_event.is_set():
                        log.info("received %s: draining", signal.Signals(signum).name)
                        engine.request_stop()
                    else:
                        log.warning(
                            "received %s again: stopping without waiting",
                            signal.Signals(signum).name,
                        )
                        second_signal = True
                        engine.drain_cancel.cancel()

            nursery.start_soon(watch_signals)
            log.info(
                "dlq-sidecar running",
                extra={"fields": {"group": config.group_id, "topics": list(config.source.topics)}},
            )
            await engine.stop_event.wait()

            engine.source.stop_polling()
            if engine.failure is None and not second_signal:
                await engine.drain(config.shutdown_drain_timeout_ms / 1000)
            engine.stopping = True
            engine.kick()
            with trio.CancelScope(shield=True):
                await engine.commit_all()
                # Wait for the poll loop's last consume() to return before closing the handle.
                with trio.move_on_after(5):
                    await engine.source.wait_stopped()
                await engine.source.close()
            nursery.cancel_scope.cancel()
    await engine.app.aclose()
    await trio.to_thread.run_sync(engine.tracing.shutdown)
    if engine.failure:
        log.error("dlq-sidecar stopped: %s", engine.failure)
        return EXIT_FAILURE
    log.info("dlq-sidecar stopped cleanly")
    return EXIT_OK
