"""The sidecar's own local HTTP API (docs/app-contract.md, docs/security.md), on two listeners.

Owns `LocalApi`: the routes of the control and observability listeners and the control API's guards
(drawn in its docstring; the engine does the work), and `listener_limits` (the ``api.*`` limits as
each listener's `sidecar.http.server.Limits`, fitted to the process's open-file limit).

Imports the engine, the HTTP server, the wire parsers, config's loopback test and prometheus_client.
"""

from __future__ import annotations

import hmac
import json
import logging
import resource
from collections.abc import Awaitable, Callable, Iterator
from urllib.parse import parse_qsl

import trio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sidecar.config import ApiConfig, Config, dump_config, is_loopback_host
from sidecar.core.errors import SidecarError
from sidecar.core.wire import (
    AckItem,
    WireError,
    format_ack_response,
    format_pull_response,
    parse_ack_request,
)
from sidecar.engines.pipeline import Engine, NotPullMode
from sidecar.http.server import (
    MAX_HEADER_BYTES,
    Limits,
    Request,
    Response,
    ServerStats,
    json_response,
)

log = logging.getLogger(__name__)

MetricsRenderer = Callable[[], tuple[bytes, str]]
Route = Callable[[Request], Awaitable[Response]]

TOKEN_HEADER = "dlq-sidecar-api-token"
# Bodies up to this size parse in well under a millisecond: not worth a thread hop.
_THREAD_PARSE_BYTES = 64 * 1024
# Only GETs reach the observability listener, from kubelet and Prometheus: no request there needs
# a body, nor a header block beyond a few KiB (a bearer token included).
OBSERVABILITY_MAX_REQUEST_BYTES = 4 * 1024
OBSERVABILITY_MAX_HEADER_BYTES = 16 * 1024
# Descriptors kept for everything that is not a listener's connection (Kafka, the app, files).
_FD_RESERVE = 256


def listener_limits(api: ApiConfig, *, observability: bool, max_connections: int) -> Limits:
    """One listener's limits from ``api.*`` (``max_connections``: see :func:`fit_connections`)."""
    return Limits(
        max_request_bytes=OBSERVABILITY_MAX_REQUEST_BYTES
        if observability
        else api.max_request_bytes,
        max_header_bytes=OBSERVABILITY_MAX_HEADER_BYTES if observability else MAX_HEADER_BYTES,
        max_connections=max_connections,
        max_connections_per_peer=min(api.max_connections_per_peer, max_connections),
        idle_timeout_s=api.idle_timeout_ms / 1000,
        keep_alive_timeout_s=api.keep_alive_timeout_ms / 1000,
        header_timeout_s=api.header_timeout_ms / 1000,
        body_timeout_s=api.body_timeout_ms / 1000,
        body_min_rate_bytes_per_s=api.body_min_rate_bytes_per_s,
        request_timeout_s=api.request_timeout_ms / 1000,
        send_timeout_s=api.send_timeout_ms / 1000,
    )


def fit_connections(api: ApiConfig, listeners: int) -> int:
    """``api.max.connections``, once the open-file limit is raised to hold it on every listener.

    A connection costs one descriptor while it holds a seat (a cut one keeps its seat until it is
    closed). The soft limit is raised towards the hard one; if even that is short, the cap is
    lowered (with a warning) rather than letting a flood exhaust the descriptors, when no
    connection can be accepted at all, a probe included.
    """
    needed = api.max_connections * listeners + _FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit to %d: %s", target, exc)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return api.max_connections
    fitted = max(1, (soft - _FD_RESERVE) // listeners)
    log.warning(
        "api.max.connections %d lowered to %d per listener: the open-file limit is %d "
        "(raise it with ulimit -n or the container runtime's nofile limit)",
        api.max_connections,
        fitted,
        soft,
        extra={"fields": {"max_connections": fitted, "nofile": soft}},
    )
    return fitted


# A stop: how long the polls released by the drain may take to return, and then to be sent.
POLL_ANSWER_WAIT_S = 2.0
POLL_ANSWER_SEND_S = 0.05

# GET /v1/records (pull mode): the bounds of its two parameters, and their defaults.
PULL_MAX_RECORDS = 10_000
PULL_MAX_WAIT_MS = 60_000
PULL_DEFAULT_RECORDS = 100
PULL_DEFAULT_WAIT_MS = 0


class PullQueryError(SidecarError, ValueError):
    """A bad ``GET /v1/records`` query (a 400); the message names the parameter."""


def parse_pull_query(query: str) -> tuple[int, int]:
    """``max`` and ``wait_ms`` of a ``GET /v1/records`` query string, checked against their bounds.

    Only those two, each at most once, as decimal integers: a typo (``wait=``) is an error, not a
    default that turns a long poll into a busy loop.
    """
    values = {"max": PULL_DEFAULT_RECORDS, "wait_ms": PULL_DEFAULT_WAIT_MS}
    bounds = {"max": (1, PULL_MAX_RECORDS), "wait_ms": (0, PULL_MAX_WAIT_MS)}
    seen: set[str] = set()
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise PullQueryError(f"malformed query string {query[:100]!r}") from None
    for name, text in pairs:
        if name not in bounds:
            raise PullQueryError(f"unknown parameter {name[:50]!r} (known: max, wait_ms)")
        if name in seen:
            raise PullQueryError(f"{name} given more than once")
        seen.add(name)
        low, high = bounds[name]
        if not (text.isascii() and text.isdigit()) or len(text) > 9:
            raise PullQueryError(
                f"{name} must be an integer from {low} to {high}, got {text[:20]!r}"
            )
        value = int(text)
        if not low <= value <= high:
            raise PullQueryError(f"{name} must be from {low} to {high}, got {value}")
        values[name] = value
    return values["max"], values["wait_ms"]


def host_is_loopback(host_header: str) -> bool:
    """True when a ``Host`` header names a loopback host (any port)."""
    host = host_header.strip()
    if host.startswith("["):
        host, sep, _ = host[1:].partition("]")
        if not sep:
            return False
    else:
        host = host.rpartition(":")[0] if ":" in host else host
    return bool(host) and is_loopback_host(host)


def _media_type(content_type: str | None) -> str:
    return (content_type or "").partition(";")[0].strip().lower()


class LocalApi:
    """The local API's two listeners, their routes and guards.

    Routing and request guards (the engine does the work). Two handlers over one route table::

        control        every route: POST /v1/acks, GET /v1/records (pull mode), GET /v1/status,
                       POST /v1/breaker/close, and the read-only ones below.
                       Listens on loopback or a Unix socket only (the configuration refuses anything else).
        observability  GET /healthz, /readyz, /metrics only; may listen on the pod IP.

    Guards of the control API, in order (each refusal is logged and counted in its ServerStats)::

        403  over TCP, a ``Host`` header that is not loopback (localhost, 127.0.0.0/8, [::1]):
             a browser page whose name was rebound to 127.0.0.1 (DNS rebinding) sends its own name
        401  /v1/*: with ``api.token`` set, no or a wrong ``dlq-sidecar-api-token`` header (or
             ``Authorization: Bearer``), compared in constant time
        415  a POST whose Content-Type is not application/json: a cross-origin page can send a
             text/plain POST without a CORS preflight, never an application/json one
        413  a /v1/acks body over ``api.max.request.bytes`` (the server) or over ``api.max.ack.items``
             items; bodies over 64 KiB are parsed on a worker thread, never on the trio thread
    """

    def __init__(
        self,
        engine: Engine,
        config: Config,
        metrics: MetricsRenderer | None = None,
        *,
        token: str = "",
        max_ack_items: int = 10_000,
    ) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self._token = token.encode("ascii")
        self.max_ack_items = max_ack_items
        self.control_stats = ServerStats("control")
        self.observability_stats = ServerStats("observability")
        # Pull mode: GET /v1/records calls not returned yet (a stop lets them answer first).
        self._polls_open = 0
        self._polls_done = trio.Event()
        self._routes: dict[tuple[str, str], Route] = {
            ("POST", "/v1/acks"): self.acks,
            ("GET", "/v1/records"): self.records,
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
            ("GET", "/v1/status"): self.status,
            ("GET", "/metrics"): self.metrics_endpoint,
            ("POST", "/v1/breaker/close"): self.close_breaker,
        }
        self._observability_paths = frozenset({"/healthz", "/readyz", "/metrics"})
        # One large body parsed at a time: a parse's transient objects are several times its size.
        self._parse_limiter = trio.CapacityLimiter(1)

    async def __call__(self, request: Request) -> Response:
        return await self.control(request)

    async def control(self, request: Request) -> Response:
        """The control API's handler: guards, then any route."""
        stats = self.control_stats
        if not request.via_unix and not host_is_loopback(request.header("host") or ""):
            stats.reject("host", "a Host header that is not loopback")
            return json_response(
                {"error": "the control API answers only a loopback Host (localhost, 127.0.0.1)"},
                403,
            )
        if self._token and request.path.startswith("/v1/") and not self._authorized(request):
            stats.reject("unauthorized", f"no or a wrong token for {request.path}")
            return Response(
                401,
                (("Content-Type", "application/json"), ("WWW-Authenticate", "Bearer")),
                json.dumps({"error": f"missing or wrong {TOKEN_HEADER}"}).encode(),
            )
        return await self._route(request, self._routes)

    async def observability(self, request: Request) -> Response:
        """The observability listener's handler: read-only routes only."""
        if request.path not in self._observability_paths:
            return json_response({"error": f"no such endpoint: {request.path}"}, 404)
        return await self._route(request, self._routes)

    def _authorized(self, request: Request) -> bool:
        given = request.header(TOKEN_HEADER)
        if given is None:
            scheme, _, credentials = (request.header("authorization") or "").partition(" ")
            if scheme.lower() != "bearer":
                return False
            given = credentials.strip()
        # latin-1 round-trips whatever bytes came in; compare_digest takes constant time.
        return hmac.compare_digest(given.encode("latin-1"), self._token)

    async def _route(self, request: Request, routes: dict[tuple[str, str], Route]) -> Response:
        method = "GET" if request.method == "HEAD" else request.method
        if request.method == "HEAD" and request.path == "/v1/records":
            # A HEAD would take records and send none of them back.
            return json_response({"error": "method HEAD not allowed: records need a GET"}, 405)
        handler = routes.get((method, request.path))
        if handler is None:
            if any(path == request.path for _, path in routes):
                return json_response({"error": f"method {request.method} not allowed"}, 405)
            return json_response({"error": f"no such endpoint: {request.path}"}, 404)
        if method == "POST" and _media_type(request.header("content-type")) != "application/json":
            self.control_stats.reject("content_type", "a POST that is not application/json")
            return json_response({"error": "Content-Type must be application/json"}, 415)
        return await handler(request)

    async def acks(self, request: Request) -> Response:
        try:
            if len(request.body) > _THREAD_PARSE_BYTES:
                # json.loads itself holds the GIL (about 10 ms per MiB); the validation after it
                # lets the trio thread run every few milliseconds.
                items: list[AckItem] = await trio.to_thread.run_sync(
                    parse_ack_request, request.body, limiter=self._parse_limiter
                )
            else:
                items = parse_ack_request(request.body)
        except WireError as exc:
            return json_response({"error": str(exc)}, 400)
        if len(items) > self.max_ack_items:
            self.control_stats.reject("too_many_items", f"{len(items)} items in one /v1/acks")
            return json_response(
                {"error": f"at most {self.max_ack_items} items per request, got {len(items)}"},
                413,
            )
        results = self.engine.answer(items)
        return Response(200, (("Content-Type", "application/json"),), format_ack_response(results))

    async def records(self, request: Request) -> Response:
        """Pull mode: up to ``max`` records, waiting up to ``wait_ms`` for the first one."""
        try:
            max_records, wait_ms = parse_pull_query(request.query)
        except PullQueryError as exc:
            return json_response({"error": str(exc)}, 400)
        self._polls_open += 1
        try:
            if wait_ms:
                # A long poll stops when its client closes the connection (PeerClosed, raised to
                # the server): its records go back uncounted, and it no longer wants any.
                pulled = await request.watch_peer(
                    lambda: self.engine.pull(max_records, wait_ms / 1000)
                )
            else:
                pulled = await self.engine.pull(max_records, 0)
        except NotPullMode as exc:
            return json_response({"error": str(exc)}, 409)
        finally:
            self._polls_open -= 1
            if not self._polls_open:
                self._polls_done.set()
                self._polls_done = trio.Event()
        body = format_pull_response([(p.view, int(p.lock_remaining_s * 1000)) for p in pulled])
        return Response(
            200, (("Content-Type", "application/json"), ("Cache-Control", "no-store")), body
        )

    async def polls_answered(self, timeout_s: float) -> None:
        """A stop: wait (at most `timeout_s`) for the polls the drain released to return, then
        let their connections send the answers before the listeners are cancelled; under load
        those tasks had not run yet and their clients saw the connection closed instead."""
        if not self._polls_open:
            return
        with trio.move_on_after(timeout_s):
            while self._polls_open:
                await self._polls_done.wait()
            # The answers are written by the connections' tasks once the handler returns.
            await trio.sleep(POLL_ANSWER_SEND_S)

    async def healthz(self, _request: Request) -> Response:
        health = self.engine.health()
        if health.failure:
            return json_response({"status": "failed", "reason": health.failure}, 503)
        if health.stalled:
            return json_response({"status": "stalled", "reason": health.stalled}, 503)
        return json_response({"status": "ok"})

    async def readyz(self, _request: Request) -> Response:
        health = self.engine.health()
        checks = health.checks
        ready = all(checks.values())
        body: dict[str, object] = {"ready": ready, "checks": checks}
        # Why the broker cannot be used (authentication, TLS, connection), when the source knows.
        reason = health.broker_error
        if not checks.get("broker_reachable", True) and reason:
            body["reason"] = reason
        route = health.app_route_missing
        if not checks.get("app_route_found", True) and route:
            body["reason"] = f"{body['reason']}; {route}" if "reason" in body else route
        missing = health.missing_topics
        if not checks.get("source_topics_exist", True) and missing:
            body["reason"] = f"{body['reason']}; {missing}" if "reason" in body else missing
        if not checks.get("schema_registry_reachable", True):
            schemas = self.engine.status().get("schemas") or {}
            why = f"the schema registry {schemas.get('registry')} cannot be used: {schemas.get('registry_error')}"
            body["reason"] = f"{body['reason']}; {why}" if "reason" in body else why
        if not checks.get("circuit_breaker_closed", True):
            gate = self.engine.breaker
            breaker = gate.status() if gate is not None else {}
            why = f"the DLQ circuit breaker is {breaker.get('state')}: {breaker.get('reason')}"
            body["reason"] = f"{body['reason']}; {why}" if "reason" in body else why
        if "subscribed" in checks:
            # A share group: what its client knows (it sees no assignment), not a gate.
            share = self.engine.status().get("share") or {}
            body["share"] = {"records_received": bool(share.get("records_received"))}
        return json_response(body, 200 if ready else 503)

    async def close_breaker(self, _request: Request) -> Response:
        """`POST /v1/breaker/close`: close the DLQ circuit breaker; held records go out again."""
        gate = self.engine.breaker
        if gate is None:
            return json_response(
                {
                    "error": "the DLQ circuit breaker is disabled "
                    "(errors.deadletterqueue.circuit.breaker.enable: false)"
                },
                409,
            )
        closed = gate.close("closed through POST /v1/breaker/close")
        return json_response({"closed": closed, "circuit_breaker": gate.status()})

    async def status(self, _request: Request) -> Response:
        body = self.engine.status()
        body["config"] = dump_config(self.config)
        return Response(
            200, (("Content-Type", "application/json"),), json.dumps(body, indent=1).encode()
        )

    async def metrics_endpoint(self, _request: Request) -> Response:
        if self.metrics is None:
            return json_response({"error": "metrics are disabled (metrics.enable: false)"}, 404)
        body, content_type = self.metrics()
        return Response(200, (("Content-Type", content_type),), body)

    def collector(self) -> Collector:
        """A Prometheus collector of both listeners' connections and refusals."""
        return _ListenerCollector((self.control_stats, self.observability_stats))


class _ListenerCollector(Collector):
    def __init__(self, stats: tuple[ServerStats, ...]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        refused = CounterMetricFamily(
            "dlq_sidecar_http_refused",
            "Requests and connections the local API refused with a status, by listener and "
            "reason (connections, header_too_large, body_too_large, too_many_items, "
            "bad_request, host, unauthorized, content_type).",
            labels=["listener", "reason"],
        )
        cut = CounterMetricFamily(
            "dlq_sidecar_http_cut",
            "Connections the local API closed on its own, by listener and reason (evicted: "
            "closed to make room for a new one; idle, keep_alive_idle, header_timeout, "
            "body_too_slow, request_timeout, send_timeout).",
            labels=["listener", "reason"],
        )
        connections = GaugeMetricFamily(
            "dlq_sidecar_http_open_connections",
            "Open connections of the local API, by listener.",
            labels=["listener"],
        )
        for stats in self.stats:
            for reason, n in sorted(stats.refused.items()):
                refused.add_metric([stats.name, reason], n)
            for reason, n in sorted(stats.cuts.items()):
                cut.add_metric([stats.name, reason], n)
            connections.add_metric([stats.name], stats.open_connections)
        yield refused
        yield cut
        yield connections
