"""One log line per burst of DLQ writes, always on: which topic, how many, why.

Owns `DlqSummary` (when it speaks and what it says: its docstring). Never a payload, a key or an
error message: only the bounded labels `/metrics` has.

Imports: the standard library and trio.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

log = logging.getLogger("sidecar.dlq")

QUIET_S = 1.0
EVERY_S = 10.0
TOP_CLASSES = 3


@dataclass(slots=True)
class _Burst:
    first_at: float
    last_at: float
    count: int = 0
    dlq_topics: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    classes: Counter[str] = field(default_factory=Counter)


class DlqSummary:
    """Counts DLQ writes per source topic and logs each burst once.

    `errors.log.enable` logs every archived record, and is off by default; without it dead-lettering
    would be silent in the log. `DlqSummary` counts the DLQ records written per source topic and says,
    once a burst is over (no write for `QUIET_S`) or every `EVERY_S` while it lasts, one warning per
    topic: the source topic, the DLQ topic (or, when routes spread the burst, each DLQ topic with its
    count), how many records, the archive reasons and the most frequent
    exception classes (`TOP_CLASSES`, with their counts). Never a payload, a key or an error message:
    only the labels `/metrics` has (`dlq_sidecar_dead_lettered_total`), which are bounded.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._bursts: dict[str, _Burst] = {}  # one per source topic: bounded by the config

    def written(self, topic: str, dlq_topic: str, reason: str, exception_class: str) -> None:
        """One DLQ record of `topic` confirmed in `dlq_topic` (labels as in the metrics)."""
        now = self._clock()
        burst = self._bursts.get(topic)
        if burst is None:
            burst = self._bursts[topic] = _Burst(now, now)
        burst.last_at = now
        burst.count += 1
        burst.dlq_topics[dlq_topic] += 1
        burst.reasons[reason] += 1
        burst.classes[exception_class] += 1

    def flush(self, *, everything: bool = False) -> None:
        """Log the bursts that are over, or have lasted `EVERY_S` (all of them: `everything`)."""
        now = self._clock()
        for topic, burst in list(self._bursts.items()):
            if everything or now - burst.last_at >= QUIET_S or now - burst.first_at >= EVERY_S:
                del self._bursts[topic]
                _say(topic, burst)

    async def run(self) -> None:
        """Flush every `QUIET_S` until cancelled; then say what is left."""
        try:
            while True:
                await trio.sleep(QUIET_S)
                self.flush()
        finally:
            self.flush(everything=True)


def _counted(counts: Counter[str], top: int | None = None) -> str:
    shown = counts.most_common(top)
    text = ", ".join(f"{name} {n}" for name, n in shown)
    rest = sum(counts.values()) - sum(n for _, n in shown)
    return f"{text}, others {rest}" if rest else text


def _say(topic: str, burst: _Burst) -> None:
    seconds = max(burst.last_at - burst.first_at, 0.0)
    records = "record" if burst.count == 1 else "records"
    targets = burst.dlq_topics
    if len(targets) == 1:
        where = next(iter(targets))
        named: dict[str, object] = {"dlq_topic": where}
    else:  # routes spread it: every DLQ topic, with its count
        where = f"{len(targets)} DLQ topics ({_counted(targets)})"
        named = {"dlq_topics": dict(targets)}
    log.warning(
        "dead-lettered %d %s of %s to %s in %.1f s; reasons: %s; exception classes: %s",
        burst.count,
        records,
        topic,
        where,
        seconds,
        _counted(burst.reasons),
        _counted(burst.classes, TOP_CLASSES),
        extra={
            "fields": {
                "topic": topic,
                **named,
                "count": burst.count,
                "reasons": dict(burst.reasons),
                "exception_classes": dict(burst.classes.most_common(TOP_CLASSES)),
            }
        },
    )
