"""Retry tiers: `errors.retry.tiers`, `errors.retry.tier.threshold.ms`, `errors.retry.tier.topic.name`.

Owns the tiers' values (`RetryTiersConfig`: which tier a delay goes to, a tier's label and topic), the
reader of the delay list and the start-up check of the tier topics' names (docs/retry-tiers.md).

Imports: the standard library and the `sidecar.config` modules errors, environment and syntax only
(values imports this module for the dataclass).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sidecar.config.environment import ReadContext
from sidecar.config.errors import Invalid
from sidecar.config.syntax import topic_name_error

__all__ = ["MAX_TIERS", "RetryTiersConfig", "check_tier_topics", "duration_label", "read_tiers"]

#: At most this many tiers (each is a topic per source topic, and one more partition set to read).
MAX_TIERS = 16
#: The shortest and longest tier delay.
MIN_TIER_MS = 100
MAX_TIER_MS = 30 * 86_400_000

_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1))
_UNIT_MS = dict(_UNITS)
_DURATION = re.compile(r"([0-9]{1,9})\s*(ms|s|m|h|d)")


def duration_label(ms: int) -> str:
    """The shortest exact text of a duration: 1d, 6h, 10m, 3s, 1500ms (a tier's `{tier}`)."""
    for unit, size in _UNITS:
        if ms % size == 0:
            return f"{ms // size}{unit}"
    raise AssertionError("every integer is a whole number of milliseconds")


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryTiersConfig:
    """The retry tiers; `delays_ms` strictly increasing, empty = none (every delay in memory)."""

    delays_ms: tuple[int, ...] = ()
    threshold_ms: int = 60_000
    topic_name: str = "dlq.{topic}.retry.{tier}"

    @property
    def enabled(self) -> bool:
        return bool(self.delays_ms)

    def label(self, tier: int) -> str:
        return duration_label(self.delays_ms[tier])

    def topic(self, source_topic: str, tier: int) -> str:
        """The topic of `tier` (an index into `delays_ms`) for records of `source_topic`."""
        return self.topic_name.replace("{topic}", source_topic).replace("{tier}", self.label(tier))

    def tier_for(self, delay_ms: int) -> int | None:
        """The tier a release of `delay_ms` goes to: the smallest that covers it (the longest for
        a delay beyond them all), or None when the delay stays in memory (at most the threshold)."""
        if not self.delays_ms or delay_ms <= self.threshold_ms:
            return None
        for tier, tier_ms in enumerate(self.delays_ms):
            if tier_ms >= delay_ms:
                return tier
        return len(self.delays_ms) - 1


def _read_duration(raw: object, path: str, ctx: ReadContext) -> int:
    if isinstance(raw, bool) or not isinstance(raw, (int, str)):
        raise Invalid(path, f"expected a duration such as 10m, 1h or 1d, got {type(raw).__name__}")
    if isinstance(raw, int):
        ms = raw
    else:
        text, _ = ctx.expand(raw, path)
        match = _DURATION.fullmatch(text.strip())
        if match is None:
            raise Invalid(
                path,
                f"expected a duration: digits and one of ms, s, m, h, d (e.g. 10m), got {text!r}",
            )
        ms = int(match.group(1)) * _UNIT_MS[match.group(2)]
    if not MIN_TIER_MS <= ms <= MAX_TIER_MS:
        raise Invalid(
            path,
            f"must be between {duration_label(MIN_TIER_MS)} and {duration_label(MAX_TIER_MS)}, "
            f"got {duration_label(ms) if ms > 0 else ms}",
        )
    return ms


def read_tiers(raw: object, path: str, ctx: ReadContext) -> tuple[int, ...]:
    """`errors.retry.tiers`: a list of durations (`1m`, `10m`, `1h`; a bare integer is ms), each
    longer than the one before."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise Invalid(path, f"expected a list of durations (e.g. [1m, 10m, 1h]), got {raw!r}")
    if len(raw) > MAX_TIERS:
        raise Invalid(path, f"at most {MAX_TIERS} tiers, got {len(raw)}")
    out: list[int] = []
    for index, item in enumerate(raw):
        item_path = f"{path}[{index}]"
        ms = _read_duration(item, item_path, ctx)
        if out and ms <= out[-1]:
            raise Invalid(
                item_path,
                f"each tier must be longer than the one before ({duration_label(out[-1])}), "
                f"got {duration_label(ms)}",
            )
        out.append(ms)
    return tuple(out)


def check_tier_topics(
    tiers: RetryTiersConfig,
    source_topics: Iterable[str],
    *,
    prefix: str,
    dlq_topic_for: Callable[[str], str | None],
    prefix_key: str,
) -> None:
    """The cross-key rules of the tiers: the threshold below the longest tier, and every tier
    topic a valid name under the DLQ prefix rule, neither a source topic nor a DLQ topic."""
    if not tiers.enabled:
        return
    if tiers.threshold_ms >= tiers.delays_ms[-1]:
        raise Invalid(
            "errors.retry.tier.threshold.ms",
            f"must be below the longest tier ({duration_label(tiers.delays_ms[-1])} = "
            f"{tiers.delays_ms[-1]} ms), got {tiers.threshold_ms}: no release would reach a tier",
        )
    path = "errors.retry.tier.topic.name"
    if "{tier}" not in tiers.topic_name:
        raise Invalid(path, f"{tiers.topic_name!r} must contain '{{tier}}' (one topic per tier)")
    sources = list(source_topics)
    if len(sources) > 1 and "{topic}" not in tiers.topic_name:
        raise Invalid(
            path, f"{tiers.topic_name!r} must contain '{{topic}}' with more than one source topic"
        )
    taken = set(sources) | {d for t in sources if (d := dlq_topic_for(t)) is not None}
    for topic in sources:
        for tier in range(len(tiers.delays_ms)):
            name = tiers.topic(topic, tier)
            shown = f"{name!r} (tier {tiers.label(tier)} of source topic {topic!r})"
            if name.startswith("__"):
                raise Invalid(
                    path, f"{shown} must not start with '__' (reserved for Kafka internals)"
                )
            if prefix and not name.startswith(prefix):
                raise Invalid(path, f"{shown} must start with {prefix!r} ({prefix_key})")
            if name in taken:
                raise Invalid(path, f"{shown} is a source or DLQ topic; a tier needs its own topic")
            problem = topic_name_error(name)
            if problem:
                if "{" in name or "}" in name:
                    problem += " (only '{topic}' and '{tier}' are substituted)"
                raise Invalid(path, f"{shown} is not a valid topic name: {problem}")
