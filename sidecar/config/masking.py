"""Which configuration values are secrets, by name, and how they are masked.

Owns the rules for librdkafka properties (`is_secret_kafka_property`), `app.headers` entries
(`is_secret_header`) and the userinfo of URLs inside values (``https://***@host``), used by
/v1/status and ``check-config --print`` through `sidecar.config.dump.dump_config`.

Imports: the standard library only.
"""

from __future__ import annotations

import re

# Secret masking (/v1/status, check-config --print) goes by the name, case-insensitively.
# librdkafka property names are dot-separated words: a word that contains one of these marks a
# secret (sasl.password, ssl.key.pem, ssl.keystore.location, sasl.jaas.config, x.apikey, ...).
# The word "oauthbearer" is a mechanism's name and does not count, so sasl.oauthbearer.method and
# .scope stay visible; "session" is not a marker here: session.timeout.ms is a timeout.
#
# Words that mark a secret in either kind of name (property or header).
_SECRET_WORDS = (
    "auth",
    "token",
    "secret",
    "key",
    "pass",
    "pwd",
    "credential",
    "signature",
    "cookie",
)
_SECRET_KAFKA_WORDS = (*_SECRET_WORDS, "jaas", "private")
# Secrets whose name says nothing of it: the principal/extension key=value lists of OAUTHBEARER.
_SECRET_KAFKA_NAMES = frozenset({"sasl.oauthbearer.config", "sasl.oauthbearer.extensions"})
# A header name that contains one of these anywhere (X-Auth, X-MyToken, X-Api-Key, Set-Cookie).
_SECRET_HEADER_PARTS = (*_SECRET_WORDS, "session", "csrf", "xsrf", "jwt", "private")
MASK = "***"
# The userinfo of any URL in a value (https://user:pass@host): from '://' to the authority's last
# '@' (a password may hold an unescaped '@').
_URL_USERINFO = re.compile(r"(://)[^/?#\s]*@")


def is_secret_kafka_property(name: str) -> bool:
    """True when the librdkafka property `name` holds a secret (its value is masked)."""
    lowered = name.lower()
    if lowered in _SECRET_KAFKA_NAMES:
        return True
    return any(
        marker in word
        for word in re.split(r"[._-]", lowered)
        if word != "oauthbearer"
        for marker in _SECRET_KAFKA_WORDS
    )


def is_secret_header(name: str) -> bool:
    """True when the `app.headers` entry `name` holds a secret (its value is masked)."""
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_HEADER_PARTS)


def _mask_userinfo(text: str) -> str:
    return _URL_USERINFO.sub(rf"\g<1>{MASK}@", text)


def masked_kafka(name: str, value: object) -> object:
    if isinstance(value, str) and name.lower().endswith(".url"):
        # An endpoint is worth seeing; only its credentials are secret (token.endpoint.url).
        return _mask_userinfo(value)
    if is_secret_kafka_property(name):
        return MASK
    return _mask_userinfo(value) if isinstance(value, str) else value
