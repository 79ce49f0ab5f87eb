"""Structured logging: JSON, logfmt or plain text lines on stderr.

Owns the log format only. Record payloads are never logged here; callers decide what goes in `fields`
(and the engine includes payloads only with `errors.log.include.messages: true`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    out: dict[str, Any] = {}
    extra = record.__dict__.get("fields")
    if isinstance(extra, dict):
        out.update(extra)
    for key, value in record.__dict__.items():
        if key not in _RESERVED and key != "fields":
            out[key] = value
    return out


def _timestamp(record: logging.LogRecord) -> str:
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        + f".{int(record.msecs):03d}Z"
    )


class _FieldsFormatter(logging.Formatter):
    """A record as one mapping (time, level, logger, message, its fields, the exception)."""

    def _doc(self, record: logging.LogRecord) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_fields(record))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return doc


class JsonFormatter(_FieldsFormatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(self._doc(record), default=str, ensure_ascii=False)


def _logfmt_value(value: Any) -> str:
    text = "null" if value is None else str(value)
    if text == "" or any(c in text for c in ' ="\\\n\t'):
        return json.dumps(text, ensure_ascii=False)
    return text


class LogfmtFormatter(_FieldsFormatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in self._doc(record).items())


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = _fields(record)
        tail = " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())
        line = f"{_timestamp(record)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if tail:
            line = f"{line} {tail}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def resolved_format(fmt: str, stream: Any) -> str:
    """`auto` is text on a terminal (a person reads it) and json elsewhere (a log collector)."""
    if fmt != "auto":
        return fmt
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def setup_logging(
    level: str = "info", fmt: str = "auto", *, librdkafka_debug: bool = False
) -> None:
    """One handler on stderr in `fmt` (`auto`: see `resolved_format`); librdkafka's lines from
    warnings up, or all of them with `librdkafka_debug` (the config sets `kafka.debug`: the user
    asked for librdkafka's debug lines)."""
    formatter: logging.Formatter = {"json": JsonFormatter, "logfmt": LogfmtFormatter}.get(
        resolved_format(fmt, sys.stderr), TextFormatter
    )()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # librdkafka's own log lines are chatty at info; keep its warnings.
    floor = logging.DEBUG if librdkafka_debug else max(logging.WARNING, root.level)
    logging.getLogger("sidecar.librdkafka").setLevel(floor)
