"""`${ENV}` substitution in configuration text, and the rule that every value has a UTF-8 encoding.

``${NAME}`` and ``${NAME:-default}`` (shell semantics: an empty variable also takes the default),
``$${`` for a literal ``${``; a ``${`` without its ``}`` is an error, not literal text. `ReadContext`
carries the environment through one read; `expand` also says whether the text was exactly one
reference, which lets a typed key convert it (environment variables are always text).

Imports: the standard library, `sidecar.config.errors` and `sidecar.core.text` (the UTF-8 check) only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sidecar.config.errors import Invalid
from sidecar.core.text import has_utf8


def encodable(text: str, path: str) -> str:
    """`text`, if it has a UTF-8 encoding: every value ends up in librdkafka, a header or a log line."""
    if not has_utf8(text):
        raise Invalid(
            path,
            "has no UTF-8 encoding: it holds a lone surrogate (from a YAML '\\uD800' escape or a "
            "non-UTF-8 environment variable)",
        )
    return text


# `$${` is the escape for a literal `${`; a `${` without its `}` is an error, not literal text.
_REFERENCE = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_WHOLE_REFERENCE = re.compile(r"\$\{[^}]*\}")
_REFERENCE_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ReadContext:
    env: Mapping[str, str]
    # What the reading noted without failing: deprecated key names (`Config.deprecations`).
    notes: list[str] = field(default_factory=list)

    def expand(self, text: str, path: str) -> tuple[str, bool]:
        """`text` with `${NAME}` / `${NAME:-default}` substituted, and whether `text` was exactly
        one reference (then a typed key may convert it)."""
        if "$" not in text:
            return encodable(text, path), False
        pieces: list[str] = []
        pos = 0
        for match in _REFERENCE.finditer(text):
            pieces.append(text[pos : match.start()])
            pos = match.end()
            token = match.group(0)
            if token == "$${":
                pieces.append("${")
                continue
            body = match.group(1)
            if body is None:
                raise Invalid(path, "unterminated '${' (write '$${' for a literal '${')")
            pieces.append(self._resolve(body, path))
        pieces.append(text[pos:])
        return encodable("".join(pieces), path), _WHOLE_REFERENCE.fullmatch(text) is not None

    def _resolve(self, body: str, path: str) -> str:
        match = _REFERENCE_BODY.fullmatch(body)
        if match is None:
            raise Invalid(
                path, f"malformed reference '${{{body}}}': expected ${{NAME}} or ${{NAME:-default}}"
            )
        name, default = match.group(1), match.group(2)
        value = self.env.get(name)
        if default is not None:
            # Shell semantics of ':-': an empty variable also takes the default.
            return value if value else default
        if value is None:
            raise Invalid(
                path,
                f"environment variable {name} is not set (use ${{{name}:-default}} for a default)",
            )
        return value
