"""The app's answers (docs/app-contract.md): status codes, JSON bodies and `Retry-After`, interpreted into
`Answer` values the same way for both formats.  Answers never raise: a malformed answer is a
release carrying a ``sidecar.MalformedAnswer`` error.

Pure functions and frozen values (see `sidecar.core.wire`).
"""

from __future__ import annotations

import base64
import binascii
import email.utils
import json
import math
import time
from collections.abc import Iterable, Mapping
from typing import cast

from sidecar.core.text import has_utf8
from sidecar.core.wire.values import (
    ANSWER_ACKS,
    MALFORMED_ANSWER,
    MAX_RETRY_AFTER_MS,
    ROUTE_MISSING,
    ROUTE_MISSING_STATUSES,
    STATUS_ACKS,
    STATUS_MESSAGE_CHARS,
    AckWord,
    Answer,
    AppError,
    HeaderList,
    WireError,
)

__all__ = [
    "interpret_batch",
    "interpret_single",
    "parse_retry_after_ms",
    "route_missing",
    "route_missing_statuses",
    "validate_status_mapping",
]


def validate_status_mapping(mapping: Mapping[int, str]) -> dict[int, str]:
    """Check a configured status → ack (or ``route-missing``) mapping; raise :class:`WireError`
    on a bad entry."""
    checked: dict[int, str] = {}
    words = STATUS_ACKS | {ROUTE_MISSING}
    for status, ack in mapping.items():
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise WireError(f"status mapping key must be an HTTP status 100..599, got {status!r}")
        if ack not in words:
            raise WireError(
                f"status mapping for {status}: expected one of "
                f"{', '.join(sorted(words))}, got {ack!r}"
            )
        checked[status] = ack
    return checked


def route_missing_statuses(mapping: Mapping[int, str] | None = None) -> frozenset[int]:
    """The statuses `route_missing` may say yes to under this mapping (a cheap first check)."""
    mapping = mapping or {}
    kept = {s for s in ROUTE_MISSING_STATUSES if mapping.get(s) is None}
    return frozenset(kept | {s for s, word in mapping.items() if word == ROUTE_MISSING})


def route_missing(
    status: int,
    headers: HeaderList,
    body: bytes,
    mapping: Mapping[int, str] | None = None,
    *,
    batch: bool = False,
) -> bool:
    """Whether an answer says the app has no such route: the configured URL is wrong, not the record.

    A status of ``ROUTE_MISSING_STATUSES`` (404, 405, 415) the mapping leaves alone, or one the
    mapping marks ``route-missing``, whose body is not a JSON answer: a JSON object with an
    ``ack`` (single mode) or a ``results`` list (batch mode). A framework's own error page, JSON
    or not, has neither; an app that rejects a record with 404 on purpose says so in JSON.
    """
    mapped = mapping.get(status) if mapping else None
    if mapped is None:
        if status not in ROUTE_MISSING_STATUSES:
            return False
    elif mapped != ROUTE_MISSING:
        return False
    if not (_is_json(_header(headers, b"content-type")) and body.strip()):
        return True
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return True
    if not isinstance(obj, dict):
        return True
    return not ("ack" in obj or (batch and isinstance(obj.get("results"), list)))


def _header(headers: HeaderList, name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


def _is_json(content_type: bytes | None) -> bool:
    if content_type is None:
        return False
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or media.endswith(b"+json")


def _is_text(content_type: bytes | None) -> bool:
    if content_type is None:
        return True
    media = content_type.split(b";", 1)[0].strip().lower()
    return media.startswith(b"text/") or media.endswith((b"json", b"xml"))


def parse_retry_after_ms(value: bytes | None, now_epoch_s: float | None = None) -> int | None:
    """``Retry-After`` (delay-seconds or HTTP-date) as capped milliseconds; None if unusable."""
    if value is None:
        return None
    text = value.decode("latin-1").strip()
    # Only ASCII digits: str.isdigit() is also true for '²', which int() refuses.
    if text.isascii() and text.isdigit():
        delay_ms = int(text) * 1000 if len(text) < 10 else MAX_RETRY_AFTER_MS
    else:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        now = time.time() if now_epoch_s is None else now_epoch_s
        try:
            # A naive datetime (zone "-0000") is read as local time, which can overflow.
            delay_s = when.timestamp() - now
        except (OverflowError, OSError, ValueError):
            return None
        delay_ms = max(0, math.ceil(delay_s * 1000))
    return min(delay_ms, MAX_RETRY_AFTER_MS)


def _status_error(status: int, content_type: bytes | None, body: bytes) -> AppError:
    if _is_text(content_type):
        message = body[: STATUS_MESSAGE_CHARS * 4].decode("utf-8", "replace")
        message = message[:STATUS_MESSAGE_CHARS].strip()
    else:
        kind = content_type.split(b";", 1)[0].strip().decode("latin-1") if content_type else ""
        message = f"{len(body)} bytes of {kind}"
    return AppError(f"sidecar.HttpStatus{status}", message or f"HTTP status {status}")


def _status_ack(status: int, mapping: Mapping[int, str]) -> AckWord:
    mapped = mapping.get(status)
    if mapped == ROUTE_MISSING:
        mapped = None  # the answer carried JSON (see route_missing): the status alone decides
    if mapped is not None:
        if mapped not in STATUS_ACKS:
            raise WireError(f"status mapping for {status} names unknown ack {mapped!r}")
        return cast(AckWord, mapped)
    if status == 202:
        return "deferred"
    if 200 <= status < 300:
        return "accept"
    if status in (400, 422):
        return "reject"
    return "release"


class Malformed(Exception):
    """A JSON answer that does not follow the contract; the message names the field."""


def _malformed_answer(reason: str) -> Answer:
    return Answer("release", AppError(MALFORMED_ANSWER, reason), reason=reason)


def _checked_text(text: str, where: str) -> str:
    if not has_utf8(text):
        raise Malformed(f"{where} is not valid Unicode text (a lone surrogate)")
    return text


def parse_error(obj: object, where: str) -> AppError | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise Malformed(f"{where}.error must be an object")
    fields: list[str] = []
    for field in ("class", "message"):
        text = obj.get(field, "")
        if not isinstance(text, str):
            raise Malformed(f"{where}.error.{field} must be a string")
        fields.append(_checked_text(text, f"{where}.error.{field}"))
    stacktrace = obj.get("stacktrace")
    if stacktrace is not None:
        if not isinstance(stacktrace, str):
            raise Malformed(f"{where}.error.stacktrace must be a string or null")
        _checked_text(stacktrace, f"{where}.error.stacktrace")
    cause = obj.get("cause_class")
    if cause is not None:
        if not isinstance(cause, str):
            raise Malformed(f"{where}.error.cause_class must be a string or null")
        _checked_text(cause, f"{where}.error.cause_class")
    return AppError(fields[0], fields[1], stacktrace, cause or None)


def parse_retry_after(obj: object, where: str) -> int | None:
    if obj is None:
        return None
    if isinstance(obj, bool) or not isinstance(obj, int | float) or not math.isfinite(obj):
        raise Malformed(f"{where}.retry_after_ms must be a number")
    if obj < 0:
        raise Malformed(f"{where}.retry_after_ms must not be negative")
    return min(math.ceil(obj), MAX_RETRY_AFTER_MS)


def parse_dlq(obj: object, where: str) -> tuple[tuple[tuple[str, bytes], ...], bytes | None, bool]:
    if obj is None:
        return (), None, False
    if not isinstance(obj, dict):
        raise Malformed(f"{where}.dlq must be an object")
    raw_headers = obj.get("headers", {})
    if not isinstance(raw_headers, dict):
        raise Malformed(f"{where}.dlq.headers must be an object of strings")
    headers: list[tuple[str, bytes]] = []
    for name, value in raw_headers.items():
        # repr() escapes a lone surrogate, so the reason itself stays encodable.
        field = f"{where}.dlq.headers[{name!r}]"
        if not isinstance(value, str):
            raise Malformed(f"{field} must be a string")
        _checked_text(name, f"{field} (the name)")
        try:
            headers.append((name, value.encode("utf-8")))
        except UnicodeEncodeError:
            raise Malformed(f"{field} is not valid Unicode text (a lone surrogate)") from None
    if "value_b64" not in obj:
        return tuple(headers), None, False
    encoded = obj["value_b64"]
    if encoded is None:
        return tuple(headers), None, True
    if not isinstance(encoded, str):
        raise Malformed(f"{where}.dlq.value_b64 must be a base64 string or null")
    try:
        value = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Malformed(f"{where}.dlq.value_b64 is not valid base64") from exc
    return tuple(headers), value, True


# A Kafka topic name is at most 249 characters; a longer `dlq.topic` is no name at all.
_TOPIC_NAME_MAX = 249


def parse_dlq_topic(obj: object, where: str) -> str | None:
    """The DLQ topic a reject names (``dlq.topic``); whether it may is the sidecar's routes' call."""
    if not isinstance(obj, dict):
        return None  # no dlq object (a bad one is parse_dlq's error)
    topic = obj.get("topic")
    if topic is None:
        return None
    if not isinstance(topic, str) or not topic or len(topic) > _TOPIC_NAME_MAX:
        raise Malformed(f"{where}.dlq.topic must be a topic name (1..249 characters) or null")
    return _checked_text(topic, f"{where}.dlq.topic")


def _answer_from_object(
    obj: dict[str, object], where: str, fallback: AckWord, fallback_error: AppError | None
) -> Answer:
    """An Answer from one JSON answer object; ``fallback`` applies when it has no ``ack``."""
    error = parse_error(obj.get("error"), where)
    retry_after_ms = parse_retry_after(obj.get("retry_after_ms"), where)
    ack_word = obj.get("ack")
    if ack_word is None:
        ack: AckWord = fallback
        reason = f"status ({fallback})"
    elif not isinstance(ack_word, str) or ack_word not in ANSWER_ACKS:
        raise Malformed(f"{where}.ack names an unknown ack {ack_word!r}")
    else:
        ack = cast(AckWord, ack_word)
        reason = f"JSON ack {ack}"
    dlq_headers, dlq_value, dlq_value_set = parse_dlq(obj.get("dlq"), where)
    dlq_topic = parse_dlq_topic(obj.get("dlq"), where)
    if error is None and ack != "accept":
        # A JSON release under a 5xx without its own error still says what went wrong.
        error = fallback_error
    return Answer(
        ack,
        error,
        retry_after_ms,
        dlq_headers,
        dlq_value,
        dlq_value_set,
        reason,
        dlq_topic,
    )


def load_json(body: bytes) -> object:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise Malformed(f"invalid JSON: {exc}") from exc


def interpret_single(
    status: int,
    headers: HeaderList,
    body: bytes,
    mapping: Mapping[int, str] | None = None,
    *,
    now_epoch_s: float | None = None,
) -> Answer:
    """Turn the app's HTTP answer to a single-mode delivery into an :class:`Answer`.

    Precedence (docs/app-contract.md): a JSON body's ``ack`` wins; else the status (after ``mapping``).
    A body declared as JSON that does not parse, is not an object, or names an unknown ack is
    a release with a ``sidecar.MalformedAnswer`` error — never an accept, whatever the status.
    An empty body is no body, whatever its Content-Type.
    """
    status_ack = _status_ack(status, mapping or {})
    content_type = _header(headers, b"content-type")
    status_error = None if 200 <= status < 300 else _status_error(status, content_type, body)
    retry_after_ms = None
    if status in (429, 503) and status_ack == "release":
        retry_after_ms = parse_retry_after_ms(_header(headers, b"retry-after"), now_epoch_s)
    if _is_json(content_type) and body.strip():
        try:
            obj = load_json(body)
            if not isinstance(obj, dict):
                raise Malformed(f"answer must be a JSON object, got {type(obj).__name__}")
            answer = _answer_from_object(obj, "answer", status_ack, status_error)
        except Malformed as exc:
            return _malformed_answer(f"{exc} under status {status}")
        if answer.retry_after_ms is None and retry_after_ms is not None:
            answer = _with_retry_after(answer, retry_after_ms)
        return answer
    reason = f"status {status}"
    if mapping and status in mapping:
        reason = f"status {status} mapped to {status_ack}"
    return Answer(status_ack, status_error, retry_after_ms, reason=reason)


def _with_retry_after(answer: Answer, retry_after_ms: int) -> Answer:
    return Answer(
        answer.ack,
        answer.error,
        retry_after_ms,
        answer.dlq_headers,
        answer.dlq_value,
        answer.dlq_value_set,
        answer.reason,
        answer.dlq_topic,
    )


def interpret_batch(
    status: int,
    headers: HeaderList,
    body: bytes,
    ids: Iterable[str],
    mapping: Mapping[int, str] | None = None,
    *,
    now_epoch_s: float | None = None,
) -> dict[str, Answer]:
    """Turn the app's answer to a batch delivery into one :class:`Answer` per delivery id.

    A 2xx JSON body ``{"results": [...]}`` answers per record; a record it does not list is
    released; an entry with a bad ack releases only that record; an unknown id is ignored and
    the first entry for a repeated id wins. Without a JSON body the status answers for all
    (2xx accept, 202 deferred, 400/422 reject, else release). A malformed body releases all.
    """
    wanted = list(ids)
    whole = interpret_single(status, headers, b"", mapping, now_epoch_s=now_epoch_s)
    content_type = _header(headers, b"content-type")
    if not (200 <= status < 300 and _is_json(content_type) and body.strip()):
        if not 200 <= status < 300:
            whole = Answer(
                whole.ack,
                _status_error(status, content_type, body),
                whole.retry_after_ms,
                reason=whole.reason,
            )
        return dict.fromkeys(wanted, whole)
    try:
        obj = load_json(body)
        if not isinstance(obj, dict) or not isinstance(obj.get("results"), list):
            raise Malformed("batch answer must be an object with a 'results' list")
        results = cast(list[object], obj["results"])
    except Malformed as exc:
        return dict.fromkeys(wanted, _malformed_answer(f"{exc} under status {status}"))
    wanted_set = set(wanted)
    answers: dict[str, Answer] = {}
    for index, entry in enumerate(results):
        where = f"results[{index}]"
        if not isinstance(entry, dict):
            continue
        delivery_id = entry.get("id")
        if not isinstance(delivery_id, str) or delivery_id not in wanted_set:
            continue
        if delivery_id in answers:
            continue
        try:
            if "ack" not in entry:
                raise Malformed(f"{where}.ack is missing")
            answers[delivery_id] = _answer_from_object(entry, where, "release", None)
        except Malformed as exc:
            answers[delivery_id] = _malformed_answer(str(exc))
    missing = Answer("release", reason="missing from the batch answer")
    return {delivery_id: answers.get(delivery_id, missing) for delivery_id in wanted}
