"""The sidecar's configuration: the YAML schema, `${ENV}` substitution, validation and typed values.

This module owns SPEC §9 and the start-up half of §7 (a bad DLQ topic name is a configuration
error, not a runtime surprise). It turns one YAML file into a tree of frozen dataclasses, or raises
`ConfigError` naming the offending key's dotted path and the reason; the CLI prints
``str(error)`` and exits 2.

The schema is a table per section (`_Key`: YAML name, value kind, owning dataclass attribute).
Defaults live on the dataclasses only, and a key is required exactly when its attribute has no
default, so the two can never disagree. The seeds' dotted property names (``share.*``,
``errors.*``) are flat top-level keys, spelt verbatim; ``kafka:`` is passed through to librdkafka.

Typing rules are strict on purpose: a quoted ``"100"`` where an integer is expected, or ``true``
where an integer is expected, is an error rather than a guess. The one exception is a value that
is *entirely* an environment reference (``timeout.ms: ${APP_TIMEOUT_MS}``): environment variables
are always text, so such a value is converted to the expected type.

YAML is read with YAML 1.2 core-schema scalars, a little stricter: only ``true``/``false`` are
booleans, integers are decimal without leading zeros (``0123`` stays the string ``"0123"``), and
there are no sexagesimal numbers or timestamps; duplicate keys are rejected. YAML 1.1 would silently
turn ``0123`` into 83 or ``no`` into ``False``, which is how passwords and topic names get corrupted.
The loader has hard limits, so no file ends in a traceback: nesting at most `_MAX_DEPTH` levels,
integers of at most `_MAX_INT_DIGITS` digits, only the core schema's tags (``!!str``, ``!!int``,
``!!float``, ``!!bool``, ``!!null``, ``!!seq``, ``!!map``), and text that has a UTF-8 encoding
(YAML's ``"\ud800"`` escape and a non-UTF-8 environment variable give lone surrogates).

Imports: the standard library and PyYAML only. Nothing else in ``sidecar`` may be imported here;
every other module imports this one.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeAlias
from urllib.parse import urlsplit

import yaml

from sidecar.errors import SidecarError

__all__ = [
    "ApiConfig",
    "AppConfig",
    "AppMode",
    "Config",
    "ConfigError",
    "DeadLetterQueueConfig",
    "DeliveryConfig",
    "Engine",
    "ErrorsConfig",
    "ErrorsTolerance",
    "ListenAddress",
    "LogFormat",
    "LogLevel",
    "LoggingConfig",
    "MetricsConfig",
    "Ordering",
    "SourceConfig",
    "StatusAck",
    "TracingConfig",
    "TracingExporter",
    "is_loopback_host",
    "is_secret_header",
    "is_secret_kafka_property",
    "load_config",
    "parse_config",
    "parse_listen",
    "topic_name_error",
]


# --------------------------------------------------------------------------------------------
# Errors


class ConfigError(SidecarError):
    """A configuration file that cannot be used, with the key's dotted path and the reason.

    ``str(err)`` is ``"<file>: <path>: <reason>"``; `path` is e.g. ``app.timeout.ms``,
    ``source.topics[1]`` or, for YAML syntax errors, ``line 3, column 7`` (also in `line` and
    `column`, 1-based). `path` is ``""`` for problems with the file as a whole.
    """

    def __init__(
        self,
        path: str,
        reason: str,
        *,
        file: str = "<config>",
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason
        self.file = file
        self.line = line
        self.column = column

    def __str__(self) -> str:
        if self.path:
            return f"{self.file}: {self.path}: {self.reason}"
        return f"{self.file}: {self.reason}"


class _Invalid(Exception):
    """Raised inside the reader; turned into `ConfigError` (with the file name) at the boundary."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason


# --------------------------------------------------------------------------------------------
# Enumerations (string enums: they compare equal to, and format as, their YAML spelling)


class Engine(StrEnum):
    CONSUMER = "consumer"
    SHARE = "share"


class Ordering(StrEnum):
    KEY = "key"
    PARTITION = "partition"
    NONE = "none"


class AppMode(StrEnum):
    SINGLE = "single"
    BATCH = "batch"


class StatusAck(StrEnum):
    """What an HTTP status code means when the app's answer has no JSON ack (app.status.mapping)."""

    ACCEPT = "accept"
    RELEASE = "release"
    REJECT = "reject"


class ErrorsTolerance(StrEnum):
    ALL = "all"
    NONE = "none"


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class LogFormat(StrEnum):
    JSON = "json"
    LOGFMT = "logfmt"
    TEXT = "text"


class TracingExporter(StrEnum):
    NONE = "none"
    CONSOLE = "console"
    OTLP_HTTP = "otlp-http"
    OTLP_GRPC = "otlp-grpc"


# --------------------------------------------------------------------------------------------
# Small validators shared with other modules

ListenAddress: TypeAlias = tuple[Literal["tcp"], str, int] | tuple[Literal["unix"], str]

# sun_path is 108 bytes on Linux, one of which is the terminating NUL.
_UNIX_PATH_MAX_BYTES = 107
_TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]+")
_TOPIC_MAX_LEN = 249
_HOSTNAME = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
)


def topic_name_error(name: str) -> str | None:
    """Why `name` is not a legal Kafka topic name (Kafka's own `Topic.validate` rules), or None."""
    if not name:
        return "a topic name must not be empty"
    if name in (".", ".."):
        return "a topic name must not be '.' or '..'"
    if len(name) > _TOPIC_MAX_LEN:
        return f"a topic name is at most {_TOPIC_MAX_LEN} characters, got {len(name)}"
    if not _TOPIC_CHARS.fullmatch(name):
        return "a topic name may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _unix_path_error(path: str) -> str | None:
    if not path:
        return "a Unix socket path must not be empty"
    if "\x00" in path:
        return "a Unix socket path must not contain NUL"
    size = len(path.encode("utf-8", "surrogateescape"))
    if size > _UNIX_PATH_MAX_BYTES:
        return f"a Unix socket path is at most {_UNIX_PATH_MAX_BYTES} bytes, got {size}"
    return None


def _port_from(text: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise ValueError(f"the port must be a decimal number, got {text!r}")
    port = int(text)
    if port > 65535:
        raise ValueError(f"the port must be in 0..65535, got {port}")
    return port


def parse_listen(value: str) -> ListenAddress:
    """Parse ``host:port``, ``[v6]:port`` or ``unix:/path`` into ``("tcp", host, port)`` /
    ``("unix", path)``. Port 0 asks the OS for a free port. Raises ValueError with the reason."""
    if value.startswith("unix:"):
        path = value[len("unix:") :]
        problem = _unix_path_error(path)
        if problem:
            raise ValueError(problem)
        return ("unix", path)
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"expected '[address]:port' or 'unix:/path', got {value!r}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
        return ("tcp", host, _port_from(rest[1:]))
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected 'host:port', '[address]:port' or 'unix:/path', got {value!r}")
    if ":" in host:
        raise ValueError(f"write an IPv6 address in brackets, e.g. '[::1]:8787', got {value!r}")
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"{host!r} is not a valid host name or address")
    return ("tcp", host, _port_from(port_text))


# --------------------------------------------------------------------------------------------
# Configuration values. kw_only: a required field may follow a defaulted one, so each
# dataclass lists its fields in the same order as the YAML file.


def _empty_mapping() -> Mapping[Any, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceConfig:
    topics: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class AppConfig:
    """How to reach the application. `host`, `port`, `authority` and `path` are derived from
    `url` (the HTTP request target and Host header); over a Unix socket only `path` matters."""

    url: str
    unix_socket: str | None = None
    mode: AppMode = AppMode.SINGLE
    batch_max_records: int = 100
    batch_linger_ms: int = 5
    timeout_ms: int = 10000
    max_in_flight: int = 64
    connect_backoff_initial_ms: int = 100
    connect_backoff_max_ms: int = 5000
    status_mapping: Mapping[int, StatusAck] = field(default_factory=_empty_mapping)
    headers: Mapping[str, str] = field(default_factory=_empty_mapping)
    host: str = field(init=False)
    port: int = field(init=False)
    authority: str = field(init=False)
    path: str = field(init=False)

    def __post_init__(self) -> None:
        host, port, path = _split_app_url(self.url, self.unix_socket)
        authority = f"[{host}]" if ":" in host else host
        if port != 80:
            authority = f"{authority}:{port}"
        # Frozen dataclass: derived fields are set once, here, the documented way.
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)
        object.__setattr__(self, "authority", authority)
        object.__setattr__(self, "path", path)


# RFC 3986 origin-form: an absolute path and an optional query, of unreserved characters,
# sub-delims, ':', '@' (and '/', '?' in the query) and %XX escapes. Anything else (a space, a
# quote, '|', non-ASCII) would be refused by the request formatter or by the app's HTTP parser.
_PCHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})"
_REQUEST_TARGET = re.compile(rf"/(?:{_PCHAR}|/)*(?:\?(?:{_PCHAR}|[/?])*)?")


def _check_request_target(target: str) -> str:
    if not _REQUEST_TARGET.fullmatch(target):
        raise ValueError(
            f"{target!r} is not a valid HTTP request target: use visible ASCII without spaces, "
            "and percent-encode anything else (a space is %20)"
        )
    return target


def _split_app_url(url: str, unix_socket: str | None) -> tuple[str, int, str]:
    """(host, port, request target) of the app URL, or ValueError with the reason."""
    if not (url.isascii() and url.isprintable()) or " " in url:
        # Checked before urlsplit, which silently deletes TAB, CR and LF from a URL.
        raise ValueError(
            f"the URL must be visible ASCII without spaces, got {url!r}: an HTTP request target "
            "cannot carry anything else; percent-encode it (a space is %20)"
        )
    if unix_socket is not None and url.startswith("/"):
        if url.startswith("//"):
            raise ValueError(f"a request path must not start with '//', got {url!r}")
        target, _, fragment = url.partition("#")
        if fragment:
            raise ValueError("the URL must not have a #fragment")
        return "localhost", 80, _check_request_target(target)
    parts = urlsplit(url)
    if parts.scheme == "https":
        raise ValueError(
            "https is not supported: the app is reached over loopback or a Unix socket only; "
            "use http://"
        )
    if parts.scheme != "http":
        hint = " or a path such as '/records'" if unix_socket is not None else ""
        raise ValueError(f"expected an http://host:port/path URL{hint}, got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the URL must not contain user information")
    if parts.fragment:
        raise ValueError("the URL must not have a #fragment")
    host = parts.hostname
    if not host:
        raise ValueError(f"the URL has no host: {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"the URL has an invalid port: {url!r}") from None
    if unix_socket is None and not is_loopback_host(host):
        raise ValueError(
            f"the app must be on loopback (localhost, 127.0.0.1, ::1) or a Unix socket, got {host!r}"
        )
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    return host, 80 if port is None else port, _check_request_target(target)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryConfig:
    """Delivery counts, locks, retry backoff and the in-flight bounds (share.* and errors.retry.*)."""

    delivery_count_limit: int = 5
    lock_duration_ms: int = 30000
    partition_max_record_locks: int = 2000
    max_in_flight_records: int = 10000
    max_buffered_records_per_partition: int = 10000
    retry_delay_initial_ms: int = 1000
    retry_delay_max_ms: int = 60000
    retry_delay_multiplier: float = 2.0
    retry_delay_jitter: float = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterQueueConfig:
    """errors.deadletterqueue.*; `topic_name` may contain ``{topic}``; ``""`` means no DLQ."""

    topic_name: str = "dlq.{topic}"
    topic_name_prefix: str = "dlq."
    copy_record_enable: bool = False
    auto_create_enable: bool = True
    topic_partitions: int = 1
    topic_replication_factor: int = 1
    context_headers_enable: bool = True
    stacktrace_max_bytes: int = 8192
    transactional_enable: bool = False
    produce_retries_timeout_ms: int = 120000

    @property
    def enabled(self) -> bool:
        return self.topic_name != ""

    def topic_for(self, source_topic: str) -> str | None:
        """The DLQ topic for records of `source_topic`, or None when no DLQ is configured."""
        if not self.topic_name:
            return None
        return self.topic_name.replace("{topic}", source_topic)


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorsConfig:
    tolerance: ErrorsTolerance = ErrorsTolerance.ALL
    dlq: DeadLetterQueueConfig = field(default_factory=DeadLetterQueueConfig)
    log_enable: bool = False
    log_include_messages: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiConfig:
    """The two listeners (SPEC §6).

    ``listen`` is the control API (acks, status: it changes and reveals record state): loopback
    or a Unix socket only. ``observability_listen`` ("" = none) serves only the read-only
    ``/healthz``, ``/readyz`` and ``/metrics`` and may listen on the pod IP.
    """

    listen: str = "127.0.0.1:8787"
    token: str = ""
    observability_listen: str = ""
    max_connections: int = 1024
    max_request_bytes: int = 4 * 1024 * 1024
    max_ack_items: int = 10_000

    @property
    def address(self) -> ListenAddress:
        return parse_listen(self.listen)

    @property
    def observability_address(self) -> ListenAddress | None:
        return parse_listen(self.observability_listen) if self.observability_listen else None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoggingConfig:
    level: LogLevel = LogLevel.INFO
    format: LogFormat = LogFormat.JSON


@dataclass(frozen=True, slots=True, kw_only=True)
class TracingConfig:
    exporter: TracingExporter = TracingExporter.NONE
    service_name: str = "dlq-sidecar"


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsConfig:
    enable: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """The whole configuration. Compares by value; not hashable (it holds read-only mappings)."""

    kafka: Mapping[str, str | int | bool]
    source: SourceConfig
    engine: Engine = Engine.CONSUMER
    ordering: Ordering = Ordering.KEY
    app: AppConfig
    delivery: DeliveryConfig = field(default_factory=DeliveryConfig)
    errors: ErrorsConfig = field(default_factory=ErrorsConfig)
    offset_metadata_max_bytes: int = 4096
    commit_interval_ms: int = 1000
    shutdown_drain_timeout_ms: int = 20000
    commit_stall_timeout_ms: int = 300000
    api: ApiConfig = field(default_factory=ApiConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    tracing: TracingConfig = field(default_factory=TracingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    @property
    def group_id(self) -> str:
        return str(self.kafka["group.id"])

    def dlq_topic_for(self, source_topic: str) -> str | None:
        """The DLQ topic for records of `source_topic`, or None when no DLQ is configured."""
        return self.errors.dlq.topic_for(source_topic)

    def to_dict(self, *, mask_secrets: bool = True) -> dict[str, Any]:
        """The effective configuration in the YAML file's own shape and key names (JSON-safe).

        Secrets are masked by name (`is_secret_kafka_property`, `is_secret_header`), and the
        userinfo of any URL in a `kafka` value (``https://***@host``). Unmasked, the result
        parses back to an equal Config (unless a value holds a literal ``${``, which would be
        substituted again).
        """
        return _dump(self, mask_secrets=mask_secrets)


# --------------------------------------------------------------------------------------------
# Environment substitution


def _has_utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _encodable(text: str, path: str) -> str:
    """`text`, if it has a UTF-8 encoding: every value ends up in librdkafka, a header or a log line."""
    if not _has_utf8(text):
        raise _Invalid(
            path,
            "has no UTF-8 encoding: it holds a lone surrogate (from a YAML '\\uD800' escape or a "
            "non-UTF-8 environment variable)",
        )
    return text


# `$${` is the escape for a literal `${`; a `${` without its `}` is an error, not literal text.
_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_WHOLE_REFERENCE = re.compile(r"\$\{[^}]*\}")
_REFERENCE_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)


@dataclass(frozen=True, slots=True)
class _Context:
    env: Mapping[str, str]

    def expand(self, text: str, path: str) -> tuple[str, bool]:
        """`text` with `${NAME}` / `${NAME:-default}` substituted, and whether `text` was exactly
        one reference (then a typed key may convert it)."""
        if "$" not in text:
            return _encodable(text, path), False
        pieces: list[str] = []
        pos = 0
        for match in _REFERENCE.finditer(text):
            pieces.append(text[pos : match.start()])
            pos = match.end()
            token = match.group(0)
            if token == "$${":
                pieces.append("${")
                continue
            body = match.group(1)
            if body is None:
                raise _Invalid(path, "unterminated '${' (write '$${' for a literal '${')")
            pieces.append(self._resolve(body, path))
        pieces.append(text[pos:])
        return _encodable("".join(pieces), path), _WHOLE_REFERENCE.fullmatch(text) is not None

    def _resolve(self, body: str, path: str) -> str:
        match = _REFERENCE_BODY.fullmatch(body)
        if match is None:
            raise _Invalid(
                path, f"malformed reference '${{{body}}}': expected ${{NAME}} or ${{NAME:-default}}"
            )
        name, default = match.group(1), match.group(2)
        value = self.env.get(name)
        if default is not None:
            # Shell semantics of ':-': an empty variable also takes the default.
            return value if value else default
        if value is None:
            raise _Invalid(
                path,
                f"environment variable {name} is not set (use ${{{name}:-default}} for a default)",
            )
        return value


# --------------------------------------------------------------------------------------------
# Value kinds: each reads one raw YAML value at `path`, or raises _Invalid.


def _int_text(value: int) -> str:
    # str() of an int past 4,300 digits raises; no setting is near 20 digits anyway.
    return str(value) if -(10**20) < value < 10**20 else "an integer of more than 20 digits"


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int):
        return f"an integer ({_int_text(value)})"
    if isinstance(value, float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})" if len(value) <= 40 else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return type(value).__name__


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


class _Kind:
    def read(self, raw: object, path: str, ctx: _Context) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class _Int(_Kind):
    lo: int
    hi: int
    also: tuple[int, ...] = ()  # sentinel values outside the range, e.g. -1 = broker default

    def read(self, raw: object, path: str, ctx: _Context) -> int:
        value = raw
        if isinstance(raw, str):
            text, whole = ctx.expand(raw, path)
            if not whole:
                raise _Invalid(
                    path, f"expected an integer, got {_describe(raw)}; write numbers without quotes"
                )
            digits = text.strip()
            if not re.fullmatch(r"[-+]?[0-9]+", digits):
                raise _Invalid(path, f"expected an integer from the environment, got {text!r}")
            if len(digits) > 20:
                raise _Invalid(path, f"must be {self.describe()}, got {len(digits)} digits")
            value = int(digits)
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Invalid(path, f"expected an integer, got {_describe(value)}")
        if not (self.lo <= value <= self.hi or value in self.also):
            raise _Invalid(path, f"must be {self.describe()}, got {_int_text(value)}")
        return value

    def describe(self) -> str:
        extra = "".join(f" or {v}" for v in self.also)
        return f"an integer in {self.lo}..{self.hi}{extra}"


@dataclass(frozen=True, slots=True)
class _Float(_Kind):
    lo: float
    hi: float

    def read(self, raw: object, path: str, ctx: _Context) -> float:
        value = raw
        if isinstance(raw, str):
            text, whole = ctx.expand(raw, path)
            if not whole:
                raise _Invalid(
                    path, f"expected a number, got {_describe(raw)}; write numbers without quotes"
                )
            try:
                value = float(text)
            except ValueError:
                raise _Invalid(
                    path, f"expected a number from the environment, got {text!r}"
                ) from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Invalid(path, f"expected a number, got {_describe(value)}")
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            number = math.inf
        if not math.isfinite(number) or not self.lo <= number <= self.hi:
            shown = _int_text(value) if isinstance(value, int) else value
            raise _Invalid(path, f"must be {self.describe()}, got {shown}")
        return number

    def describe(self) -> str:
        return f"a number in {self.lo}..{self.hi}"


@dataclass(frozen=True, slots=True)
class _Bool(_Kind):
    def read(self, raw: object, path: str, ctx: _Context) -> bool:
        if isinstance(raw, str):
            text, whole = ctx.expand(raw, path)
            if whole and text.strip().lower() in ("true", "false"):
                return text.strip().lower() == "true"
            if whole:
                raise _Invalid(path, f"expected true or false from the environment, got {text!r}")
            raise _Invalid(path, f"expected true or false, got {_describe(raw)}")
        if not isinstance(raw, bool):
            raise _Invalid(path, f"expected true or false, got {_describe(raw)}")
        return raw

    def describe(self) -> str:
        return "true or false"


@dataclass(frozen=True, slots=True)
class _Str(_Kind):
    allow_empty: bool = True
    check: Callable[[str], str | None] | None = None  # returns a reason when the value is bad

    def read(self, raw: object, path: str, ctx: _Context) -> str:
        if not isinstance(raw, str):
            raise _Invalid(path, f"expected a string, got {_describe(raw)}")
        text, _ = ctx.expand(raw, path)
        if not text and not self.allow_empty:
            raise _Invalid(path, "must not be empty")
        if self.check is not None:
            problem = self.check(text)
            if problem:
                raise _Invalid(path, problem)
        return text

    def describe(self) -> str:
        return "a string"


@dataclass(frozen=True, slots=True)
class _Choice(_Kind):
    enum: type[StrEnum]

    def read(self, raw: object, path: str, ctx: _Context) -> StrEnum:
        text = _Str().read(raw, path, ctx)
        try:
            return self.enum(text)
        except ValueError:
            raise _Invalid(path, f"must be {self.describe()}, got {text!r}") from None

    def describe(self) -> str:
        return "one of " + ", ".join(member.value for member in self.enum)


@dataclass(frozen=True, slots=True)
class _Custom(_Kind):
    reader: Callable[[object, str, _Context], Any]
    text: str

    def read(self, raw: object, path: str, ctx: _Context) -> Any:
        return self.reader(raw, path, ctx)

    def describe(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class _Key:
    """One YAML key: its name, its kind, and the dataclass attribute that receives the value."""

    name: str
    kind: _Kind
    owner: type
    attr: str


@dataclass(frozen=True, slots=True)
class _Section(_Kind):
    """A nested mapping whose keys all belong to the dataclass `owner`."""

    owner: type
    keys: tuple[_Key, ...]
    derived_from: str | None = None  # the key whose value __post_init__ parses (may raise)

    def read(self, raw: object, path: str, ctx: _Context) -> Any:
        # An emptied section (`api:` with every child commented out) means "all defaults".
        values = _read_table({} if raw is None else raw, path, self.keys, ctx)
        try:
            return self.owner(**values.get(self.owner, {}))
        except ValueError as exc:
            if self.derived_from is None:
                raise
            raise _Invalid(_join(path, self.derived_from), str(exc)) from None

    def describe(self) -> str:
        return "a mapping"


def _mapping(raw: object, path: str) -> dict[str, object]:
    if not isinstance(raw, dict):
        raise _Invalid(path, f"expected a mapping, got {_describe(raw)}")
    for key in raw:
        if not isinstance(key, str):
            raise _Invalid(
                _join(path, _describe_key(key)), f"keys must be strings, got {_describe(key)}"
            )
        _encodable(key, _join(path, key))
    return raw


def _describe_key(key: object) -> str:
    return _int_text(key) if isinstance(key, int) and not isinstance(key, bool) else str(key)


def _required(owner: type, attr: str) -> bool:
    spec = next(f for f in dataclasses.fields(owner) if f.name == attr)
    return spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING


def _read_table(
    raw: object, path: str, keys: tuple[_Key, ...], ctx: _Context
) -> dict[type, dict[str, Any]]:
    """Read a mapping against a key table: unknown keys first, then each key in table order."""
    data = _mapping(raw, path)
    known = {key.name: key for key in keys}
    for name in data:
        if name not in known:
            raise _Invalid(_join(path, name), _unknown_key_reason(name, path, keys))
    values: dict[type, dict[str, Any]] = {}
    for key in keys:
        key_path = _join(path, key.name)
        if key.name in data:
            values.setdefault(key.owner, {})[key.attr] = key.kind.read(
                data[key.name], key_path, ctx
            )
        elif _required(key.owner, key.attr):
            raise _Invalid(key_path, f"required key is missing ({key.kind.describe()})")
    return values


def _unknown_key_reason(name: str, path: str, keys: tuple[_Key, ...]) -> str:
    names = [key.name for key in keys]
    if not path:
        # Two frequent mistakes: nesting the seeds' flat names (errors: {tolerance: ...}), and
        # writing a section's key flat (app.timeout.ms: ...).
        flat = [n for n in names if n.startswith(name + ".")]
        if flat:
            return f"unknown key; the {name}.* properties are written flat, e.g. '{flat[0]}'"
        for key in keys:
            if isinstance(key.kind, _Section) and name.startswith(key.name + "."):
                rest = name[len(key.name) + 1 :]
                if any(k.name == rest for k in key.kind.keys):
                    return f"unknown key; write it as '{rest}' under '{key.name}:'"
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    if close:
        return f"unknown key; did you mean '{close[0]}'?"
    where = f"'{path}'" if path else "the top level"
    return f"unknown key; the keys allowed at {where} are: {', '.join(names)}"


# --------------------------------------------------------------------------------------------
# Custom readers


# Properties the sidecar must own: it stores offsets and commits them itself, only past records
# that are done (SPEC §3); librdkafka's auto-commit would commit records still in flight.
_KAFKA_OWNED = {
    "enable.auto.commit": "the sidecar commits offsets itself, only past records that are done",
    "enable.auto.offset.store": "the sidecar stores offsets itself, only for records that are done",
}
_KAFKA_REQUIRED = ("bootstrap.servers", "group.id")


def _read_kafka(raw: object, path: str, ctx: _Context) -> Mapping[str, str | int | bool]:
    data = _mapping(raw, path)
    sidecar_names = {key.name for key in _TOP_KEYS}
    out: dict[str, str | int | bool] = {}
    for name, value in data.items():
        key_path = _join(path, name)
        if name in _KAFKA_OWNED:
            raise _Invalid(key_path, f"must not be set: {_KAFKA_OWNED[name]}")
        if name in sidecar_names:
            raise _Invalid(
                key_path,
                "this is a sidecar setting, not a Kafka client property; move it to the top level",
            )
        if isinstance(value, str):
            out[name] = ctx.expand(value, key_path)[0]
        elif isinstance(value, bool):
            out[name] = value
        elif isinstance(value, int):
            if not -(2**63) <= value < 2**63:
                raise _Invalid(key_path, f"expected a 64-bit integer, got {_describe(value)}")
            out[name] = value
        else:
            raise _Invalid(
                key_path, f"expected a string, integer or boolean, got {_describe(value)}"
            )
    for name in _KAFKA_REQUIRED:
        value = out.get(name)
        if value is None:
            raise _Invalid(_join(path, name), "required key is missing (a string)")
        if not isinstance(value, str) or not value.strip():
            raise _Invalid(
                _join(path, name), f"expected a non-empty string, got {_describe(value)}"
            )
    return MappingProxyType(out)


def _read_topics(raw: object, path: str, ctx: _Context) -> tuple[str, ...]:
    if not isinstance(raw, list):
        raise _Invalid(path, f"expected a list of topic names, got {_describe(raw)}")
    if not raw:
        raise _Invalid(path, "must list at least one topic")
    topics: list[str] = []
    for index, item in enumerate(raw):
        item_path = f"{path}[{index}]"
        name = _Str(check=topic_name_error).read(item, item_path, ctx)
        if name in topics:
            raise _Invalid(item_path, f"topic {name!r} is listed twice")
        topics.append(name)
    return tuple(topics)


def _read_unix_socket(raw: object, path: str, ctx: _Context) -> str | None:
    if raw is None:
        return None
    return _Str(check=_unix_path_error).read(raw, path, ctx)


def _read_status_mapping(raw: object, path: str, ctx: _Context) -> Mapping[int, StatusAck]:
    data = raw if raw is not None else {}
    if not isinstance(data, dict):
        raise _Invalid(path, f"expected a mapping of status code to ack, got {_describe(data)}")
    out: dict[int, StatusAck] = {}
    for key, value in data.items():
        key_path = _join(path, _describe_key(key))
        if isinstance(key, str) and key.isascii() and key.isdigit():
            if len(key) > 3:
                raise _Invalid(
                    key_path, f"an HTTP status code is in 100..599, got {len(key)} digits"
                )
            code = int(key)
        elif isinstance(key, int) and not isinstance(key, bool):
            code = key
        else:
            raise _Invalid(key_path, f"expected an HTTP status code as key, got {_describe(key)}")
        if not 100 <= code <= 599:
            raise _Invalid(key_path, f"an HTTP status code is in 100..599, got {_int_text(code)}")
        if code in out:
            raise _Invalid(key_path, f"status {code} is mapped twice")
        out[code] = StatusAck(_Choice(StatusAck).read(value, key_path, ctx))
    return MappingProxyType(out)


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Framing and routing headers are the HTTP client's business; a static override would corrupt
# the request or the keep-alive connection.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te"}
)


def _read_headers(raw: object, path: str, ctx: _Context) -> Mapping[str, str]:
    data = _mapping({} if raw is None else raw, path)
    out: dict[str, str] = {}
    seen: set[str] = set()
    for name, value in data.items():
        key_path = _join(path, name)
        if not _TOKEN.fullmatch(name):
            raise _Invalid(key_path, "not a valid HTTP header name")
        if name.lower() in _RESERVED_HEADERS:
            raise _Invalid(key_path, "this header is set by the sidecar's HTTP client")
        if name.lower() in seen:
            raise _Invalid(key_path, "header is listed twice (names are case-insensitive)")
        seen.add(name.lower())
        text = _Str().read(value, key_path, ctx)
        # The rule of the request formatter (sidecar/wire.py), checked here so a bad value is a
        # start-up error, not a failure at the first delivery. The value is never echoed: it may
        # be a secret.
        if not (text.isascii() and text.isprintable()):
            raise _Invalid(
                key_path,
                "a header value must be visible ASCII and spaces: no TAB, CR, LF or other control "
                "characters, no non-ASCII text",
            )
        out[name] = text
    return MappingProxyType(out)


def _check_listen(value: str) -> str | None:
    try:
        parse_listen(value)
    except ValueError as exc:
        return str(exc)
    return None


def _check_optional_listen(value: str) -> str | None:
    return _check_listen(value) if value else None


_API_TOKEN_MIN_CHARS = 16


def _check_api_token(value: str) -> str | None:
    if not value:
        return None  # no token
    if not all("!" <= ch <= "~" for ch in value):
        # A Secret made with `echo token | kubectl create secret ...` ends in a newline.
        return "must be printable ASCII without spaces or line breaks"
    if len(value) < _API_TOKEN_MIN_CHARS:
        return f"must be at least {_API_TOKEN_MIN_CHARS} characters (use 32 random bytes, hex)"
    return None


# --------------------------------------------------------------------------------------------
# The schema

_MS_HOUR = 3_600_000
_MS_DAY = 86_400_000

_SOURCE_KEYS = (
    _Key("topics", _Custom(_read_topics, "a list of topic names"), SourceConfig, "topics"),
)

_APP_KEYS = (
    _Key("url", _Str(allow_empty=False), AppConfig, "url"),
    _Key("unix_socket", _Custom(_read_unix_socket, "a path or null"), AppConfig, "unix_socket"),
    _Key("mode", _Choice(AppMode), AppConfig, "mode"),
    _Key("batch.max.records", _Int(1, 10_000), AppConfig, "batch_max_records"),
    _Key("batch.linger.ms", _Int(0, 10_000), AppConfig, "batch_linger_ms"),
    _Key("timeout.ms", _Int(1, _MS_HOUR), AppConfig, "timeout_ms"),
    _Key("max.in.flight", _Int(1, 4096), AppConfig, "max_in_flight"),
    _Key("connect.backoff.initial.ms", _Int(1, 60_000), AppConfig, "connect_backoff_initial_ms"),
    _Key("connect.backoff.max.ms", _Int(1, _MS_HOUR), AppConfig, "connect_backoff_max_ms"),
    _Key(
        "status.mapping",
        _Custom(_read_status_mapping, "a mapping of status code to accept|release|reject"),
        AppConfig,
        "status_mapping",
    ),
    _Key(
        "headers", _Custom(_read_headers, "a mapping of header name to value"), AppConfig, "headers"
    ),
)

_API_KEYS = (
    _Key("listen", _Str(allow_empty=False, check=_check_listen), ApiConfig, "listen"),
    _Key("token", _Str(check=_check_api_token), ApiConfig, "token"),
    _Key(
        "observability.listen",
        _Str(check=_check_optional_listen),
        ApiConfig,
        "observability_listen",
    ),
    _Key("max.connections", _Int(1, 65_536), ApiConfig, "max_connections"),
    _Key("max.request.bytes", _Int(1024, 64 * 1024 * 1024), ApiConfig, "max_request_bytes"),
    _Key("max.ack.items", _Int(1, 100_000), ApiConfig, "max_ack_items"),
)
_LOGGING_KEYS = (
    _Key("level", _Choice(LogLevel), LoggingConfig, "level"),
    _Key("format", _Choice(LogFormat), LoggingConfig, "format"),
)
_TRACING_KEYS = (
    _Key("exporter", _Choice(TracingExporter), TracingConfig, "exporter"),
    _Key("service.name", _Str(allow_empty=False), TracingConfig, "service_name"),
)
_METRICS_KEYS = (_Key("enable", _Bool(), MetricsConfig, "enable"),)

_D, _Q, _E = DeliveryConfig, DeadLetterQueueConfig, ErrorsConfig
_DLQ = "errors.deadletterqueue."

_TOP_KEYS: tuple[_Key, ...] = (
    _Key("kafka", _Custom(_read_kafka, "a mapping of librdkafka properties"), Config, "kafka"),
    _Key("source", _Section(SourceConfig, _SOURCE_KEYS), Config, "source"),
    _Key("engine", _Choice(Engine), Config, "engine"),
    _Key("ordering", _Choice(Ordering), Config, "ordering"),
    _Key("app", _Section(AppConfig, _APP_KEYS, derived_from="url"), Config, "app"),
    _Key("share.delivery.count.limit", _Int(1, 100), _D, "delivery_count_limit"),
    _Key("share.record.lock.duration.ms", _Int(1000, _MS_HOUR), _D, "lock_duration_ms"),
    _Key("share.partition.max.record.locks", _Int(1, 100_000), _D, "partition_max_record_locks"),
    _Key("max.in.flight.records", _Int(1, 1_000_000), _D, "max_in_flight_records"),
    _Key(
        "max.buffered.records.per.partition",
        _Int(1, 1_000_000),
        _D,
        "max_buffered_records_per_partition",
    ),
    _Key("errors.tolerance", _Choice(ErrorsTolerance), _E, "tolerance"),
    _Key("errors.retry.delay.initial.ms", _Int(0, _MS_HOUR), _D, "retry_delay_initial_ms"),
    _Key("errors.retry.delay.max.ms", _Int(0, _MS_DAY), _D, "retry_delay_max_ms"),
    _Key("errors.retry.delay.multiplier", _Float(1.0, 100.0), _D, "retry_delay_multiplier"),
    _Key("errors.retry.delay.jitter", _Float(0.0, 1.0), _D, "retry_delay_jitter"),
    _Key(_DLQ + "topic.name", _Str(), _Q, "topic_name"),
    _Key(_DLQ + "topic.name.prefix", _Str(), _Q, "topic_name_prefix"),
    _Key(_DLQ + "copy.record.enable", _Bool(), _Q, "copy_record_enable"),
    _Key(_DLQ + "auto.create.enable", _Bool(), _Q, "auto_create_enable"),
    _Key(_DLQ + "topic.partitions", _Int(1, 100_000, also=(-1,)), _Q, "topic_partitions"),
    _Key(
        _DLQ + "topic.replication.factor",
        _Int(1, 32_767, also=(-1,)),
        _Q,
        "topic_replication_factor",
    ),
    _Key(_DLQ + "context.headers.enable", _Bool(), _Q, "context_headers_enable"),
    _Key(_DLQ + "stacktrace.max.bytes", _Int(0, 1_048_576), _Q, "stacktrace_max_bytes"),
    _Key(_DLQ + "transactional.enable", _Bool(), _Q, "transactional_enable"),
    _Key(_DLQ + "produce.retries.timeout.ms", _Int(0, _MS_DAY), _Q, "produce_retries_timeout_ms"),
    _Key("errors.log.enable", _Bool(), _E, "log_enable"),
    _Key("errors.log.include.messages", _Bool(), _E, "log_include_messages"),
    _Key("offset.metadata.max.bytes", _Int(128, 1_048_576), Config, "offset_metadata_max_bytes"),
    _Key("commit.interval.ms", _Int(1, _MS_HOUR), Config, "commit_interval_ms"),
    _Key("shutdown.drain.timeout.ms", _Int(0, _MS_HOUR), Config, "shutdown_drain_timeout_ms"),
    _Key("commit.stall.timeout.ms", _Int(0, _MS_DAY), Config, "commit_stall_timeout_ms"),
    _Key("api", _Section(ApiConfig, _API_KEYS), Config, "api"),
    _Key("logging", _Section(LoggingConfig, _LOGGING_KEYS), Config, "logging"),
    _Key("tracing", _Section(TracingConfig, _TRACING_KEYS), Config, "tracing"),
    _Key("metrics", _Section(MetricsConfig, _METRICS_KEYS), Config, "metrics"),
)


# --------------------------------------------------------------------------------------------
# Cross-key rules (after every key has its own type and range)


def _check(config: Config) -> None:
    app, delivery = config.app, config.delivery
    if app.timeout_ms >= delivery.lock_duration_ms:
        # The lock bounds the whole attempt; a request that may outlive it would be answered
        # after the record was already released to someone else.
        raise _Invalid(
            "app.timeout.ms",
            f"must be less than share.record.lock.duration.ms ({delivery.lock_duration_ms}), "
            f"got {app.timeout_ms}",
        )
    if app.connect_backoff_max_ms < app.connect_backoff_initial_ms:
        raise _Invalid(
            "app.connect.backoff.max.ms",
            f"must be at least app.connect.backoff.initial.ms ({app.connect_backoff_initial_ms}), "
            f"got {app.connect_backoff_max_ms}",
        )
    if delivery.retry_delay_max_ms < delivery.retry_delay_initial_ms:
        raise _Invalid(
            "errors.retry.delay.max.ms",
            f"must be at least errors.retry.delay.initial.ms ({delivery.retry_delay_initial_ms}), "
            f"got {delivery.retry_delay_max_ms}",
        )
    if config.errors.dlq.transactional_enable and config.engine is Engine.SHARE:
        raise _Invalid(
            _DLQ + "transactional.enable",
            "needs engine: consumer (share groups cannot commit acknowledgements in a transaction)",
        )
    _check_api_listeners(config.api)
    _check_dlq_topic(config)


def _check_api_listeners(api: ApiConfig) -> None:
    control = api.address
    if control[0] == "tcp" and not is_loopback_host(control[1]):
        # The control API changes record state (acks) and reveals it (status): never on a pod IP.
        raise _Invalid(
            "api.listen",
            f"{control[1]!r} is not a loopback address: the control API listens on loopback or a "
            "Unix socket only; serve /healthz, /readyz and /metrics beyond this host with "
            "api.observability.listen",
        )
    observability = api.observability_address
    if observability is None:
        return
    if observability[0] == "unix" and control[0] == "unix" and observability[1] == control[1]:
        raise _Invalid("api.observability.listen", "must not be the control API's socket")
    if observability[0] == "tcp" and control[0] == "tcp" and observability[2] == control[2] != 0:
        raise _Invalid(
            "api.observability.listen", f"must not use the control API's port {control[2]}"
        )


def _check_dlq_topic(config: Config) -> None:
    dlq = config.errors.dlq
    if not dlq.enabled:
        return
    path = _DLQ + "topic.name"
    sources = set(config.source.topics)
    for topic in config.source.topics:
        name = dlq.topic_name.replace("{topic}", topic)
        shown = repr(name) if name == dlq.topic_name else f"{name!r} (for source topic {topic!r})"
        if name.startswith("__"):
            raise _Invalid(path, f"{shown} must not start with '__' (reserved for Kafka internals)")
        if dlq.topic_name_prefix and not name.startswith(dlq.topic_name_prefix):
            raise _Invalid(
                path,
                f"{shown} must start with {dlq.topic_name_prefix!r} ({_DLQ}topic.name.prefix)",
            )
        if name in sources:
            raise _Invalid(path, f"{shown} is a source topic; a DLQ must not feed its own source")
        problem = topic_name_error(name)
        if problem:
            if "{" in name or "}" in name:
                problem += " (only '{topic}' is substituted)"
            raise _Invalid(path, f"{shown} is not a valid topic name: {problem}")


# --------------------------------------------------------------------------------------------
# Entry points


def parse_config(
    data: object, env: Mapping[str, str] | None = None, *, file: str = "<config>"
) -> Config:
    """Validate already-loaded YAML data (`env` defaults to `os.environ`); raise ConfigError."""
    ctx = _Context(os.environ if env is None else env)
    try:
        if data is None:
            raise _Invalid("", "the configuration is empty; expected a mapping of keys")
        values = _read_table(data, "", _TOP_KEYS, ctx)
        errors = values.get(ErrorsConfig, {})
        errors["dlq"] = DeadLetterQueueConfig(**values.get(DeadLetterQueueConfig, {}))
        top = values.get(Config, {})
        top["delivery"] = DeliveryConfig(**values.get(DeliveryConfig, {}))
        top["errors"] = ErrorsConfig(**errors)
        config = Config(**top)
        _check(config)
    except _Invalid as exc:
        raise ConfigError(exc.path, exc.reason, file=file) from None
    return config


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> Config:
    """Read, substitute and validate the YAML file at `path`; raise ConfigError."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("", f"cannot read the file: {exc.strerror or exc}", file=file) from None
    except UnicodeDecodeError as exc:
        raise ConfigError("", f"the file is not UTF-8: {exc.reason}", file=file) from None
    try:
        data = yaml.load(text, Loader=_Loader)  # _Loader derives from SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = "; ".join(part for part in (exc.context, exc.problem) if part) or "invalid YAML"
        if mark is None:
            raise ConfigError("", f"invalid YAML: {reason}", file=file) from None
        line, column = mark.line + 1, mark.column + 1
        raise ConfigError(
            f"line {line}, column {column}",
            f"invalid YAML: {reason}",
            file=file,
            line=line,
            column=column,
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError("", f"invalid YAML: {exc}", file=file) from None
    except RecursionError:  # _MAX_DEPTH should make this unreachable; never a traceback
        raise ConfigError("", "invalid YAML: nested too deeply", file=file) from None
    return parse_config(data, env, file=file)


# --------------------------------------------------------------------------------------------
# YAML loading with core-schema scalars and duplicate-key detection


# A configuration is four levels deep; PyYAML's composer recurses once per level and would end in a
# RecursionError (a traceback) near a thousand.
_MAX_DEPTH = 64
# CPython's limit for int <-> str conversion (sys.get_int_max_str_digits); fixed here so the error
# does not depend on the interpreter's setting.
_MAX_INT_DIGITS = 4300
_INT_TEXT = re.compile(r"[-+]?[0-9]+")


class _Loader(yaml.SafeLoader):
    yaml_implicit_resolvers: dict[Any, Any] = {}
    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > _MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(
                    None, None, f"nested more than {_MAX_DEPTH} levels deep", mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(
                None, None, f"expected a mapping, found a {_node_kind(node)}", node.start_mark
            )
        seen: set[object] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable key: let the base class report it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"duplicate key {key!r}",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _node_kind(node: yaml.Node) -> str:
    return str(getattr(node, "id", "node"))


def _scalar_node(node: yaml.Node, tag: str) -> yaml.ScalarNode:
    if not isinstance(node, yaml.ScalarNode):
        raise yaml.constructor.ConstructorError(
            None, None, f"{tag} needs a scalar, found a {_node_kind(node)}", node.start_mark
        )
    return node


def _scalar_text(loader: yaml.SafeLoader, node: yaml.Node, tag: str) -> str:
    return str(loader.construct_scalar(_scalar_node(node, tag)))


def _bad_scalar(node: yaml.Node, reason: str) -> yaml.constructor.ConstructorError:
    return yaml.constructor.ConstructorError(None, None, reason, node.start_mark)


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = _scalar_text(loader, node, "!!int")
    if not _INT_TEXT.fullmatch(text):
        raise _bad_scalar(node, f"!!int needs a decimal integer, got {text[:40]!r}")
    digits = len(text.lstrip("+-"))
    try:
        if digits <= _MAX_INT_DIGITS:
            return int(text)
    except ValueError:  # the interpreter's own limit is lower
        pass
    raise _bad_scalar(node, f"an integer of {digits} digits is too large for any setting")


# YAML 1.2 core-schema floats (and integers, which a `!!float` tag may carry).
_FLOAT_TEXT = re.compile(
    r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)"
)


def _construct_float(loader: yaml.SafeLoader, node: yaml.Node) -> float:
    scalar = _scalar_node(node, "!!float")
    text = str(loader.construct_scalar(scalar))
    # Checked before PyYAML's constructor, which raises IndexError on an empty `!!float`.
    if not _FLOAT_TEXT.fullmatch(text):
        raise _bad_scalar(node, f"!!float needs a number, got {text[:40]!r}")
    return float(loader.construct_yaml_float(scalar))


def _construct_bool(loader: yaml.SafeLoader, node: yaml.Node) -> bool:
    text = _scalar_text(loader, node, "!!bool")
    if text.lower() not in ("true", "false"):
        raise _bad_scalar(node, f"!!bool needs true or false, got {text[:40]!r}")
    return text.lower() == "true"


# The core schema's tags only: no !!binary, !!timestamp, !!set, !!omap or !!pairs (a configuration
# has no use for them, and PyYAML's constructors for them raise plain Python errors on bad input).
# A tag without a constructor falls to the `None` entry: a ConstructorError naming the tag.
_CORE_TAGS = tuple(
    f"tag:yaml.org,2002:{name}" for name in ("null", "str", "seq", "map", "bool", "int", "float")
)


def _add_core_schema(loader: type[yaml.SafeLoader]) -> None:
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool",
        re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"),
    )
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]
    )
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789")
    )
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(
            r"^(?:[-+]?(?:\.[0-9]+|[0-9]+\.[0-9]*)(?:[eE][-+]?[0-9]+)?"
            r"|[-+]?[0-9]+[eE][-+]?[0-9]+"
            r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
        ),
        list("-+.0123456789"),
    )
    loader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^<<$"), ["<"])
    loader.yaml_constructors = {
        tag: fn
        for tag, fn in yaml.SafeLoader.yaml_constructors.items()
        if tag is None or tag in _CORE_TAGS
    }
    # PyYAML's own int constructor reads a leading 0 as octal and accepts 0x/0b/1_000/1:30.
    loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
    loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
    loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)


_add_core_schema(_Loader)


# --------------------------------------------------------------------------------------------
# Dumping the effective configuration

# Secret masking (/v1/status, check-config --print) goes by the name, case-insensitively.
# librdkafka property names are dot-separated words: a word that contains one of these marks a
# secret (sasl.password, ssl.key.pem, ssl.keystore.location, sasl.jaas.config, x.apikey, ...).
# The word "oauthbearer" is a mechanism's name and does not count, so sasl.oauthbearer.method and
# .scope stay visible; "session" is not a marker here: session.timeout.ms is a timeout.
_SECRET_KAFKA_WORDS = (
    "auth",
    "token",
    "secret",
    "key",
    "pass",
    "pwd",
    "credential",
    "signature",
    "cookie",
    "jaas",
    "private",
)
# Secrets whose name says nothing of it: the principal/extension key=value lists of OAUTHBEARER.
_SECRET_KAFKA_NAMES = frozenset({"sasl.oauthbearer.config", "sasl.oauthbearer.extensions"})
# A header name that contains one of these anywhere (X-Auth, X-MyToken, X-Api-Key, Set-Cookie).
_SECRET_HEADER_PARTS = (
    "auth",
    "token",
    "secret",
    "key",
    "pass",
    "pwd",
    "credential",
    "signature",
    "cookie",
    "session",
    "csrf",
    "xsrf",
    "jwt",
    "private",
)
_MASK = "***"
# The userinfo of any URL in a value (https://user:pass@host): from '://' to the authority's last
# '@' (a password may hold an unescaped '@').
_URL_USERINFO = re.compile(r"(://)[^/?#\s]*@")


def is_secret_kafka_property(name: str) -> bool:
    """True when the librdkafka property `name` holds a secret (its value is masked)."""
    lowered = name.lower()
    if lowered in _SECRET_KAFKA_NAMES:
        return True
    return any(
        marker in word
        for word in re.split(r"[._-]", lowered)
        if word != "oauthbearer"
        for marker in _SECRET_KAFKA_WORDS
    )


def is_secret_header(name: str) -> bool:
    """True when the `app.headers` entry `name` holds a secret (its value is masked)."""
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_HEADER_PARTS)


def _mask_userinfo(text: str) -> str:
    return _URL_USERINFO.sub(rf"\g<1>{_MASK}@", text)


def _masked_kafka(name: str, value: object) -> object:
    if isinstance(value, str) and name.lower().endswith(".url"):
        # An endpoint is worth seeing; only its credentials are secret (token.endpoint.url).
        return _mask_userinfo(value)
    if is_secret_kafka_property(name):
        return _MASK
    return _mask_userinfo(value) if isinstance(value, str) else value


def _plain(value: object) -> Any:
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def _dump_table(owners: Mapping[type, object], keys: tuple[_Key, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in keys:
        out[key.name] = _plain(getattr(owners[key.owner], key.attr))
    return out


def _dump(config: Config, *, mask_secrets: bool) -> dict[str, Any]:
    owners: dict[type, object] = {
        Config: config,
        DeliveryConfig: config.delivery,
        ErrorsConfig: config.errors,
        DeadLetterQueueConfig: config.errors.dlq,
        SourceConfig: config.source,
        AppConfig: config.app,
        ApiConfig: config.api,
        LoggingConfig: config.logging,
        TracingConfig: config.tracing,
        MetricsConfig: config.metrics,
    }
    out: dict[str, Any] = {}
    for key in _TOP_KEYS:
        if isinstance(key.kind, _Section):
            out[key.name] = _dump_table(owners, key.kind.keys)
        else:
            out[key.name] = _plain(getattr(owners[key.owner], key.attr))
    if mask_secrets:
        out["kafka"] = {name: _masked_kafka(name, value) for name, value in out["kafka"].items()}
        out["app"]["headers"] = {
            name: _MASK if is_secret_header(name) else value
            for name, value in out["app"]["headers"].items()
        }
        if out["api"]["token"]:
            out["api"]["token"] = _MASK
    return out
