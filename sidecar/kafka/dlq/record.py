"""The DLQ record: what goes into one (`build_dlq_record`, pure) and its header names.

The record follows KIP-1191: `__dlq.errors.*` context headers (UTF-8 strings, numbers in decimal) that overwrite
same-named original headers, the key/value/headers copied only when asked, partition = source partition modulo the
DLQ topic's partition count, and Kafka 4.4's cause text in `__dlq.errors.message`.

Owns the header vocabulary and the record's shape; no I/O, no state, so no task owns anything here. Imports only
the pure core (`sidecar.core.deadletter.FailedRecord` is the input).
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.deadletter import FailedRecord
from sidecar.core.text import has_utf8
from sidecar.core.tiers import TIERS_HEADER

H_TOPIC = "__dlq.errors.topic"
H_PARTITION = "__dlq.errors.partition"
H_OFFSET = "__dlq.errors.offset"
H_GROUP = "__dlq.errors.group"
H_DELIVERY_COUNT = "__dlq.errors.delivery.count"
H_EXC_CLASS = "__dlq.errors.exception.class.name"
H_EXC_MESSAGE = "__dlq.errors.exception.message"
H_EXC_STACKTRACE = "__dlq.errors.exception.stacktrace"
H_MESSAGE = "__dlq.errors.message"
# Ours, in the same namespace: set when the copy of the original record had to be dropped.
H_COPY_DROPPED = "__dlq.errors.copy.dropped"
# Ours: the class of the error's cause (the app's `error.cause_class`), and the DLQ topic the app
# named in its reject that the routes' allow-list refused (the record is in the default DLQ).
H_EXC_CAUSE_CLASS = "__dlq.errors.exception.cause.class.name"
H_ROUTE_REFUSED = "__dlq.errors.route.refused"
# Ours: why the app's custom DLQ value is as the app gave it, not encoded with schemas.dlq.value.subject.
H_VALUE_NOT_ENCODED = "__dlq.errors.value.not.encoded"
DLQ_HEADER_PREFIX = "__dlq."
# Markers `dlq-sidecar dlq replay` puts on a replayed record (sidecar/ops/dlq/replay.py). They are the record's
# replay history: a DLQ record must keep them even when the original headers are not copied, so a record
# that fails again after a replay is recognisable and never replayed in a loop.
REPLAY_HEADER_PREFIX = "__dlq.replay."

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True)
class DlqRecord:
    """What `DlqWriter` hands to produce(): every header name has a UTF-8 encoding.

    `dropped_headers` names the app's extra headers that were left out because they would have set
    one of ours (`is_reserved_header`); the writer counts and logs them. `copied` is False for a
    headers-only record (no copy of the original: its payload is read back from the source topic).
    """

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    dropped_headers: tuple[str, ...] = ()
    copied: bool = True


def is_reserved_header(name: str) -> bool:
    """True for a header name in the sidecar's own namespace (`__dlq.`, in any case).

    The app may add headers to its DLQ record (KIP-1034), never set ours: a `__dlq.replay.count` from
    the app would reset the replay loop guard, a `__dlq.errors.topic` would misdirect a replay.
    """
    return name[: len(DLQ_HEADER_PREFIX)].lower() == DLQ_HEADER_PREFIX


def encodable_name(name: str) -> str:
    # confluent-kafka encodes header names as UTF-8 in C and crashes (a segfault, not an exception) on a
    # lone surrogate. The wire refuses those from the app; anything else that carries one (a source
    # header name, a future caller) has it replaced here, so produce() is never handed one.
    if has_utf8(name):
        return name
    return name.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", errors="replace")


def _cap_utf8(text: str, max_bytes: int) -> bytes:
    data = _utf8(text)
    if len(data) <= max_bytes:
        return data
    marker = b"... [truncated]"
    cut = data[: max(0, max_bytes - len(marker))]
    # Do not end in the middle of a multi-byte character.
    return cut.decode("utf-8", errors="ignore").encode() + marker


def build_dlq_record(
    failed: FailedRecord,
    dlq_topic: str,
    dlq_partitions: int,
    copy_record: bool,
    stacktrace_max_bytes: int,
    *,
    drop_copy_reason: str | None = None,
) -> DlqRecord:
    """The DLQ record for `failed`. Pure: the same input always gives the same record.

    Header rules, in one place: the context headers (`H_*`) are ours; the app's extra headers are added
    unless `is_reserved_header` (then they are dropped and named in `dropped_headers`) and overwrite
    same-named original headers; original headers are copied only with `copy_record` (the replay
    history always). Every name is made encodable and every text value is UTF-8 (unencodable code points
    replaced), so nothing reaches produce() that it cannot encode.
    """
    context: list[tuple[str, bytes]] = [
        (H_TOPIC, _utf8(failed.topic)),
        (H_PARTITION, str(failed.partition).encode()),
        (H_OFFSET, str(failed.offset).encode()),
        (H_GROUP, _utf8(failed.group)),
        (H_DELIVERY_COUNT, str(failed.delivery_count).encode()),
        (H_MESSAGE, _utf8(failed.cause)),
    ]
    if failed.exception_class:
        context.append((H_EXC_CLASS, _utf8(failed.exception_class)))
    if failed.exception_message is not None and (
        failed.exception_class or failed.exception_message
    ):
        context.append((H_EXC_MESSAGE, _cap_utf8(failed.exception_message, 16384)))
    if failed.exception_cause_class:
        context.append((H_EXC_CAUSE_CLASS, _utf8(failed.exception_cause_class)))
    if failed.route_refused is not None:
        context.append((H_ROUTE_REFUSED, _utf8(failed.route_refused)))
    if failed.value_not_encoded is not None and failed.replacement_value_set:
        context.append((H_VALUE_NOT_ENCODED, _utf8(failed.value_not_encoded)))
    if failed.stacktrace:
        context.append((H_EXC_STACKTRACE, _cap_utf8(failed.stacktrace, stacktrace_max_bytes)))
    if failed.tiers_passed:
        context.append((TIERS_HEADER, _utf8(",".join(failed.tiers_passed))))
    copy = copy_record and drop_copy_reason is None
    if drop_copy_reason is not None:
        context.append((H_COPY_DROPPED, _utf8(drop_copy_reason)))
    app_headers: list[tuple[str, bytes]] = []
    dropped: list[str] = []
    for raw_name, header_value in failed.extra_headers:
        name = encodable_name(raw_name)
        if is_reserved_header(name):
            dropped.append(name)
        else:
            app_headers.append((name, header_value))
    overridden = {name for name, _ in context} | {n for n, _ in app_headers}

    originals = ((encodable_name(n), v) for n, v in failed.headers)
    headers: list[Header] = []
    if copy:
        # Original headers first, in order; same-named context and app headers overwrite (drop) them.
        headers.extend((n, v) for n, v in originals if n not in overridden)
    else:
        # Headers only: still carry the replay history (see REPLAY_HEADER_PREFIX).
        headers.extend(
            (n, v)
            for n, v in originals
            if n.startswith(REPLAY_HEADER_PREFIX) and n not in overridden
        )
    headers.extend(app_headers)
    headers.extend(context)

    if failed.replacement_value_set and drop_copy_reason is None:
        value = failed.replacement_value
    else:
        value = failed.value if copy else None
    key = failed.key if copy else None
    return DlqRecord(
        topic=dlq_topic,
        partition=failed.partition % max(1, dlq_partitions),
        key=key,
        value=value,
        headers=tuple(headers),
        dropped_headers=tuple(dropped),
        copied=copy,
    )


def estimated_size(record: DlqRecord) -> int:
    """Bytes the record takes in a batch of its own, generously rounded up (batch + record overhead)."""
    size = 61 + 21 + len(record.key or b"") + len(record.value or b"")
    for name, value in record.headers:
        size += 10 + len(name.encode()) + len(value or b"")
    return size
