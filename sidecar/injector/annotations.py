"""The pod annotations the injector reads, and what they choose.

Owns `read_choices` (the annotations and their defaults: its docstring), `wants_injection`, `Choices`
and the refusals (`Refusal`, `BadAnnotation`: a typo under the prefix refuses the pod whole).

Pure: no I/O; imports the standard library, `sidecar.core.errors` and `sidecar.injector.settings`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from sidecar.core.errors import SidecarError
from sidecar.injector.settings import (
    DNS_SUBDOMAIN,
    LOG_LEVELS,
    PUSH_PATH,
    SOCKET_NAME,
    TRANSPORTS,
    InjectorSettings,
)

__all__ = ["PREFIX", "BadAnnotation", "Choices", "Refusal", "read_choices", "wants_injection"]

PREFIX = "dlq-sidecar.io/"
INJECT = PREFIX + "inject"
STATUS = PREFIX + "status"
CONFIG = PREFIX + "config"
APP_CONTAINER = PREFIX + "app-container"
APP_TRANSPORT = PREFIX + "app-transport"
APP_PORT = PREFIX + "app-port"
APP_SOCKET = PREFIX + "app-socket"
APP_PUSH_PATH = PREFIX + "app-push-path"
APP_SHUTDOWN = PREFIX + "app-shutdown-seconds"
DRAIN = PREFIX + "drain-timeout-ms"
CPU_REQUEST = PREFIX + "cpu-request"
CPU_LIMIT = PREFIX + "cpu-limit"
MEMORY_REQUEST = PREFIX + "memory-request"
MEMORY_LIMIT = PREFIX + "memory-limit"
LOG_LEVEL = PREFIX + "log-level"

KNOWN = (
    INJECT,
    STATUS,
    CONFIG,
    APP_CONTAINER,
    APP_TRANSPORT,
    APP_PORT,
    APP_SOCKET,
    APP_PUSH_PATH,
    APP_SHUTDOWN,
    DRAIN,
    CPU_REQUEST,
    CPU_LIMIT,
    MEMORY_REQUEST,
    MEMORY_LIMIT,
    LOG_LEVEL,
)

# A Kubernetes resource quantity (k8s.io/apimachinery's resource.Quantity): a decimal number and a
# binary (Ki..Ei) or decimal (n, u, m, k, M..E) suffix, or a decimal exponent.
_QUANTITY = re.compile(
    r"(?P<number>\+?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d{1,3})?"
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}
_C_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


class Refusal(SidecarError):
    """A pod the injector will not admit: refused whole, with ``str(err)`` as the API server's message."""


class BadAnnotation(Refusal):
    """A pod's annotation the injector cannot follow: the message names it and says why."""

    def __init__(self, annotation: str, reason: str) -> None:
        super().__init__(f"annotation {annotation}: {reason}")
        self.annotation = annotation
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Choices:
    """What one pod gets: its annotations over the injector's defaults."""

    config_map: str
    app_container: str | None  # None: the pod's first container
    transport: str
    app_port: int
    socket_name: str
    push_path: str
    app_shutdown_s: int
    drain_timeout_ms: int
    resources: Mapping[str, Mapping[str, str]]
    log_level: str


def wants_injection(annotations: Mapping[str, str]) -> bool:
    """Whether the pod asks for the sidecar; an ``inject`` value other than true/false is refused."""
    value = annotations.get(INJECT)
    if value is None:
        return False
    if value.strip().lower() == "true":
        return True
    if value.strip().lower() == "false":
        return False
    raise BadAnnotation(INJECT, f'must be "true" or "false", got {value!r}')


def quantity(annotation: str, text: str) -> Decimal:
    """The value of a Kubernetes quantity, or BadAnnotation."""
    match = _QUANTITY.fullmatch(text.strip()) if len(text) <= 64 else None
    if match is None:
        raise BadAnnotation(
            annotation, f"must be a Kubernetes quantity (e.g. 100m, 128Mi), got {text!r}"
        )
    suffix = match.group("suffix") or ""
    try:
        number = Decimal(match.group("number"))
        if suffix[:1] in ("e", "E"):
            return number * Decimal(10) ** int(suffix[1:])
        return number * _SUFFIX[suffix]
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        raise BadAnnotation(annotation, f"is not a number: {text!r}") from None


def _int(annotation: str, text: str, low: int, high: int) -> int:
    if not re.fullmatch(r"\d{1,10}", text.strip()):
        raise BadAnnotation(annotation, f"must be a whole number {low}-{high}, got {text!r}")
    value = int(text)
    if not low <= value <= high:
        raise BadAnnotation(annotation, f"must be {low}-{high}, got {value}")
    return value


def _match(annotation: str, text: str, pattern: str, what: str, max_len: int) -> str:
    if len(text) > max_len or not re.fullmatch(pattern, text):
        raise BadAnnotation(annotation, f"must be {what}, got {text[:80]!r}")
    return text


def read_choices(annotations: Mapping[str, str], settings: InjectorSettings) -> Choices:
    """The choices of a pod that asked for the sidecar; BadAnnotation for the first bad one.

    A pod asks for the sidecar with ``dlq-sidecar.io/inject: "true"``; every other annotation under the
    ``dlq-sidecar.io/`` prefix tunes what it gets, and whatever none of them says comes from the injector's
    own defaults (:class:`sidecar.injector.settings.InjectorSettings`)::

        annotation                      value                                  default (injector config)
        dlq-sidecar.io/inject           "true" | "false"                       (absent: not injected)
        dlq-sidecar.io/config           the ConfigMap (pod's namespace)        defaults.configMap
        dlq-sidecar.io/app-container    the app's container name               the pod's first container
        dlq-sidecar.io/app-transport    tcp | unix | pull                      unix with app-socket, else defaults.app.transport
        dlq-sidecar.io/app-port         1-65535 (transport tcp)                defaults.app.port
        dlq-sidecar.io/app-socket       a file name in /var/run/dlq-sidecar    defaults.app.socketName
        dlq-sidecar.io/app-push-path    /path the records are POSTed to        defaults.app.pushPath
        dlq-sidecar.io/app-shutdown-seconds   0-3600                           defaults.app.shutdownSeconds
        dlq-sidecar.io/drain-timeout-ms       1-3600000                        defaults.sidecar.shutdown.drainTimeoutMs
        dlq-sidecar.io/cpu-request, cpu-limit, memory-request, memory-limit   defaults.sidecar.resources
        dlq-sidecar.io/log-level        debug | info | warning | error         defaults.logLevel (empty: the ConfigMap's)
        dlq-sidecar.io/status           written by the injector: "injected"

    An unknown key under the prefix (a typo) is refused like a bad value: `BadAnnotation` names the
    annotation and the reason, and the pod is refused whole.
    """
    for key in sorted(annotations):
        if key.startswith(PREFIX) and key not in KNOWN:
            raise BadAnnotation(
                key, f"unknown (known: {', '.join(k.removeprefix(PREFIX) for k in KNOWN)})"
            )
    app = settings.app
    get = annotations.get

    config_map = settings.config_map
    if (text := get(CONFIG)) is not None:
        config_map = _match(CONFIG, text, DNS_SUBDOMAIN, "a ConfigMap name (DNS subdomain)", 253)
    if not config_map:
        raise BadAnnotation(CONFIG, "is required: the injector has no default ConfigMap")

    container = None
    if (text := get(APP_CONTAINER)) is not None:
        container = _match(APP_CONTAINER, text, _C_NAME, "a container name", 63)

    port = app.port
    if (text := get(APP_PORT)) is not None:
        port = _int(APP_PORT, text, 1, 65535)
    socket_name = app.socket_name
    if (text := get(APP_SOCKET)) is not None:
        socket_name = _match(
            APP_SOCKET, text, SOCKET_NAME, "a file name (letters, digits, . _ -)", 100
        )
        if socket_name in (".", ".."):
            raise BadAnnotation(APP_SOCKET, "must name a file")

    if (text := get(APP_TRANSPORT)) is not None:
        if text not in TRANSPORTS:
            raise BadAnnotation(
                APP_TRANSPORT, f"must be one of {', '.join(TRANSPORTS)}, got {text!r}"
            )
        transport = text
    elif APP_SOCKET in annotations:
        transport = "unix"
    elif APP_PORT in annotations:
        transport = "tcp"
    else:
        transport = app.transport
    if transport != "tcp" and APP_PORT in annotations:
        raise BadAnnotation(APP_PORT, f"is for transport tcp, and this pod's is {transport}")
    if transport != "unix" and APP_SOCKET in annotations:
        raise BadAnnotation(APP_SOCKET, f"is for transport unix, and this pod's is {transport}")

    push_path = app.push_path
    if (text := get(APP_PUSH_PATH)) is not None:
        push_path = _match(APP_PUSH_PATH, text, PUSH_PATH, "an absolute URL path (/records)", 1024)
        if transport == "pull":
            raise BadAnnotation(APP_PUSH_PATH, "is for push transports, and this pod's is pull")

    shutdown_s = app.shutdown_s
    if (text := get(APP_SHUTDOWN)) is not None:
        shutdown_s = _int(APP_SHUTDOWN, text, 0, 3600)
    drain_ms = settings.sidecar.drain_timeout_ms
    if (text := get(DRAIN)) is not None:
        drain_ms = _int(DRAIN, text, 1, 3_600_000)

    resources = {kind: dict(values) for kind, values in settings.sidecar.resources.items()}
    for annotation, kind, name in (
        (CPU_REQUEST, "requests", "cpu"),
        (CPU_LIMIT, "limits", "cpu"),
        (MEMORY_REQUEST, "requests", "memory"),
        (MEMORY_LIMIT, "limits", "memory"),
    ):
        if (text := get(annotation)) is not None:
            quantity(annotation, text)
            resources.setdefault(kind, {})[name] = text.strip()
    for name, request_key, limit_key in (
        ("cpu", CPU_REQUEST, CPU_LIMIT),
        ("memory", MEMORY_REQUEST, MEMORY_LIMIT),
    ):
        request = resources.get("requests", {}).get(name)
        limit = resources.get("limits", {}).get(name)
        if request is not None and limit is not None:
            blame = limit_key if limit_key in annotations else request_key
            if quantity(blame, request) > quantity(blame, limit):
                raise BadAnnotation(
                    blame, f"the {name} request {request} is above the limit {limit}"
                )

    log_level = settings.log_level
    if (text := get(LOG_LEVEL)) is not None:
        if text not in LOG_LEVELS:
            raise BadAnnotation(LOG_LEVEL, f"must be one of {', '.join(LOG_LEVELS)}, got {text!r}")
        log_level = text

    return Choices(
        config_map=config_map,
        app_container=container,
        transport=transport,
        app_port=port,
        socket_name=socket_name,
        push_path=push_path,
        app_shutdown_s=shutdown_s,
        drain_timeout_ms=drain_ms,
        resources={k: v for k, v in resources.items() if v},
        log_level=log_level,
    )
