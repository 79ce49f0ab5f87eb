"""The sidecar's own local HTTP API (SPEC §6): acks for deferred answers, health, readiness, status, metrics.

Owns request routing only; the engine does the work. Listens on loopback or a Unix socket by default.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from sidecar.httpserver import Request, Response, json_response
from sidecar.pipeline import Engine
from sidecar.wire import WireError, format_ack_response, parse_ack_request

MetricsRenderer = Callable[[], tuple[bytes, str]]


class LocalApi:
    def __init__(self, engine: Engine, metrics: MetricsRenderer | None = None) -> None:
        self.engine = engine
        self.metrics = metrics
        self._routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {
            ("POST", "/v1/acks"): self.acks,
            ("GET", "/healthz"): self.healthz,
            ("GET", "/readyz"): self.readyz,
            ("GET", "/v1/status"): self.status,
            ("GET", "/metrics"): self.metrics_endpoint,
        }

    async def __call__(self, request: Request) -> Response:
        handler = self._routes.get((request.method, request.path))
        if handler is None:
            if any(path == request.path for _, path in self._routes):
                return json_response({"error": f"method {request.method} not allowed"}, 405)
            return json_response({"error": f"no such endpoint: {request.path}"}, 404)
        return await handler(request)

    async def acks(self, request: Request) -> Response:
        try:
            items = parse_ack_request(request.body)
        except WireError as exc:
            return json_response({"error": str(exc)}, 400)
        results = self.engine.ack(items)
        return Response(200, (("Content-Type", "application/json"),), format_ack_response(results))

    async def healthz(self, _request: Request) -> Response:
        if self.engine.failure:
            return json_response({"status": "failed", "reason": self.engine.failure}, 503)
        stalled = self.engine.stalled()
        if stalled:
            return json_response({"status": "stalled", "reason": stalled}, 503)
        return json_response({"status": "ok"})

    async def readyz(self, _request: Request) -> Response:
        checks = self.engine.readiness()
        ready = all(checks.values())
        return json_response({"ready": ready, "checks": checks}, 200 if ready else 503)

    async def status(self, _request: Request) -> Response:
        body = self.engine.status()
        body["config"] = self.engine.config.to_dict()
        return Response(
            200, (("Content-Type", "application/json"),), json.dumps(body, indent=1).encode()
        )

    async def metrics_endpoint(self, _request: Request) -> Response:
        if self.metrics is None:
            return json_response({"error": "metrics are disabled (metrics.enable: false)"}, 404)
        body, content_type = self.metrics()
        return Response(200, (("Content-Type", content_type),), body)
