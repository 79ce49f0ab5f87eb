"""The injector's own configuration: where it listens, its TLS files, and the defaults of what it injects.

Owns `parse_settings` (one YAML file whose ``defaults`` have the shape of the dlq-sidecar chart's
values: its docstring) and `InjectorSettings`. Every key is optional except ``tls``; a bad one is an
`InjectorConfigError` naming the dotted path and the reason (exit 2).

Pure: parses already-loaded data (the file is read by `sidecar.injector.server`). Imports the
standard library and `sidecar.core.errors` only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sidecar.core.errors import SidecarError

__all__ = [
    "AppDefaults",
    "ImageSettings",
    "InjectorConfigError",
    "InjectorSettings",
    "ProbeSettings",
    "SidecarDefaults",
    "parse_settings",
]

T = TypeVar("T")

TRANSPORTS = ("tcp", "unix", "pull")
EXPOSURES = ("pod", "loopback")
LOG_LEVELS = ("debug", "info", "warning", "error")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


class InjectorConfigError(SidecarError):
    """The injector's configuration cannot be used: ``str(err)`` is ``"<file>: <path>: <reason>"``."""

    def __init__(self, path: str, reason: str, *, file: str = "<injector config>") -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason
        self.file = file

    def __str__(self) -> str:
        return (
            f"{self.file}: {self.path}: {self.reason}"
            if self.path
            else f"{self.file}: {self.reason}"
        )


@dataclass(frozen=True, slots=True)
class ImageSettings:
    repository: str = "dlq-sidecar"
    tag: str = "latest"
    digest: str = ""
    pull_policy: str = "IfNotPresent"

    @property
    def reference(self) -> str:
        """``repository@digest`` when a digest is set, else ``repository:tag`` (as the chart's imageRef)."""
        if self.digest:
            return f"{self.repository}@{self.digest}"
        return f"{self.repository}:{self.tag}"


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    enabled: bool = True
    period_s: int = 10
    failure_threshold: int = 3
    timeout_s: int = 2


@dataclass(frozen=True, slots=True)
class SidecarDefaults:
    image: ImageSettings = field(default_factory=ImageSettings)
    api_port: int = 8787
    observability_port: int = 8788
    exposure: str = "pod"
    drain_timeout_ms: int = 20000
    margin_s: int = 5
    resources: Mapping[str, Mapping[str, str]] = field(
        default_factory=lambda: {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "256Mi"},
        }
    )
    startup_probe: ProbeSettings = field(default_factory=lambda: ProbeSettings(True, 2, 30, 2))
    liveness_probe: ProbeSettings = field(default_factory=lambda: ProbeSettings(True, 10, 3, 2))
    readiness_probe: ProbeSettings = field(default_factory=lambda: ProbeSettings(True, 5, 3, 2))


@dataclass(frozen=True, slots=True)
class AppDefaults:
    transport: str = "tcp"
    port: int = 8080
    socket_name: str = "app.sock"
    push_path: str = "/records"
    shutdown_s: int = 10


@dataclass(frozen=True, slots=True)
class InjectorSettings:
    tls_cert_file: str
    tls_key_file: str
    listen_host: str = "0.0.0.0"
    listen_port: int = 8443
    config_map: str = "dlq-sidecar"
    log_level: str = ""
    app: AppDefaults = field(default_factory=AppDefaults)
    sidecar: SidecarDefaults = field(default_factory=SidecarDefaults)


# -- reading ---------------------------------------------------------------------------------------


class _Bad(Exception):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _mapping(raw: object, path: str, known: tuple[str, ...]) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _Bad(path, f"must be a mapping, got {type(raw).__name__}")
    for key in raw:
        if key not in known:
            raise _Bad(_join(path, str(key)), f"unknown key (known here: {', '.join(known)})")
    return raw


def _get(
    section: Mapping[str, Any], path: str, key: str, read: Callable[[object, str], T], default: T
) -> T:
    if key not in section or section[key] is None:
        return default
    return read(section[key], _join(path, key))


def _int(low: int, high: int) -> Callable[[object, str], int]:
    def read(raw: object, path: str) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise _Bad(path, f"must be an integer, got {raw!r}")
        if not low <= raw <= high:
            raise _Bad(path, f"must be between {low} and {high}, got {raw}")
        return raw

    return read


def _str(
    choices: tuple[str, ...] = (), *, pattern: str = "", empty: bool = True
) -> Callable[[object, str], str]:
    def read(raw: object, path: str) -> str:
        if not isinstance(raw, str):
            raise _Bad(path, f"must be a string, got {type(raw).__name__}")
        if choices and raw not in choices:
            raise _Bad(path, f"must be one of {', '.join(choices)}, got {raw!r}")
        if not raw and not empty:
            raise _Bad(path, "must not be empty")
        if raw and pattern and not re.fullmatch(pattern, raw):
            raise _Bad(path, f"is not valid here: {raw!r}")
        return raw

    return read


def _bool(raw: object, path: str) -> bool:
    if not isinstance(raw, bool):
        raise _Bad(path, f"must be true or false, got {raw!r}")
    return raw


def _resources(raw: object, path: str) -> Mapping[str, Mapping[str, str]]:
    section = _mapping(raw, path, ("requests", "limits"))
    out: dict[str, dict[str, str]] = {}
    for kind, values in section.items():
        sub = _mapping(values, _join(path, kind), ("cpu", "memory"))
        out[kind] = {}
        for name, value in sub.items():
            if not isinstance(value, str | int) or isinstance(value, bool):
                raise _Bad(_join(_join(path, kind), name), "must be a Kubernetes quantity")
            out[kind][name] = str(value)
    return out


_PROBE_KEYS = ("enabled", "periodSeconds", "failureThreshold", "timeoutSeconds")


def _probe(default: ProbeSettings) -> Callable[[object, str], ProbeSettings]:
    def read(raw: object, path: str) -> ProbeSettings:
        s = _mapping(raw, path, _PROBE_KEYS)
        return ProbeSettings(
            _get(s, path, "enabled", _bool, default.enabled),
            _get(s, path, "periodSeconds", _int(1, 3600), default.period_s),
            _get(s, path, "failureThreshold", _int(1, 1000), default.failure_threshold),
            _get(s, path, "timeoutSeconds", _int(1, 3600), default.timeout_s),
        )

    return read


def _image(raw: object, path: str) -> ImageSettings:
    s = _mapping(raw, path, ("repository", "tag", "digest", "pullPolicy"))
    d = ImageSettings()
    return ImageSettings(
        _get(s, path, "repository", _str(empty=False, pattern=r"[^\s@]+"), d.repository),
        _get(s, path, "tag", _str(empty=False, pattern=r"[\w][\w.-]{0,127}"), d.tag),
        _get(s, path, "digest", _str(pattern=r"sha256:[a-f0-9]{64}"), d.digest),
        _get(s, path, "pullPolicy", _str(PULL_POLICIES), d.pull_policy),
    )


def _sidecar(raw: object, path: str) -> SidecarDefaults:
    keys = (
        "image",
        "api",
        "shutdown",
        "resources",
        "startupProbe",
        "livenessProbe",
        "readinessProbe",
    )
    s = _mapping(raw, path, keys)
    d = SidecarDefaults()
    api_path = _join(path, "api")
    api = _mapping(s.get("api"), api_path, ("port", "observabilityPort", "exposure"))
    shutdown_path = _join(path, "shutdown")
    shutdown = _mapping(s.get("shutdown"), shutdown_path, ("drainTimeoutMs", "marginSeconds"))
    out = SidecarDefaults(
        image=_get(s, path, "image", _image, d.image),
        api_port=_get(api, api_path, "port", _int(1, 65535), d.api_port),
        observability_port=_get(
            api, api_path, "observabilityPort", _int(1, 65535), d.observability_port
        ),
        exposure=_get(api, api_path, "exposure", _str(EXPOSURES), d.exposure),
        drain_timeout_ms=_get(
            shutdown, shutdown_path, "drainTimeoutMs", _int(1, 3_600_000), d.drain_timeout_ms
        ),
        margin_s=_get(shutdown, shutdown_path, "marginSeconds", _int(0, 3600), d.margin_s),
        resources=_get(s, path, "resources", _resources, d.resources),
        startup_probe=_get(s, path, "startupProbe", _probe(d.startup_probe), d.startup_probe),
        liveness_probe=_get(s, path, "livenessProbe", _probe(d.liveness_probe), d.liveness_probe),
        readiness_probe=_get(
            s, path, "readinessProbe", _probe(d.readiness_probe), d.readiness_probe
        ),
    )
    if out.api_port == out.observability_port:
        raise _Bad(_join(api_path, "observabilityPort"), "must differ from port (the control API)")
    return out


SOCKET_NAME = r"[A-Za-z0-9._-]{1,100}"
PUSH_PATH = r"/[!-~]{0,1023}"


def _app(raw: object, path: str) -> AppDefaults:
    s = _mapping(raw, path, ("transport", "port", "socketName", "pushPath", "shutdownSeconds"))
    d = AppDefaults()
    out = AppDefaults(
        _get(s, path, "transport", _str(TRANSPORTS), d.transport),
        _get(s, path, "port", _int(1, 65535), d.port),
        _get(s, path, "socketName", _str(pattern=SOCKET_NAME, empty=False), d.socket_name),
        _get(s, path, "pushPath", _str(pattern=PUSH_PATH, empty=False), d.push_path),
        _get(s, path, "shutdownSeconds", _int(0, 3600), d.shutdown_s),
    )
    if out.socket_name in (".", ".."):
        raise _Bad(_join(path, "socketName"), "must name a file")
    return out


# A DNS-1123 subdomain: what a ConfigMap's name must be.
DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"


def _listen(raw: object, path: str) -> tuple[str, int]:
    if not isinstance(raw, str) or ":" not in raw:
        raise _Bad(path, f"must be host:port, got {raw!r}")
    host, _, port = raw.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise _Bad(path, f"the port must be 0-65535 (0: any free one), got {port!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_settings(data: object, *, file: str = "<injector config>") -> InjectorSettings:
    """Validate already-loaded YAML data; raise :class:`InjectorConfigError`.

    One YAML file (the injector chart renders it into a ConfigMap). Its ``defaults`` section has the shape of
    the dlq-sidecar chart's values (under ``sidecar:`` its image, api, shutdown, resources and probes; under
    ``app:`` its port, socketName, pushPath and shutdownSeconds), so
    that one set of values means the same container in the chart and in an injected pod
    (tests/integration/test_injector_chart.py renders both and compares them)::

        listen: 0.0.0.0:8443
        tls: {certFile: /etc/tls/tls.crt, keyFile: /etc/tls/tls.key}
        defaults:
          configMap: dlq-sidecar           # the ConfigMap when a pod names none (dlq-sidecar.io/config)
          logLevel: ""                     # empty: the ConfigMap's logging.level decides
          app: {transport: tcp, port: 8080, socketName: app.sock, pushPath: /records, shutdownSeconds: 10}
          sidecar:
            image: {repository: dlq-sidecar, tag: 0.1.0, digest: "", pullPolicy: IfNotPresent}
            api: {port: 8787, observabilityPort: 8788, exposure: pod}
            shutdown: {drainTimeoutMs: 20000, marginSeconds: 5}
            resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 256Mi}}
            startupProbe: {enabled: true, periodSeconds: 2, failureThreshold: 30, timeoutSeconds: 2}
            livenessProbe: ...
            readinessProbe: ...
    """
    try:
        top = _mapping(data, "", ("listen", "tls", "defaults"))
        if not top:
            raise _Bad("", "the configuration is empty; expected listen, tls and defaults")
        host, port = _get(top, "", "listen", _listen, ("0.0.0.0", 8443))
        tls = _mapping(top.get("tls"), "tls", ("certFile", "keyFile"))
        cert = _get(tls, "tls", "certFile", _str(empty=False), "")
        key = _get(tls, "tls", "keyFile", _str(empty=False), "")
        if not cert or not key:
            raise _Bad("tls", "certFile and keyFile are required: the injector serves HTTPS only")
        defaults = _mapping(
            top.get("defaults"), "defaults", ("configMap", "logLevel", "app", "sidecar")
        )
        return InjectorSettings(
            tls_cert_file=cert,
            tls_key_file=key,
            listen_host=host,
            listen_port=port,
            config_map=_get(
                defaults, "defaults", "configMap", _str(pattern=DNS_SUBDOMAIN), "dlq-sidecar"
            ),
            log_level=_get(defaults, "defaults", "logLevel", _str(("", *LOG_LEVELS)), ""),
            app=_get(defaults, "defaults", "app", _app, AppDefaults()),
            sidecar=_get(defaults, "defaults", "sidecar", _sidecar, SidecarDefaults()),
        )
    except _Bad as exc:
        raise InjectorConfigError(exc.path, exc.reason, file=file) from None
