"""Text that must become bytes later: the one UTF-8 check.

A Python ``str`` may hold a lone surrogate (JSON's ``\\ud800`` escape is valid JSON, YAML and the
environment can carry one too) that no UTF-8 encoder accepts; every string the sidecar will hand
to Kafka or the app is checked with :func:`has_utf8` first.

Imports the standard library only.
"""

from __future__ import annotations

__all__ = ["has_utf8"]


def has_utf8(text: str) -> bool:
    """True when ``text`` has a UTF-8 encoding (no lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
