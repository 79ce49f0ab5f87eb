"""The sidecar's own ack API: the ``POST /v1/acks`` body parsed into `AckItem` values, and the
response formatted.

Pure functions and frozen values (see `sidecar.core.wire`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import cast

from sidecar.core.text import has_utf8
from sidecar.core.wire.answers import (
    Malformed,
    load_json,
    parse_dlq,
    parse_dlq_topic,
    parse_error,
    parse_retry_after,
)
from sidecar.core.wire.values import ACK_REQUEST_WORDS, AckItem, AckRequestWord, WireError

__all__ = ["format_ack_response", "parse_ack_request"]


def parse_ack_request(body: bytes) -> list[AckItem]:
    """Parse a ``POST /v1/acks`` body: ``{"acks": [item, ...]}`` or a bare ``[item, ...]``.

    Each item is ``{"id", "ack": accept|release|reject|renew, "error"?, "retry_after_ms"?,
    "dlq"?}``. Raises :class:`WireError` naming the first bad field.
    """
    try:
        obj = load_json(body)
    except Malformed as exc:
        raise WireError(str(exc)) from None
    if isinstance(obj, dict):
        if "acks" not in obj:
            raise WireError("ack request must be an object with an 'acks' list, or a list")
        obj = obj["acks"]
        prefix = "acks"
    else:
        prefix = ""
    if not isinstance(obj, list):
        raise WireError("'acks' must be a list")
    items: list[AckItem] = []
    for index, entry in enumerate(obj):
        where = f"{prefix}[{index}]"
        if not isinstance(entry, dict):
            raise WireError(f"{where} must be an object")
        delivery_id = entry.get("id")
        if not isinstance(delivery_id, str) or not delivery_id:
            raise WireError(f"{where}.id must be a non-empty string")
        if not has_utf8(delivery_id):
            raise WireError(f"{where}.id is not valid Unicode text (a lone surrogate)")
        ack = entry.get("ack")
        if not isinstance(ack, str) or ack not in ACK_REQUEST_WORDS:
            raise WireError(
                f"{where}.ack must be one of {', '.join(sorted(ACK_REQUEST_WORDS))}, got {ack!r}"
            )
        try:
            error = parse_error(entry.get("error"), where)
            retry_after_ms = parse_retry_after(entry.get("retry_after_ms"), where)
            dlq_headers, dlq_value, dlq_value_set = parse_dlq(entry.get("dlq"), where)
            dlq_topic = parse_dlq_topic(entry.get("dlq"), where)
        except Malformed as exc:
            raise WireError(str(exc)) from None
        items.append(
            AckItem(
                delivery_id,
                cast(AckRequestWord, ack),
                error,
                retry_after_ms,
                dlq_headers,
                dlq_value,
                dlq_value_set,
                dlq_topic,
            )
        )
    return items


def format_ack_response(results: Iterable[tuple[str, str]]) -> bytes:
    """The ``POST /v1/acks`` response body: one ``{"id", "result": ok|already|expired|unknown}`` each."""
    return json.dumps(
        {"results": [{"id": delivery_id, "result": result} for delivery_id, result in results]},
        separators=(",", ":"),
    ).encode("utf-8")
