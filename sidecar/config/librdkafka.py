"""The properties under ``kafka:`` checked by librdkafka itself, before anything runs.

Owns `check_properties`: a name or value librdkafka refuses is reported with the key's path at
``check-config`` and at ``run`` start, not by the consumer's constructor (how, and what librdkafka
would take silently: its docstring). Nothing here keeps a list of property names.

Imports: the standard library, `sidecar.config.errors`, `sidecar.config.masking` and
`sidecar.config.suggest` (librdkafka through ctypes, never confluent_kafka).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.metadata
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.config.errors import Invalid
from sidecar.config.masking import is_secret_kafka_property
from sidecar.config.suggest import closest

_CONF_UNKNOWN = -2
_CONF_OK = 0
_ERRSTR_BYTES = 512
_INTEGER = re.compile(r"\s*[-+]?[0-9]+\s*")
_TYPE = re.compile(r"\*Type: ([^*]+)\*")
_PRODUCER, _CONSUMER = 0, 1  # rd_kafka_type_t
_DESTROY_F_NO_CONSUMER_CLOSE = 0x8
# What the check's clients are built with on top of the file's properties: no broker to connect
# to, no log of their own, no Kerberos ticket refresh (kinit), and the consumer's offset settings
# as the sidecar sets them.
_CHECK_CLIENT = {
    "bootstrap.servers": "",
    "log_level": "0",
    "sasl.kerberos.min.time.before.relogin": "0",
}
_SIDECAR_CONSUMER = {"enable.auto.commit": "false", "enable.auto.offset.store": "false"}


@dataclass(frozen=True, slots=True)
class _Property:
    name: str
    kind: str  # librdkafka's "Type:" (integer, string, boolean, enum value, CSV flags, float, ...)
    range: str  # librdkafka's "Range" column: "1 .. 3600000", or the enum's words


@dataclass(frozen=True, slots=True)
class _Library:
    lib: ctypes.CDLL
    properties: Mapping[str, _Property]

    def errors(self, props: Mapping[str, str]) -> list[tuple[str, int, str]]:
        """Each property librdkafka refuses: (name, result, reason), in `props` order."""
        lib = self.lib
        conf = lib.rd_kafka_conf_new()
        if not conf:
            return []
        refused: list[tuple[str, int, str]] = []
        try:
            errstr = ctypes.create_string_buffer(_ERRSTR_BYTES)
            for name, value in props.items():
                result = lib.rd_kafka_conf_set(
                    conf, name.encode(), value.encode(), errstr, _ERRSTR_BYTES
                )
                if result != _CONF_OK:
                    reason = errstr.value.decode(errors="replace").strip()
                    refused.append((name, result, reason))
        finally:
            lib.rd_kafka_conf_destroy(conf)
        return refused

    def client_error(self, kind: int, props: Mapping[str, str]) -> str | None:
        """What ``rd_kafka_new`` refuses for a client of `kind` with `props` (None: it builds).

        The client is built with no brokers to reach and its log off, and destroyed at once: it
        checks what only a whole configuration can say (a CA file that cannot be read, a SASL
        mechanism without its credentials, `acks` against idempotence) without connecting anywhere.
        """
        lib = self.lib
        conf = lib.rd_kafka_conf_new()
        if not conf:
            return None
        errstr = ctypes.create_string_buffer(_ERRSTR_BYTES)
        for name, value in {**props, **_CHECK_CLIENT}.items():
            if lib.rd_kafka_conf_set(conf, name.encode(), value.encode(), errstr, _ERRSTR_BYTES):
                lib.rd_kafka_conf_destroy(conf)
                return None  # reported property by property
        client = lib.rd_kafka_new(kind, conf, errstr, _ERRSTR_BYTES)
        if not client:
            lib.rd_kafka_conf_destroy(conf)  # rd_kafka_new owns the configuration only on success
            return errstr.value.decode(errors="replace").strip() or "librdkafka refused it"
        lib.rd_kafka_destroy_flags(client, _DESTROY_F_NO_CONSUMER_CLOSE)
        return None

    def kept(self, name: str, value: str) -> str | None:
        """The value librdkafka keeps for `name` once set to `value` (None if it cannot say)."""
        lib = self.lib
        conf = lib.rd_kafka_conf_new()
        if not conf:
            return None
        try:
            errstr = ctypes.create_string_buffer(_ERRSTR_BYTES)
            if lib.rd_kafka_conf_set(conf, name.encode(), value.encode(), errstr, _ERRSTR_BYTES):
                return None
            out = ctypes.create_string_buffer(_ERRSTR_BYTES)
            size = ctypes.c_size_t(_ERRSTR_BYTES)
            if lib.rd_kafka_conf_get(conf, name.encode(), out, ctypes.byref(size)) != _CONF_OK:
                return None
            return out.value.decode(errors="replace")
        finally:
            lib.rd_kafka_conf_destroy(conf)


def library_path() -> str | None:
    """The librdkafka shared library the confluent-kafka wheel ships (None when not found)."""
    try:
        files = importlib.metadata.files("confluent-kafka") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.startswith("librdkafka") and ".so" in file.name:
            return str(file.locate())
    return None


def _property_table(lib: ctypes.CDLL) -> dict[str, _Property]:
    """librdkafka's own table of properties (the text it prints as CONFIGURATION.md)."""
    libc = ctypes.CDLL(None)
    libc.fdopen.restype = ctypes.c_void_p
    libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.TemporaryFile() as out:
        stream = libc.fdopen(os.dup(out.fileno()), b"w")
        if not stream:
            return {}
        lib.rd_kafka_conf_properties_show(stream)
        libc.fclose(stream)
        out.seek(0)
        text = out.read().decode(errors="replace")
    table: dict[str, _Property] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) < 6 or not cells[0] or cells[0] == "Property" or cells[0].startswith("-"):
            continue
        kind = _TYPE.search(line)
        table.setdefault(cells[0], _Property(cells[0], kind.group(1) if kind else "", cells[2]))
    return table


@functools.cache
def _library() -> _Library | None:
    path = library_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_new.argtypes = []
    lib.rd_kafka_conf_destroy.restype = None
    lib.rd_kafka_conf_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_conf_set.restype = ctypes.c_int
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.rd_kafka_conf_get.restype = ctypes.c_int
    lib.rd_kafka_conf_get.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_size_t),
    ]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy_flags.restype = None
    lib.rd_kafka_destroy_flags.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_conf_properties_show.restype = None
    lib.rd_kafka_conf_properties_show.argtypes = [ctypes.c_void_p]
    return _Library(lib, _property_table(lib))


def _text(value: str | int | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _settable(prop: _Property) -> bool:
    # Callbacks and pointers are set through their own functions, never from a file.
    return prop.kind not in {"see dedicated API", "pointer"}


def _unknown(lib: _Library, name: str, reason: str) -> str:
    names = [p.name for p in lib.properties.values() if _settable(p)]
    guess = closest(name, names)
    hint = f"; did you mean '{guess}'?" if guess else ""
    return f"librdkafka: {reason}{hint}"


def _refused(lib: _Library, name: str, value: str, reason: str) -> str:
    if is_secret_kafka_property(name) and value:
        reason = reason.replace(value, "***")
    prop = lib.properties.get(name)
    if prop is not None and prop.kind == "enum value" and prop.range:
        words = [w.strip() for w in prop.range.split(",") if w.strip()]
        guess = closest(value, words)
        hint = f"; did you mean '{guess}'?" if guess and guess != value else ""
        return f"librdkafka: {reason}; it takes one of: {', '.join(words)}{hint}"
    return f"librdkafka: {reason}"


def _integer_problem(lib: _Library, name: str, value: str) -> str | None:
    prop = lib.properties.get(name)
    if prop is None or prop.kind != "integer":
        return None
    if not _INTEGER.fullmatch(value):
        if value[:1].isdigit() or value[:1] in "+-":
            kept = lib.kept(name, value)
            read = f" (librdkafka would read it as {kept})" if kept is not None else ""
            return f"expected a whole number, got {value!r}{read}"
        return None  # librdkafka refused it already, or it is an alias's word (acks: all)
    kept = lib.kept(name, value)
    if kept is not None and _INTEGER.fullmatch(kept) and int(kept) != int(value):
        where = f" ({prop.range})" if prop.range else ""
        return f"{int(value)} is outside librdkafka's range{where}; it would keep {kept}"
    return None


def check_properties(props: Mapping[str, str | int | bool], path: str) -> None:
    """Raise `Invalid` for the first property (under `path`) librdkafka would refuse or misread.

    Each property is set, in the file's order, on a fresh librdkafka
    configuration object of the librdkafka the confluent-kafka wheel ships (``rd_kafka_conf_set``,
    through `ctypes`), so a name librdkafka does not know, or a value it refuses (a wrong enum word, a
    bool that is not true/false, a number out of its range), is the reason librdkafka gives, with the
    key's path, at ``check-config`` and at ``run`` start — not an exception from the consumer's
    constructor once the service is starting. Two things librdkafka takes silently are refused too, since
    they would make a client that misbehaves for ever: an integer property with trailing text
    (``session.timeout.ms: "45s"``, which librdkafka reads as 45 ms) and one past librdkafka's integer
    range (which it wraps). Then a consumer and a producer are built from the whole set, with no broker
    to reach, and destroyed at once: what ``rd_kafka_new`` refuses (SASL without credentials, `acks`
    against idempotence, a setting the group protocol does not take) is reported the same way. That
    build leaves out the properties that name files (they may exist only in the pod: at run time the
    start-up check reports and retries them) and is skipped with OIDC (its client fetches a token). The "did you mean" picks from librdkafka's own property list
    (``rd_kafka_conf_properties_show``), read once; nothing here keeps a list of property names.

    The library is found through the confluent-kafka distribution's file list, without importing
    confluent_kafka (the one Kafka boundary stays `sidecar.kafka`); when it cannot be loaded the check is
    skipped and the consumer's constructor reports what it refuses.
    """
    lib = _library()
    if lib is None:
        return
    texts = {name: _text(value) for name, value in props.items()}
    for name, result, reason in lib.errors(texts):
        key_path = f"{path}.{name}" if path else name
        if result == _CONF_UNKNOWN:
            raise Invalid(key_path, _unknown(lib, name, reason))
        raise Invalid(key_path, _refused(lib, name, texts[name], reason))
    for name, value in props.items():
        if isinstance(value, bool):
            continue
        problem = _integer_problem(lib, name, _text(value))
        if problem is not None:
            raise Invalid(f"{path}.{name}" if path else name, problem)
    if not _buildable(texts):
        return
    # `debug` would turn the check clients' log back on (on stderr); its value is checked above.
    checked = {n: v for n, v in texts.items() if not _names_a_file(n) and n != "debug"}
    for kind, extra, what in (
        (_CONSUMER, _SIDECAR_CONSUMER, "consumer"),
        (_PRODUCER, {}, "producer"),
    ):
        refused = lib.client_error(kind, {**checked, **extra})
        if refused is not None:
            raise Invalid(
                _blamed(refused, texts, path), f"librdkafka refuses the {what}: {refused}"
            )


def _names_a_file(name: str) -> bool:
    """A property naming a file (a CA, a certificate, a key, a keytab): left out of the build check.

    Those files are read when a client is built, and may not be there yet where the file is checked (a
    Secret mounted only in the pod); at run time a file that cannot be read is the start-up check's
    reason, retried until it can be (a Secret volume updated in place).
    """
    return name.endswith((".location", ".keytab")) or name == "plugin.library.paths"


def _buildable(props: Mapping[str, str]) -> bool:
    """False when building a client would reach out (OIDC fetches a token when the client starts)."""
    return props.get("sasl.oauthbearer.method", "").strip().lower() != "oidc"


def _blamed(reason: str, props: Mapping[str, str], path: str) -> str:
    """The path of the property `reason` names first (the section's path if it names none)."""
    named = [(reason.find(name), name) for name in props if reason.find(name) >= 0]
    if not named:
        return path
    name = min(named, key=lambda hit: (hit[0], -len(hit[1])))[1]
    return f"{path}.{name}" if path else name


def property_names() -> frozenset[str]:
    """Every property name librdkafka takes from a file (empty when the library is not found)."""
    lib = _library()
    if lib is None:
        return frozenset()
    return frozenset(p.name for p in lib.properties.values() if _settable(p))
