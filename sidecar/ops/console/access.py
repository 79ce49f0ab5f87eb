"""Who may write, and what one request may ask for: the console's token, sessions, CSRF and limits.

Owns `Access` (sessions, CSRF and the request limits: its docstring) and `load_token`. Tokens are
compared in constant time and never logged.

Imports: the standard library and `sidecar.ops.dlq.errors` only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.ops.dlq.errors import UsageError

TOKEN_ENV = "DLQ_CONSOLE_TOKEN"
SESSION_COOKIE = "dlq_console_session"
ANONYMOUS = "anonymous"

# What one request may ask for.
MAX_BODY_BYTES = 64 * 1024
MAX_PAGE_SIZE = 200
MAX_SCAN_PER_PAGE = 50_000
MAX_SELECTED = 500
MAX_REDRIVE_RECORDS = 100_000
MAX_RATE_PER_S = 5_000.0
MAX_RUNNING_REDRIVES = 2
MAX_SESSIONS = 1_000
MAX_WHO_CHARS = 80


def load_token(token_file: str | None, *, read_only: bool) -> tuple[str | None, bool]:
    """(token, generated): from `token_file`, else $DLQ_CONSOLE_TOKEN, else a new one; None when
    `read_only`."""
    if read_only:
        return None, False
    if token_file:
        try:
            text = Path(token_file).read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {token_file}: {exc.strerror}") from None
        if not text:
            raise UsageError(f"--token-file {token_file} is empty")
        return text, False
    env = os.environ.get(TOKEN_ENV, "").strip()
    if env:
        return env, False
    return secrets.token_urlsafe(24), True


@dataclass(slots=True)
class Access:
    """The token, the open sessions and the CSRF key of one console process.

    Anything that writes (a redrive) needs a session, opened by posting the token (generated and printed at
    start, or read from a file or `DLQ_CONSOLE_TOKEN`); a read-only console has no token and no session
    ever opens. The session is a random id in an HttpOnly, SameSite=Strict cookie, mapped here to the name
    the operator gave (the "who" of the redrive's log line and `__dlq.replay.by` header). Every POST carries
    a CSRF field, an HMAC of the session id (or of "anonymous") under a key made at start, and a POST whose
    Origin is another host is refused. Tokens are compared in constant time and never logged.
    """

    token: str | None
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _sessions: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def read_only(self) -> bool:
        return self.token is None

    def login(self, token: str, who: str) -> str | None:
        """A new session id when `token` is the console's, else None."""
        if self.token is None or not hmac.compare_digest(token.encode(), self.token.encode()):
            return None
        session = secrets.token_urlsafe(24)
        with self._lock:
            if len(self._sessions) >= MAX_SESSIONS:
                self._sessions.pop(next(iter(self._sessions)))
            self._sessions[session] = who.strip()[:MAX_WHO_CHARS] or "unnamed operator"
        return session

    def logout(self, session: str | None) -> None:
        with self._lock:
            self._sessions.pop(session or "", None)

    def who(self, session: str | None) -> str | None:
        """The operator of an open session, or None."""
        if not session:
            return None
        with self._lock:
            return self._sessions.get(session)

    def csrf(self, session: str | None) -> str:
        """The CSRF value the forms of this session (or of an anonymous visitor) carry."""
        subject = session if self.who(session) is not None else ANONYMOUS
        return hmac.new(self._key, (subject or ANONYMOUS).encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session: str | None, value: str) -> bool:
        return hmac.compare_digest(self.csrf(session).encode(), value.encode())


__all__ = [
    "MAX_BODY_BYTES",
    "MAX_PAGE_SIZE",
    "MAX_RATE_PER_S",
    "MAX_REDRIVE_RECORDS",
    "MAX_RUNNING_REDRIVES",
    "MAX_SCAN_PER_PAGE",
    "MAX_SELECTED",
    "SESSION_COOKIE",
    "TOKEN_ENV",
    "Access",
    "load_token",
]
