"""librdkafka's log, summarised: one line per distinct condition per interval, and the sidecar's
own plain line first when a broker cannot be reached.

Owns `librdkafka_logger()`, the logger every client of the service is given, and its filter
`_Summary` (what a condition is, and what goes out: its docstring). Bounded (`MAX_CONDITIONS`) and
thread-safe: librdkafka's lines arrive on the threads that poll each client.

Imports: the standard library only.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

LOGGER_NAME = "sidecar.librdkafka"
INTERVAL_S = 30.0
MAX_CONDITIONS = 256

own_log = logging.getLogger("sidecar.kafka")
# The counts said at the stop: a child of LOGGER_NAME, so they pass its level but not its filter.
_final = logging.getLogger(LOGGER_NAME + ".summary")

# What differs between two repeats of one condition.
_VOLATILE = (
    re.compile(r"\[thrd:[^\]]*\]:\s*"),
    re.compile(r"\s*\(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)"),
    re.compile(r"\s*\(\d+ identical error\(s\) suppressed\)"),
)
# "127.0.0.1:1/bootstrap: Connect to ..." or "sasl_ssl://b-1:9093/1: ..."
_BROKER = re.compile(r"^(?:[a-z_]+://)?(?P<broker>[^\s/]+)/(?P<id>[\w-]+): ")


@dataclass(frozen=True, slots=True)
class _Kind:
    word: str  # for the fields: dns, refused, timeout, tls, auth, unreachable
    pattern: re.Pattern[str]
    says: Callable[[str], str]  # the plain sentence, given the broker's host:port


_KINDS = (
    _Kind(
        "dns",
        re.compile(r"Failed to resolve", re.IGNORECASE),
        lambda b: f"the Kafka broker name {b} does not resolve (DNS): check bootstrap.servers",
    ),
    _Kind(
        "refused",
        re.compile(r"Connection refused", re.IGNORECASE),
        lambda b: (
            f"the Kafka broker {b} refuses connections (nothing listens there?): "
            "check bootstrap.servers and that the broker runs"
        ),
    ),
    _Kind(
        "timeout",
        re.compile(r"timed out|Connection setup timed out", re.IGNORECASE),
        lambda b: (
            f"the Kafka broker {b} does not answer (the connection timed out): check the network"
        ),
    ),
    _Kind(
        "tls",
        re.compile(r"SSL|TLS|certificate", re.IGNORECASE),
        lambda b: (
            f"TLS with the Kafka broker {b} failed: check security.protocol, ssl.ca.location "
            "and the broker's certificate"
        ),
    ),
    _Kind(
        "auth",
        re.compile(r"SASL|authenticat", re.IGNORECASE),
        lambda b: (
            f"authentication with the Kafka broker {b} failed: check sasl.mechanism, "
            "sasl.username and sasl.password"
        ),
    ),
    _Kind(
        "unreachable",
        re.compile(r"Connect to .* failed|Disconnected|Broker transport failure", re.IGNORECASE),
        lambda b: f"the Kafka broker {b} cannot be reached",
    ),
)
_WHAT_IT_DOES = (
    "librdkafka retries (reconnect.backoff.ms up to reconnect.backoff.max.ms); the sidecar stays "
    "not ready until the broker answers; librdkafka's repeats are summarised every {interval:g} s"
)
_FACILITIES_OF_CONNECTION = frozenset({"FAIL", "ERROR", "CONNECT", "SSL", "SASL", "BROKERFAIL"})


@dataclass(slots=True)
class _Seen:
    shown_at: float
    text: str  # the line as last shown (client, condition), for the count at the stop
    repeats: int = 0


def _condition(message: str) -> str:
    for volatile in _VOLATILE:
        message = volatile.sub("", message)
    return message.strip()


def _connection_kind(facility: str, text: str) -> _Kind | None:
    if facility not in _FACILITIES_OF_CONNECTION:
        return None
    return next((kind for kind in _KINDS if kind.pattern.search(text)), None)


class _Summary(logging.Filter):
    """The filter of `LOGGER_NAME`: lets a condition's first line through, counts its repeats.

    librdkafka logs a broker it cannot reach on every reconnect attempt, from every client the
    sidecar runs (the consumer, the start-up check, the DLQ producer and its admin client): about
    twenty lines a second for one unreachable bootstrap server. `librdkafka_logger()` is the logger
    every client of the service is given (``logger=``), with `_Summary` as its filter:

    - a *condition* is librdkafka's line without what changes between repeats (the client's name,
      ``(after 3ms in state CONNECT)``, librdkafka's own "N identical error(s) suppressed");
    - the first line of a condition goes out; its repeats for `INTERVAL_S` are counted, and the first
      repeat after that goes out once, with how many there were (``repeats=193 interval_s=30``);
    - lines below a warning (shown only when `kafka.debug` asks for them) go out as they are, every one;
    - a failure to reach a broker is a warning (librdkafka retries it; the sidecar is not ready until it
      answers), and before its first line the sidecar says, in its own words, which broker, what
      failed (its name does not resolve, the connection is refused, no answer, TLS, authentication)
      and what it does about it (`connection_problem` keeps that, for the start-up check's reason).
    """

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[int, str], _Seen] = OrderedDict()
        self._told: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._problem: str | None = None

    def flush(self) -> None:
        """Say the repeats counted since each condition's last line (at the stop)."""
        now = self._clock()
        said: list[tuple[int, str, int, float]] = []
        with self._lock:
            for (level, _condition), seen in self._seen.items():
                if seen.repeats:
                    said.append((level, seen.text, seen.repeats, now - seen.shown_at))
                    seen.repeats, seen.shown_at = 0, now
        for level, text, repeats, age_s in said:
            _final.log(
                level,
                "%s (and %d more like it in the last %.0f s)",
                text,
                repeats,
                age_s,
                extra={"fields": {"repeats": repeats, "interval_s": round(age_s, 1)}},
            )

    def problem(self) -> str | None:
        with self._lock:
            return self._problem

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True  # shown only with `kafka.debug` set: every line, as librdkafka wrote it
        facility, text = _parts(record)
        condition = _condition(text)
        kind = _connection_kind(facility, condition)
        if kind is not None and record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        now = self._clock()
        with self._lock:
            key = (record.levelno, f"{facility} {condition}")
            seen = self._seen.get(key)
            if seen is not None and now - seen.shown_at < self._interval_s:
                seen.repeats += 1
                return False
            repeats = seen.repeats if seen is not None else 0
            self._seen[key] = _Seen(now, f"{facility} [{_client(record)}] {condition}")
            self._seen.move_to_end(key)
            while len(self._seen) > MAX_CONDITIONS:
                self._seen.popitem(last=False)
            say = self._own_line(kind, condition, now)
        if say is not None:
            own_log.warning(say[0], extra={"fields": say[1]})
        _rewrite(record, facility, _client(record), condition, repeats, self._interval_s)
        return True

    def _own_line(
        self, kind: _Kind | None, condition: str, now: float
    ) -> tuple[str, dict[str, object]] | None:
        """The sidecar's own sentence for a broker newly unreachable this way (lock held)."""
        if kind is None:
            return None
        match = _BROKER.match(condition)
        broker = match.group("broker") if match else "(unknown)"
        self._problem = kind.says(broker)
        told = self._told.get((broker, kind.word))
        if told is not None and now - told < self._interval_s:
            return None
        self._told[(broker, kind.word)] = now
        self._told.move_to_end((broker, kind.word))
        while len(self._told) > MAX_CONDITIONS:
            self._told.popitem(last=False)
        what = _WHAT_IT_DOES.format(interval=self._interval_s)
        return f"{self._problem}; {what}", {"broker": broker, "failure": kind.word}


def _parts(record: logging.LogRecord) -> tuple[str, str]:
    """(librdkafka's facility, its message) of a line confluent-kafka logged."""
    args = record.args
    if isinstance(args, tuple) and len(args) == 3:
        return str(args[0]), str(args[2])  # "%s [%s] %s": facility, client name, message
    return "", record.getMessage()


def _client(record: logging.LogRecord) -> str:
    args = record.args
    return str(args[1]) if isinstance(args, tuple) and len(args) == 3 else ""


def _rewrite(
    record: logging.LogRecord,
    facility: str,
    client: str,
    condition: str,
    repeats: int,
    interval_s: float,
) -> None:
    record.msg, record.args = "%s [%s] %s", (facility, client, condition)
    if repeats:
        fields = {"repeats": repeats, "interval_s": interval_s}
        record.__dict__["fields"] = fields
        record.msg = "%s [%s] %s (and %d more like it in the last %g s)"
        record.args = (facility, client, condition, repeats, interval_s)


_lock = threading.Lock()
_summary: _Summary | None = None


def librdkafka_logger(
    interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic
) -> logging.Logger:
    """The logger to give every librdkafka client of the service (its summary installed once)."""
    global _summary
    logger = logging.getLogger(LOGGER_NAME)
    with _lock:
        if _summary is None:
            _summary = _Summary(interval_s, clock)
            logger.addFilter(_summary)
    return logger


def flush_summary() -> None:
    """At the stop: one line per condition whose repeats were counted and not said yet."""
    with _lock:
        summary = _summary
    if summary is not None:
        summary.flush()


def connection_problem() -> str | None:
    """The sidecar's sentence for the last broker it could not reach (None: none so far)."""
    with _lock:
        summary = _summary
    return summary.problem() if summary is not None else None
