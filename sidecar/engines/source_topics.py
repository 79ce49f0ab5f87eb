"""Source topics the cluster does not have: named in the log, in readiness and in the status, and
watched until they exist.

Owns `SourceTopics` (why a missing topic is no error, and what it is told: its docstring).

Imports: the standard library and trio (the question itself is given:
`sidecar.kafka.consumer_config.missing_topics_sync`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

log = logging.getLogger("sidecar.engine")

RECHECK_S = 10.0

# (kafka properties, topics) -> the missing ones, each with the cluster's topic it most likely
# misspells (None: none is close), or None when the cluster did not answer.
MissingCheck = Callable[[Mapping[str, Any], Sequence[str]], "Mapping[str, str | None] | None"]


class SourceTopics:
    """Which configured source topics do not exist (as last asked).

    A topic listed under `source.topics` that does not exist is not an error librdkafka stops on: the
    consumer stays subscribed, with nothing assigned, and would pick the topic up once it is created.
    `SourceTopics` asks the cluster at start-up (after it answered) which are missing, says so in
    one warning (with the cluster's topic each most likely misspells, as the config loader does for keys), keeps them for `/readyz` (``source_topics_exist: false`` and the reason) and
    `/v1/status` (``missing_topics``), asks again every `RECHECK_S` and logs each one that appears.
    The pipeline prepares DLQ topics only for the source topics that exist: a missing topic gets no
    ``dlq.<topic>`` of its own before its first record to dead-letter (the DLQ writer prepares a topic it
    meets for the first time).

    Imports: the standard library and trio (the question itself is given:
    `sidecar.kafka.consumer_config.missing_topics_sync`).
    """

    def __init__(
        self, kafka: Mapping[str, Any], topics: Sequence[str], check: MissingCheck
    ) -> None:
        self._kafka = kafka
        self._topics = tuple(topics)
        self._check = check
        self._missing: tuple[str, ...] = ()
        self._close: dict[str, str] = {}  # a missing topic -> the cluster's topic it may misspell

    @property
    def missing(self) -> tuple[str, ...]:
        return self._missing

    def existing(self) -> tuple[str, ...]:
        return tuple(t for t in self._topics if t not in self._missing)

    def reason(self) -> str | None:
        """For `/readyz`: which source topics do not exist (None: all do)."""
        if not self._missing:
            return None
        names = ", ".join(
            f"{t} (did you mean {self._close[t]}?)" if t in self._close else t
            for t in self._missing
        )
        what = "source topic" if len(self._missing) == 1 else "source topics"
        verb = "does" if len(self._missing) == 1 else "do"
        return f"{what} {names} {verb} not exist on the cluster"

    async def check_now(self) -> None:
        """Ask the cluster once (start-up); warn about the missing ones."""
        missing = await trio.to_thread.run_sync(self._check, self._kafka, self._topics)
        if missing is None:
            return  # no answer: the consumer reports the cluster's state itself
        self._take(missing)
        if self._missing:
            log.warning(
                "%s: not ready; nothing is consumed from %s and no DLQ topic is created for %s "
                "until %s created (checked every %g s)",
                self.reason(),
                "it" if len(self._missing) == 1 else "them",
                "it" if len(self._missing) == 1 else "them",
                "it is" if len(self._missing) == 1 else "they are",
                RECHECK_S,
                extra={"fields": {"missing_topics": list(self._missing)}},
            )

    async def watch(self) -> None:
        """Until every source topic exists: ask again every `RECHECK_S`, log each that appears."""
        while self._missing:
            await trio.sleep(RECHECK_S)
            missing = await trio.to_thread.run_sync(self._check, self._kafka, self._missing)
            if missing is None:
                continue
            for topic in self._missing:
                if topic not in missing:
                    log.info(
                        "source topic %s now exists", topic, extra={"fields": {"topic": topic}}
                    )
            self._take(missing)

    def _take(self, missing: Mapping[str, str | None]) -> None:
        self._missing = tuple(missing)
        self._close = {topic: close for topic, close in missing.items() if close is not None}
