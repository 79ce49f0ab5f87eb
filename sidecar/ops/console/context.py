"""What every page of one console process shares: its settings, its Kafka clients' properties, the
access rules, the redrives, the templates, and the small caches of the topic list and summaries.

Imports: the standard library, Jinja2, `sidecar.kafka.tools` and `sidecar.ops`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import jinja2

from sidecar.ops.console.access import MAX_RUNNING_REDRIVES, Access
from sidecar.ops.console.redrive import Redrives
from sidecar.ops.dlq.payloads import PayloadReader

T = TypeVar("T")
CATALOG_TTL_S = 10.0


@dataclass(frozen=True, slots=True)
class Settings:
    bootstrap: str
    kafka: dict[str, str]
    prefix: str = "dlq."
    max_replays: int = 1


@dataclass(slots=True)
class Console:
    settings: Settings
    access: Access
    redrives: Redrives = field(default_factory=lambda: Redrives(MAX_RUNNING_REDRIVES))
    # Decodes values in the Confluent wire format (`--registry`), redacting `--redact`; None: bytes.
    payloads: PayloadReader | None = None
    templates: jinja2.Environment = field(
        default_factory=lambda: jinja2.Environment(
            loader=jinja2.PackageLoader("sidecar.ops.console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
    )
    _cache: dict[Any, tuple[float, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def props(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.settings.bootstrap, **self.settings.kafka}

    def cached(self, key: Any, ttl_s: float, make: Callable[[], T]) -> T:
        """`make()`'s value, reused for `ttl_s` (None: while `key` is the same)."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < ttl_s:
            value: T = hit[1]
            return value
        value = make()
        with self._lock:
            if len(self._cache) > 64:
                self._cache.clear()
            self._cache[key] = (now, value)
        return value

    def render(self, name: str, **values: Any) -> str:
        return self.templates.get_template(name).render(**values)


__all__ = ["CATALOG_TTL_S", "Console", "Settings"]
