"""The outcome vocabulary of a delivery attempt, and the decision it leads to (sans-IO).

Owns, in one place for both engines: the answer words (:class:`Ack`) and :func:`decide` (accept,
keep the lock, redeliver after a delay, or dead-letter with an :class:`ArchiveReason`); the two
causes and their Kafka texts; the sidecar's own error-class names (``sidecar.AppTimeout`` ...);
:class:`ErrorInfo`, why a delivery failed, from the answer to the DLQ record's headers.

Pure: no trio, no Kafka, no I/O, no clock, no random source (the caller passes ``rand``). Must not
import anything but the standard library and :mod:`sidecar.core.backoff`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from sidecar.core.backoff import RetryPolicy

__all__ = [
    "ACK_BY_WORD",
    "APP_CONNECTION_LOST",
    "APP_NOT_REACHABLE",
    "APP_TIMEOUT",
    "CAUSE_DELIVERY_COUNT",
    "CAUSE_REJECTED",
    "COUNT_EXHAUSTED",
    "DELIVERY_COUNT_EXCEEDED",
    "DLQ_WRITE_FAILED",
    "LOCK_TIMEOUT",
    "MALFORMED_ANSWER",
    "MALFORMED_RESPONSE",
    "SHUTDOWN",
    "Accept",
    "Ack",
    "ArchiveReason",
    "DeadLetter",
    "ErrorInfo",
    "KeepLock",
    "Redeliver",
    "Verdict",
    "dead_letter_error",
    "decide",
    "error_info",
    "http_status_class",
]

# --------------------------------------------------------------------------------- causes

# Kafka 4.4's ``__dlq.errors.message`` texts, so native share-group DLQ readers read ours too.
CAUSE_REJECTED = "Offset rejected by client."
CAUSE_DELIVERY_COUNT = "Offset delivery count exceeded the threshold."

# --------------------------------------------------------------------------------- error classes
# The sidecar's own exception class names (``__dlq.errors.exception.class.name``, span events):
# they stand in for an app's exception class when the sidecar, not the app, saw the failure.

APP_TIMEOUT = "sidecar.AppTimeout"  # the app did not answer within app.timeout.ms
APP_CONNECTION_LOST = "sidecar.AppConnectionLost"  # the connection broke mid-request
APP_NOT_REACHABLE = "sidecar.AppNotReachable"  # nothing listening: not an attempt
MALFORMED_RESPONSE = "sidecar.MalformedResponse"  # not HTTP, or over a limit
MALFORMED_ANSWER = "sidecar.MalformedAnswer"  # HTTP, but not an answer we understand
LOCK_TIMEOUT = "sidecar.LockTimeout"  # no answer before the record lock expired (both engines)
COUNT_EXHAUSTED = "sidecar.DeliveryCountExhausted"  # restored at the limit after a restart
DELIVERY_COUNT_EXCEEDED = "sidecar.DeliveryCountExceeded"  # released at the limit, no app error
SHUTDOWN = "sidecar.Shutdown"  # the sidecar stopped before the app answered
DLQ_WRITE_FAILED = "sidecar.DlqWriteFailed"  # the DLQ write failed for good


def http_status_class(status: int) -> str:
    """The class name of a failure the app reported only through its HTTP status."""
    return f"sidecar.HttpStatus{status}"


# --------------------------------------------------------------------------------- answers


class Ack(enum.Enum):
    """What an answer asks for (the words of the app contract and of ``POST /v1/acks``)."""

    ACCEPT = "accept"
    RELEASE = "release"
    REJECT = "reject"
    RENEW = "renew"


#: The Ack for each answer word (a dict lookup: `Ack(word)` is slow on the hot path).
ACK_BY_WORD: dict[str, Ack] = {a.value: a for a in Ack}


class ArchiveReason(enum.Enum):
    """Why a record is dead-lettered."""

    REJECTED = "REJECTED"
    DELIVERY_COUNT_EXCEEDED = "DELIVERY_COUNT_EXCEEDED"
    # Not a dead letter: a release whose delay goes to a retry tier (the same write path, to the
    # tier's topic; sidecar.engines.tier_step). Never the reason of a DLQ record.
    RETRY_TIER = "RETRY_TIER"

    @property
    def cause(self) -> str:
        """Kafka 4.4's ``__dlq.errors.message`` text, so native share-group DLQ readers read ours."""
        return CAUSE_REJECTED if self is ArchiveReason.REJECTED else CAUSE_DELIVERY_COUNT

    @property
    def label(self) -> str:
        """The word in metrics, status counters, logs and spans."""
        if self is ArchiveReason.RETRY_TIER:
            return "retry_tier"
        return "rejected" if self is ArchiveReason.REJECTED else "delivery_count_exceeded"


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """Why a delivery failed, as the application (or the sidecar, for transport errors) says.

    ``None`` means "not said"; an app's empty class or message is normalised to ``None`` by
    :func:`error_info`, so every later step tests one thing.
    """

    class_name: str | None = None
    message: str | None = None
    stacktrace: str | None = None
    cause_class: str | None = None  # the class of the error's cause, when the app says it


class _AppErrorLike(Protocol):
    @property
    def class_name(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def stacktrace(self) -> str | None: ...
    @property
    def cause_class(self) -> str | None: ...


def error_info(error: _AppErrorLike | ErrorInfo | None) -> ErrorInfo | None:
    """The one conversion from the wire's account of an error (``wire.AppError``) to ours."""
    if error is None or isinstance(error, ErrorInfo):
        return error
    return ErrorInfo(
        error.class_name or None, error.message or None, error.stacktrace, error.cause_class or None
    )


def dead_letter_error(reason: ArchiveReason, error: ErrorInfo | None) -> ErrorInfo | None:
    """The error a DLQ record carries: the app's, or ours for a limit reached without one."""
    if error is None and reason is ArchiveReason.DELIVERY_COUNT_EXCEEDED:
        return ErrorInfo(DELIVERY_COUNT_EXCEEDED, "released or timed out at the delivery limit")
    return error


# --------------------------------------------------------------------------------- the decision


@dataclass(frozen=True, slots=True)
class Accept:
    """Done: acknowledged."""


@dataclass(frozen=True, slots=True)
class KeepLock:
    """A renew: the attempt stays live with a fresh lock; nothing else changes."""


@dataclass(frozen=True, slots=True)
class Redeliver:
    """Back to AVAILABLE: the next attempt not before ``delay_ms`` from now."""

    delay_ms: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """To ARCHIVING: write a DLQ record with this reason, then done."""

    reason: ArchiveReason


Verdict = Accept | KeepLock | Redeliver | DeadLetter

# The verdicts without a variable part, made once (they are frozen), and the enum members decide
# tests: reading a member through its class costs more than the rest of a decision.
_ACCEPTED = Accept()
_KEPT = KeepLock()
_REJECTED = DeadLetter(ArchiveReason.REJECTED)
_EXCEEDED = DeadLetter(ArchiveReason.DELIVERY_COUNT_EXCEEDED)
_NOW = Redeliver(0)
_ACCEPT = Ack.ACCEPT
_RENEW = Ack.RENEW
_REJECT = Ack.REJECT


def decide(
    ack: Ack,
    delivery_count: int,
    limit: int,
    *,
    retry: RetryPolicy | None = None,
    rand: float = 0.0,
    retry_after_ms: int | None = None,
) -> Verdict:
    """What an answer to the ``delivery_count``-th attempt of a record leads to.

    A lock timeout is a release with no answer. A release at or past ``limit`` is dead-lettered
    (the delivery count exceeded the threshold); below it the record is redelivered after the
    ``retry`` policy's delay (none without a policy: the share-group broker times redeliveries
    itself). ``rand`` in [0, 1) is the caller's jitter draw.
    """
    if delivery_count < 1:
        raise ValueError(f"delivery_count must be >= 1, got {delivery_count}")
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if ack is _ACCEPT:
        return _ACCEPTED
    if ack is _RENEW:
        return _KEPT
    if ack is _REJECT:
        return _REJECTED
    if delivery_count >= limit:
        return _EXCEEDED
    if retry is None:
        return _NOW
    return Redeliver(retry.delay_ms(delivery_count, rand, retry_after_ms))
