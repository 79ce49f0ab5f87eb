"""`dlq-sidecar injector`: the mutating admission webhook, served over HTTPS on trio.

Owns `serve_injector` (routes ``POST /mutate`` and ``GET /healthz`` through `sidecar.http.server`'s
limits and TLS; keep-alive, certificate reloads and the shutdown delay: its docstring) and
`CertificateStore`.

Imports the injector's pure modules, `sidecar.http` and `sidecar.telemetry.logs`.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import signal
import ssl
from pathlib import Path

import trio
import yaml

from sidecar.http.server import Handler, Limits, Request, Response, serve_http
from sidecar.injector.review import MalformedReview, review
from sidecar.injector.settings import InjectorConfigError, InjectorSettings, parse_settings

__all__ = ["CertificateStore", "handler_for", "load_settings", "run_injector", "serve_injector"]

log = logging.getLogger(__name__)

# A pod's AdmissionReview holds the pod twice at most (object, and oldObject on UPDATE); etcd keeps
# objects up to 1.5 MiB.
MAX_REVIEW_BYTES = 4 * 1024 * 1024
KEEP_ALIVE_S = 120.0
LIMITS = Limits(
    max_request_bytes=MAX_REVIEW_BYTES,
    max_connections=512,
    max_connections_per_peer=128,
    idle_timeout_s=10.0,
    keep_alive_timeout_s=KEEP_ALIVE_S,
    header_timeout_s=5.0,
    body_timeout_s=10.0,
    request_timeout_s=10.0,
    send_timeout_s=10.0,
)
_CHECK_EVERY_S = 1.0


def load_settings(path: str) -> InjectorSettings:
    """The injector's config file, parsed; InjectorConfigError naming the file, the key and the reason."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InjectorConfigError(
            "", f"cannot read the file: {exc.strerror or exc}", file=path
        ) from None
    except UnicodeDecodeError as exc:
        raise InjectorConfigError("", f"the file is not UTF-8: {exc.reason}", file=path) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InjectorConfigError("", f"not valid YAML: {exc}", file=path) from None
    return parse_settings(data, file=path)


class CertificateStore:
    """The TLS context of the listener, loaded again when the certificate or key file changes."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self._cert_file = cert_file
        self._key_file = key_file
        self._stamp = self._read_stamp()
        self._context = self._load()  # raises: the first pair must load
        self._checked_at = -math.inf

    def _read_stamp(self) -> tuple[float, float]:
        return (os.stat(self._cert_file).st_mtime, os.stat(self._key_file).st_mtime)

    def _load(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self._cert_file, self._key_file)
        return context

    def context(self) -> ssl.SSLContext:
        now = trio.current_time()
        if now - self._checked_at >= _CHECK_EVERY_S:
            self._checked_at = now
            try:
                stamp = self._read_stamp()
                if stamp != self._stamp:
                    self._context = self._load()
                    self._stamp = stamp
                    log.info("injector: loaded the rotated TLS certificate %s", self._cert_file)
            except (OSError, ssl.SSLError) as exc:
                log.warning(
                    "injector: the TLS certificate did not load, keeping the previous one: %s", exc
                )
        return self._context


_TEXT = (("Content-Type", "text/plain; charset=utf-8"),)


def handler_for(settings: InjectorSettings) -> Handler:
    """The webhook's HTTP handler, answering with ``settings``' defaults."""
    return functools.partial(_handle, settings)


async def _handle(settings: InjectorSettings, request: Request) -> Response:
    if request.path == "/healthz":
        if request.method not in ("GET", "HEAD"):
            return Response(405, (*_TEXT, ("Allow", "GET, HEAD")), b"method not allowed\n")
        return Response(200, _TEXT, b"ok\n")
    if request.path != "/mutate":
        return Response(404, _TEXT, b"not found\n")
    if request.method != "POST":
        return Response(405, (*_TEXT, ("Allow", "POST")), b"method not allowed\n")
    try:
        reviewed = review(request.body, settings)
    except MalformedReview as exc:
        log.warning("injector: refused a request that is not an AdmissionReview: %s", exc)
        return Response(400, _TEXT, f"not an admission.k8s.io/v1 AdmissionReview: {exc}\n".encode())
    decision = reviewed.decision
    pod = f"{reviewed.namespace}/{reviewed.name}"
    if not decision.allowed:
        log.warning("injector: refused pod %s: %s", pod, decision.note)
    elif decision.patch:
        log.info("injector: injected the sidecar into pod %s", pod)
    elif decision.note.startswith("already has"):
        # A pod asked for the sidecar and has it: chart-made, or the API server calling again
        # (reinvocationPolicy IfNeeded) after a later webhook changed it.
        log.info("injector: left pod %s alone: %s", pod, decision.note)
    else:
        log.debug("injector: left pod %s alone: %s", pod, decision.note)
    return Response(200, (("Content-Type", "application/json"),), reviewed.body)


async def serve_injector(
    settings: InjectorSettings,
    certificates: CertificateStore,
    *,
    limits: Limits = LIMITS,
    task_status: trio.TaskStatus[int | str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the webhook until cancelled; reports the bound port through ``task_status``.

    Routes: ``POST /mutate`` (an AdmissionReview, answered by :func:`sidecar.injector.review.review`),
    ``GET /healthz`` (200 once listening; the chart's probes). It listens through the project's own HTTP
    server (:func:`sidecar.http.server.serve_http`) with its TLS option, so the same hard limits hold as on
    the sidecar's listeners: a body over :data:`MAX_REVIEW_BYTES` is a 413, a slow header block, body or
    request a 408, an idle connection is closed. Keep-alive connections stay open for
    :data:`KEEP_ALIVE_S`, longer than the 90 s after which the API server's HTTP client drops an idle
    connection itself: the client closes first, so it never sends a review into a connection the
    injector is closing (a POST that it would not retry, and the webhook's failurePolicy would apply).

    The certificate and key are read again when either file changes (checked at most once a second, on a
    new connection): cert-manager, or the kubelet updating a mounted Secret, rotates them without a restart.
    A pair that does not load (half written) leaves the previous one in use.

    On SIGTERM or SIGINT it keeps answering for ``shutdown_delay_s`` (while the Service's endpoints are
    being updated, reviews still arrive), then stops.
    """
    await serve_http(
        handler_for(settings),
        ("tcp", settings.listen_host, settings.listen_port),
        limits=limits,
        tls=certificates.context,
        task_status=task_status,
    )


async def run_injector(settings: InjectorSettings, shutdown_delay_s: float = 5.0) -> int:
    """The `dlq-sidecar injector` process: serve until a signal, then answer ``shutdown_delay_s`` more."""
    certificates = CertificateStore(settings.tls_cert_file, settings.tls_key_file)
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_injector, settings, certificates)
            log.info("injector: serving HTTPS on %s:%s (POST /mutate)", settings.listen_host, port)
            async for signum in signals:
                log.info(
                    "injector: %s: stopping in %g s", signal.Signals(signum).name, shutdown_delay_s
                )
                await trio.sleep(shutdown_delay_s)
                nursery.cancel_scope.cancel()
                break
    return 0
