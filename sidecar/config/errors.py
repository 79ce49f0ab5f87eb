"""The error a configuration that cannot be used raises, and the reader's internal signal.

Owns `ConfigError` (public: the CLI prints ``str(error)`` and exits 2) and `Invalid`, which the
readers raise with a dotted path and a reason and `sidecar.config.load` turns into `ConfigError`
with the file name.

Imports: only `sidecar.core.errors` (the root error); not the rest of `sidecar.config`.
"""

from __future__ import annotations

from sidecar.core.errors import SidecarError


class ConfigError(SidecarError):
    """A configuration file that cannot be used, with the key's dotted path and the reason.

    ``str(err)`` is ``"<file>: <path>: <reason>"``; `path` is e.g. ``app.timeout.ms``,
    ``source.topics[1]`` or, for YAML syntax errors, ``line 3, column 7`` (also in `line` and
    `column`, 1-based). `path` is ``""`` for problems with the file as a whole.
    """

    def __init__(
        self,
        path: str,
        reason: str,
        *,
        file: str = "<config>",
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason
        self.file = file
        self.line = line
        self.column = column

    def __str__(self) -> str:
        if self.path:
            return f"{self.file}: {self.path}: {self.reason}"
        return f"{self.file}: {self.reason}"


class Invalid(Exception):
    """Raised inside the reader; turned into `ConfigError` (with the file name) at the boundary."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason
