"""The syntax of single values that are checked in more than one place.

Owns Kafka topic names (Kafka's own `Topic.validate` rules), loopback hosts, listen addresses
(``host:port``, ``[v6]:port``, ``unix:/path``, `ListenAddress`), Unix socket paths and the app URL
(its HTTP request target and Host header). Each check returns or raises a plain reason; which key
it belongs to is the caller's business. `api.py` uses `is_loopback_host` at run time.

Imports: the standard library only; nothing else of `sidecar.config`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal, TypeAlias
from urllib.parse import urlsplit

ListenAddress: TypeAlias = tuple[Literal["tcp"], str, int] | tuple[Literal["unix"], str]

# sun_path is 108 bytes on Linux, one of which is the terminating NUL.
_UNIX_PATH_MAX_BYTES = 107
_TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]+")
_TOPIC_MAX_LEN = 249
_HOSTNAME = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
)


def topic_name_error(name: str) -> str | None:
    """Why `name` is not a legal Kafka topic name (Kafka's own `Topic.validate` rules), or None."""
    if not name:
        return "a topic name must not be empty"
    if name in (".", ".."):
        return "a topic name must not be '.' or '..'"
    if len(name) > _TOPIC_MAX_LEN:
        return f"a topic name is at most {_TOPIC_MAX_LEN} characters, got {len(name)}"
    if not _TOPIC_CHARS.fullmatch(name):
        return "a topic name may contain only ASCII letters, digits, '.', '_' and '-'"
    return None


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (127.0.0.0/8, ::1)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def unix_path_error(path: str) -> str | None:
    if not path:
        return "a Unix socket path must not be empty"
    if "\x00" in path:
        return "a Unix socket path must not contain NUL"
    size = len(path.encode("utf-8", "surrogateescape"))
    if size > _UNIX_PATH_MAX_BYTES:
        return f"a Unix socket path is at most {_UNIX_PATH_MAX_BYTES} bytes, got {size}"
    return None


def _port_from(text: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise ValueError(f"the port must be a decimal number, got {text!r}")
    port = int(text)
    if port > 65535:
        raise ValueError(f"the port must be in 0..65535, got {port}")
    return port


def parse_listen(value: str) -> ListenAddress:
    """Parse ``host:port``, ``[v6]:port`` or ``unix:/path`` into ``("tcp", host, port)`` /
    ``("unix", path)``. Port 0 asks the OS for a free port. Raises ValueError with the reason."""
    if value.startswith("unix:"):
        path = value[len("unix:") :]
        problem = unix_path_error(path)
        if problem:
            raise ValueError(problem)
        return ("unix", path)
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"expected '[address]:port' or 'unix:/path', got {value!r}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IPv6 address") from None
        return ("tcp", host, _port_from(rest[1:]))
    host, sep, port_text = value.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected 'host:port', '[address]:port' or 'unix:/path', got {value!r}")
    if ":" in host:
        raise ValueError(f"write an IPv6 address in brackets, e.g. '[::1]:8787', got {value!r}")
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"{host!r} is not a valid host name or address")
    return ("tcp", host, _port_from(port_text))


# RFC 3986 origin-form: an absolute path and an optional query, of unreserved characters,
# sub-delims, ':', '@' (and '/', '?' in the query) and %XX escapes. Anything else (a space, a
# quote, '|', non-ASCII) would be refused by the request formatter or by the app's HTTP parser.
_PCHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})"
_REQUEST_TARGET = re.compile(rf"/(?:{_PCHAR}|/)*(?:\?(?:{_PCHAR}|[/?])*)?")


def _check_request_target(target: str) -> str:
    if not _REQUEST_TARGET.fullmatch(target):
        raise ValueError(
            f"{target!r} is not a valid HTTP request target: use visible ASCII without spaces, "
            "and percent-encode anything else (a space is %20)"
        )
    return target


def split_app_url(url: str, unix_socket: str | None) -> tuple[str, int, str]:
    """(host, port, request target) of the app URL, or ValueError with the reason."""
    if not (url.isascii() and url.isprintable()) or " " in url:
        # Checked before urlsplit, which silently deletes TAB, CR and LF from a URL.
        raise ValueError(
            f"the URL must be visible ASCII without spaces, got {url!r}: an HTTP request target "
            "cannot carry anything else; percent-encode it (a space is %20)"
        )
    if unix_socket is not None and url.startswith("/"):
        if url.startswith("//"):
            raise ValueError(f"a request path must not start with '//', got {url!r}")
        target, _, fragment = url.partition("#")
        if fragment:
            raise ValueError("the URL must not have a #fragment")
        return "localhost", 80, _check_request_target(target)
    parts = urlsplit(url)
    if parts.scheme == "https":
        raise ValueError(
            "https is not supported: the app is reached over loopback or a Unix socket only; "
            "use http://"
        )
    if parts.scheme != "http":
        hint = " or a path such as '/records'" if unix_socket is not None else ""
        raise ValueError(f"expected an http://host:port/path URL{hint}, got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the URL must not contain user information")
    if parts.fragment:
        raise ValueError("the URL must not have a #fragment")
    host = parts.hostname
    if not host:
        raise ValueError(f"the URL has no host: {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"the URL has an invalid port: {url!r}") from None
    if unix_socket is None and not is_loopback_host(host):
        raise ValueError(
            f"the app must be on loopback (localhost, 127.0.0.1, ::1) or a Unix socket, got {host!r}"
        )
    target = parts.path or "/"
    if parts.query:
        target = f"{target}?{parts.query}"
    return host, 80 if port is None else port, _check_request_target(target)
