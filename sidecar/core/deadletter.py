"""The DLQ step of both engines, sans-IO: an archived record → its DLQ write request → the outcome.

Owns :func:`dead_letter` (the plan, drawn in its docstring), :class:`DeadLetterPlan`,
:class:`FailedRecord` and :class:`ArchiveOutcome`; the engine performs the write.

Pure: no trio, no Kafka, no I/O, no clock. Must import only the core (:mod:`sidecar.core.outcome`,
:mod:`sidecar.core.record`, :mod:`sidecar.core.tiers`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from sidecar.core.outcome import ArchiveReason, ErrorInfo, dead_letter_error
from sidecar.core.record import Header, Tracked
from sidecar.core.tiers import TierWrite

__all__ = [
    "ArchiveOutcome",
    "DeadLetterPlan",
    "FailedRecord",
    "archived_log_fields",
    "dead_letter",
]

# The first bytes of a key or value an archived-record log line may show (errors.log.include.messages).
LOG_PREVIEW_BYTES = 1024


@dataclass(frozen=True, slots=True)
class FailedRecord:
    """Everything known about an archived record that its DLQ record may carry."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    group: str
    delivery_count: int
    cause: str  # CAUSE_REJECTED or CAUSE_DELIVERY_COUNT
    exception_class: str | None = None
    exception_message: str | None = None
    stacktrace: str | None = None
    extra_headers: tuple[
        tuple[str, bytes], ...
    ] = ()  # KIP-1034 custom DLQ record (from the app's reject)
    replacement_value: bytes | None = None
    replacement_value_set: bool = False
    # Retry tiers (sidecar.core.tiers): the tiers it went through, and, for a write to a tier
    # rather than to the DLQ, that write's due time and trail.
    tiers_passed: tuple[str, ...] = ()
    tier: TierWrite | None = None
    exception_cause_class: str | None = None
    route_refused: str | None = None  # the DLQ topic the app named and may not use (routes)
    # Why the app's custom DLQ value is written as given, not encoded with the configured subject.
    value_not_encoded: str | None = None


class ArchiveOutcome(enum.Enum):
    WRITTEN = "written"  # the broker confirmed the DLQ record (acks=all): done
    NO_DLQ = "no_dlq"  # no DLQ topic configured: logged and skipped, done
    HANDED_OVER = "handed_over"  # the partition went to another owner first; it archives the record
    FAILED = "failed"  # the write failed for good: the sidecar stops, the record is not done
    STOPPED = "stopped"  # errors.tolerance: none: the sidecar stops at the first archived record
    # The DLQ circuit breaker is open (sidecar.core.breaker): not written, not done; the engine
    # keeps the record uncommitted and delivers it to the app again once the breaker closes.
    HELD = "held"

    @property
    def done(self) -> bool:
        return self in (ArchiveOutcome.WRITTEN, ArchiveOutcome.NO_DLQ)


@dataclass(frozen=True, slots=True)
class DeadLetterPlan:
    """What to do with one archived record: stop, skip (no DLQ), or write ``failed`` to ``dlq_topic``."""

    reason: ArchiveReason
    error: ErrorInfo | None
    stop: str | None  # the reason to stop the sidecar instead (errors.tolerance: none)
    dlq_topic: str | None
    failed: FailedRecord | None


def dead_letter(
    tracked: Tracked,
    delivery_count: int,
    reason: ArchiveReason,
    error: ErrorInfo | None,
    *,
    group: str,
    dlq_topic: str | None,
    tolerate: bool,
    consequence: str,
    route_refused: str | None = None,
) -> DeadLetterPlan:
    """Plan the DLQ step for ``tracked`` (``consequence``: what stopping means for the record;
    ``route_refused``: the DLQ topic the app named that its routes refused).

        Tracked record + delivery count + ArchiveReason + ErrorInfo
            │  dead_letter()                      (errors.tolerance, the DLQ topic the routes chose)
            ▼
        DeadLetterPlan ── stop ─────────────▶ STOPPED       errors.tolerance: none: nothing written
                       ── failed is None ───▶ NO_DLQ        no DLQ topic: logged and skipped (KIP-1191)
                       ── failed ───────────▶ (the engine writes it) ─▶ WRITTEN / HANDED_OVER / FAILED

    The engine performs the write (plain or transactional) and reports which :class:`ArchiveOutcome`
    it got; the record is done for WRITTEN and NO_DLQ only. :class:`FailedRecord` is what
    :func:`sidecar.kafka.dlq.build_dlq_record` turns into the record's bytes and ``__dlq.errors.*`` headers.
    """
    error = dead_letter_error(reason, error)
    rec = tracked.record
    if not tolerate:
        why = f": {error.class_name}" if error and error.class_name else ""
        stop = (
            f"errors.tolerance is none and {rec.topic}[{rec.partition}]@{rec.offset} was archived "
            f"({reason.label}{why}); {consequence}"
        )
        return DeadLetterPlan(reason, error, stop, None, None)
    if dlq_topic is None:
        return DeadLetterPlan(reason, error, None, None, None)
    custom = tracked.custom
    failed = FailedRecord(
        topic=rec.topic,
        partition=rec.partition,
        offset=rec.offset,
        key=rec.key,
        value=rec.value,
        headers=rec.headers,
        group=group,
        delivery_count=delivery_count,
        cause=reason.cause,
        exception_class=error.class_name if error else None,
        exception_message=error.message if error else None,
        stacktrace=error.stacktrace if error else None,
        extra_headers=custom.headers if custom else (),
        replacement_value=custom.value if custom else None,
        replacement_value_set=custom.value_set if custom else False,
        tiers_passed=tracked.tier.tiers if tracked.tier is not None else (),
        exception_cause_class=error.cause_class if error else None,
        route_refused=route_refused,
    )
    return DeadLetterPlan(reason, error, None, dlq_topic, failed)


def _preview(data: bytes | None) -> str | None:
    if data is None:
        return None
    return data[:LOG_PREVIEW_BYTES].decode("utf-8", errors="backslashreplace")


def archived_log_fields(
    tracked: Tracked, delivery_count: int, plan: DeadLetterPlan, *, include_messages: bool
) -> dict[str, Any]:
    """The structured fields of the "record archived" log line (payloads only when asked)."""
    rec, err = tracked.record, plan.error
    fields: dict[str, Any] = {
        "topic": rec.topic,
        "partition": rec.partition,
        "offset": rec.offset,
        "delivery_count": delivery_count,
        "reason": plan.reason.label,
        "exception_class": err.class_name if err else None,
        "exception_message": err.message if err else None,
    }
    if include_messages:
        fields["key"] = _preview(rec.key)
        fields["value"] = _preview(rec.value)
    return fields
