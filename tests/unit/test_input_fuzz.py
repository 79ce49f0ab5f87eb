"""Fuzzing the parsers of untrusted input: the app's answers, the ack API body, the config file.

The invariant, stated once: a parser either returns a value or raises its documented error (the
answer parsers never raise; `parse_ack_request` raises only WireError; the config loader only
ConfigError), and what it returns is safe to use: every string that will become bytes has a
UTF-8 encoding, numbers are in range, and a Config it accepts is one the request formatter
accepts too. Bounded so the file runs in seconds: no deadline (a loaded machine must not fail a
test for being slow) and few examples per property.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.config import Config, ConfigError, dump_config, load_config, parse_config
from sidecar.core.wire import (
    ACK_REQUEST_WORDS,
    MALFORMED_ANSWER,
    MAX_RETRY_AFTER_MS,
    AckItem,
    Answer,
    AppError,
    WireError,
    format_batch_request,
    format_single_request,
    interpret_batch,
    interpret_single,
    parse_ack_request,
    parse_retry_after_ms,
)
from tests.unit.test_wire import make_record

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# Characters that broke a parser once, or could: lone surrogates, controls, a non-ASCII digit,
# quotes and escapes; mixed with anything Hypothesis picks (which rarely picks a surrogate).
NASTY = [*"aZ09 -_.:/\t\r\n\x00\x7f\"'\\{}[]%$é€😀²\u2028\ufeff", "\ud800", "\udfff", "\udc80"]
SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc80", "\udfff"])
TEXT = st.text(st.one_of(st.sampled_from(NASTY), st.characters(), SURROGATES), max_size=12)


def _utf8(text: str) -> None:
    text.encode("utf-8")  # UnicodeEncodeError, failing the property, when it has no encoding


# ---------------------------------------------------------------------------------------------
# The app's answers and the ack API body

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**400, -(10**30), 2**63, 1e308, -0.0, 0.5])
    | st.floats(allow_nan=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
# Each field is mostly well-formed, so that examples get past the first check to the next one.
_ERROR = st.fixed_dictionaries(
    {}, optional={"class": TEXT | JSON_VALUES, "message": TEXT, "stacktrace": st.none() | TEXT}
)
ERRORS = st.one_of(_ERROR, _ERROR, st.none(), JSON_VALUES)
_DLQ = st.fixed_dictionaries(
    {},
    optional={
        "headers": st.one_of(
            st.dictionaries(TEXT, TEXT, min_size=1, max_size=4),
            st.dictionaries(TEXT, TEXT | JSON_VALUES, max_size=4),
            JSON_VALUES,
        ),
        "value_b64": st.none() | st.sampled_from(["eA==", "AAE=", "!!", "eA"]) | TEXT,
    },
)
DLQ = st.one_of(_DLQ, _DLQ, st.none(), JSON_VALUES)
RETRY = st.none() | st.integers() | st.floats() | st.sampled_from([1e400, -1, "5", True])
ACK_WORDS = st.sampled_from(["accept", "release", "reject", "renew", "deferred", "ACCEPT", ""])


def answer_objects(ids: st.SearchStrategy[Any] | None = None) -> st.SearchStrategy[Any]:
    optional: dict[str, st.SearchStrategy[Any]] = {
        "ack": st.one_of(ACK_WORDS, ACK_WORDS, JSON_VALUES),
        "error": ERRORS,
        "retry_after_ms": RETRY,
        "dlq": DLQ,
    }
    if ids is not None:
        optional["id"] = ids
    return st.fixed_dictionaries({}, optional=optional)


def _dumped(obj: object, ensure_ascii: bool) -> bytes:
    # ensure_ascii=True writes a lone surrogate as the escape '\ud800' (valid JSON text); False
    # writes it raw, and surrogatepass gives the bytes ED A0 80, which json.loads also accepts.
    return json.dumps(obj, ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")


def bodies(objects: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    shaped = st.builds(_dumped, objects, st.booleans())
    return st.one_of(
        shaped,  # listed three times: most bodies should look like answers, to get past the top
        shaped,
        shaped,
        st.builds(_dumped, JSON_VALUES, st.booleans()),
        st.binary(max_size=64),
        st.sampled_from([b"", b" ", b"{", b"[" * 5000, b"1" * 5000, b'{"ack": "accept"']),
    )


CONTENT_TYPES = st.sampled_from(
    [
        *(b"application/json", b"application/json; charset=utf-8", b"application/problem+json"),
        *(b"text/plain", b"image/png", b"\xff"),
    ]
)
RETRY_AFTER = st.binary(max_size=12) | st.sampled_from(
    [
        b"\xb2",
        b"\xb9\xb3",
        b"7",
        b" 2 ",
        b"9" * 40,
        b"-5",
        b"Mon, 12 Jan 1970 13:47:10 GMT",
        b"Mon, 12 Jan 99999 13:47:10 GMT",
        b"Mon, 01 Jan 0001 00:00:00 -0000",
    ]
)
STATUSES = st.sampled_from([200, 201, 202, 204, 400, 404, 409, 422, 429, 500, 503]) | st.integers(
    100, 599
)
MAPPINGS = st.dictionaries(
    st.integers(100, 599), st.sampled_from(["accept", "release", "reject", "deferred"]), max_size=3
)


@st.composite
def response_headers(draw: st.DrawFn) -> list[tuple[bytes, bytes]]:
    headers: list[tuple[bytes, bytes]] = []
    if draw(st.integers(0, 3)):
        name = draw(st.sampled_from([b"Content-Type", b"content-type"]))
        headers.append((name, draw(CONTENT_TYPES)))
    if draw(st.booleans()):
        headers.append((b"Retry-After", draw(RETRY_AFTER)))
    others = st.tuples(st.binary(max_size=8), st.binary(max_size=8))
    headers.extend(draw(st.lists(others, max_size=2)))
    return headers


def check_error(error: AppError | None) -> None:
    if error is not None:
        _utf8(error.class_name)
        _utf8(error.message)
        if error.stacktrace is not None:
            _utf8(error.stacktrace)


def check_dlq(headers: tuple[tuple[str, bytes], ...], value: bytes | None) -> None:
    for name, header_value in headers:
        _utf8(name)
        assert isinstance(header_value, bytes)
    assert value is None or isinstance(value, bytes)


def check_answer(answer: Answer) -> None:
    assert answer.ack in ("accept", "release", "reject", "deferred")
    check_error(answer.error)
    check_dlq(answer.dlq_headers, answer.dlq_value)
    assert answer.retry_after_ms is None or 0 <= answer.retry_after_ms <= MAX_RETRY_AFTER_MS
    _utf8(answer.reason)


@given(STATUSES, response_headers(), bodies(answer_objects()), MAPPINGS)
@FUZZ
def test_interpret_single_always_returns_a_safe_answer(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes, mapping: dict[int, str]
) -> None:
    answer = interpret_single(status, headers, body, mapping, now_epoch_s=1_000_000.0)
    check_answer(answer)
    declared = [v for n, v in headers if n.lower() == b"content-type"][:1]
    if declared and declared[0].endswith(b"json") and body.strip():
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError):
            parsed = None
        if not isinstance(parsed, dict):
            # A JSON body that does not parse, or is not an object, is never an accept (docs/app-contract.md).
            assert answer.ack == "release"
            assert answer.error is not None and answer.error.class_name == MALFORMED_ANSWER


IDS = ["a", "b", "c\ud800", "d"]
BATCH_OBJECTS = st.fixed_dictionaries(
    {"results": st.lists(answer_objects(st.sampled_from(IDS) | TEXT), max_size=5)}
)


@given(
    STATUSES,
    response_headers(),
    bodies(BATCH_OBJECTS),
    st.lists(st.sampled_from(IDS), max_size=4, unique=True),
    MAPPINGS,
)
@FUZZ
def test_interpret_batch_always_answers_exactly_the_ids_asked(
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    ids: list[str],
    mapping: dict[int, str],
) -> None:
    answers = interpret_batch(status, headers, body, ids, mapping, now_epoch_s=1_000_000.0)
    assert list(answers) == ids
    for answer in answers.values():
        check_answer(answer)


ACK_BODIES = st.fixed_dictionaries(
    {"acks": st.lists(answer_objects(st.sampled_from(IDS) | TEXT | JSON_VALUES), max_size=4)}
) | st.lists(answer_objects(st.sampled_from(IDS) | TEXT), max_size=3)


@given(bodies(ACK_BODIES))
@FUZZ
def test_parse_ack_request_returns_safe_items_or_raises_wire_error(body: bytes) -> None:
    try:
        items = parse_ack_request(body)
    except WireError as exc:
        _utf8(str(exc))  # the 400's message is encodable too
        return
    for item in items:
        assert isinstance(item, AckItem)
        assert item.ack in ACK_REQUEST_WORDS
        assert item.delivery_id
        _utf8(item.delivery_id)
        check_error(item.error)
        check_dlq(item.dlq_headers, item.dlq_value)
        assert item.retry_after_ms is None or 0 <= item.retry_after_ms <= MAX_RETRY_AFTER_MS


@given(RETRY_AFTER, st.none() | st.floats(-1e12, 1e12))
@FUZZ
def test_retry_after_is_none_or_in_range(value: bytes, now: float | None) -> None:
    result = parse_retry_after_ms(value, now)
    assert result is None or 0 <= result <= MAX_RETRY_AFTER_MS


# ---------------------------------------------------------------------------------------------
# The config loader

GOOD = (
    "kafka: {bootstrap.servers: 127.0.0.1:9092, group.id: g}\n"
    "source: {topics: [orders]}\n"
    'app: {url: "http://127.0.0.1:8080/records", headers: {X-A: b}}\n'
)
# Fragments of YAML syntax, so that mutations reach the scanner, parser, composer and constructor.
YAML_BITS = st.sampled_from(
    [
        *("[", "]", "{", "}", ": ", ", ", "- ", "? ", "&a ", "*a", "<<: ", "|\n", ">\n", "'", '"'),
        *("!!int ", "!!float ", "!!bool ", "!!timestamp ", "!!binary ", "!!set ", "!!map "),
        *("!!seq ", "!!str ", "!!null ", "!foo ", "!!python/object:os.system ", "!!omap "),
        *('"\\ud800"', '"\\x00"', "\n", "\n  ", "\t", "#", "%YAML 1.1\n", "---\n", "...\n"),
        *("9" * 5000, "[" * 300, "1e999", "0x1", "${X}", "${", "$${", "~", "null", "no", "0123"),
        *("1:30", "\ufeff", "http://127.0.0.1:1/a b"),
    ]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.sampled_from([2**64, "a\tb", "x" * 300, "http://127.0.0.1:1/a b", "/r?x=\u00e4"])
    | TEXT
)


def nested(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
        max_leaves=8,
    )


YAML_VALUES = nested(SCALARS)  # what yaml.safe_dump can write
# Integers past the 4,300-digit str() limit are built, not listed: repr() of them raises.
CONFIG_VALUES = nested(SCALARS | st.integers(4290, 5001).map(lambda n: (-1) ** n * 10**n))


KEYS = ["x", "commit.interval.ms", "engine", "api", "errors.retry.delay.jitter"]
TAGS = ["!!int", "!!float", "!!bool", "!!str", "!!null", "!!seq", "!!map", "!!timestamp"]
TAGS += ["!!binary", "!!set", "!!omap", "!!pairs", "!foo", "!!python/name:os.system"]
TAGGED = st.builds(
    "{} {}".format,
    st.sampled_from(TAGS),
    st.sampled_from(["", "abc", "[1]", "{a: 1}", "0x10", "2001-01-01", "yes", "1e999", "aGk="]),
)
EDGE_VALUES = st.one_of(
    TAGGED,
    st.integers(1, 6000).map(lambda n: "[" * n),
    st.integers(1, 3000).map(lambda n: "{a: " * n),
    st.integers(4290, 5001).map(lambda n: "9" * n),
    st.sampled_from(['"\\ud800"', '"a\\tb"', '"\\x00"', "*nope", "&a [*a]"]),
)


@st.composite
def yaml_documents(draw: st.DrawFn) -> str:
    kind = draw(st.integers(0, 3))
    if kind == 0:  # the good file with fragments spliced in at random places
        text = GOOD
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(YAML_BITS | TEXT) + text[at:]
        return text
    if kind == 1:  # fragments only
        return "".join(draw(st.lists(YAML_BITS | TEXT, max_size=12)))
    if kind == 2:  # the good file and keys whose values are fragments or edge cases
        values = st.one_of(EDGE_VALUES, EDGE_VALUES, st.lists(YAML_BITS, max_size=3).map("".join))
        lines = st.builds("{}: {}\n".format, st.sampled_from(KEYS), values)
        return GOOD + "".join(draw(st.lists(lines, min_size=1, max_size=3)))
    # well-formed YAML of arbitrary values over the good file's keys
    data = yaml.safe_load(GOOD)
    data.update(draw(st.dictionaries(st.sampled_from([*data, *KEYS]), YAML_VALUES, max_size=3)))
    return yaml.safe_dump(data, allow_unicode=draw(st.booleans()))


def check_config(config: Config) -> None:
    """An accepted Config must run: the request formatter takes its target and headers."""
    app = config.app
    format_single_request(make_record(), app.authority, app.path, app.headers.items())
    format_batch_request([make_record()], app.authority, app.path, app.headers.items())
    for name, value in config.kafka.items():
        _utf8(name)
        if isinstance(value, str):
            _utf8(value)
    json.dumps(dump_config(config))


@given(yaml_documents(), st.dictionaries(st.sampled_from(["X", "KAFKA"]), TEXT, max_size=2))
@FUZZ
def test_any_yaml_document_gives_a_config_or_a_config_error(text: str, env: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory(prefix="dlq-fuzz-") as folder:
        path = Path(folder) / "c.yaml"
        path.write_bytes(text.encode("utf-8", "surrogatepass"))
        try:
            config = load_config(path, env)
        except ConfigError as error:
            assert error.reason
            return
    check_config(config)


KNOWN_PATHS: list[tuple[str, ...]] = [
    ("kafka", "group.id"),
    ("kafka", "linger.ms"),
    ("kafka", "sasl.oauthbearer.token.endpoint.url"),
    ("source", "topics"),
    ("app", "url"),
    ("app", "unix_socket"),
    ("app", "headers"),
    ("app", "status.mapping"),
    ("app", "timeout.ms"),
    ("commit.interval.ms",),
    ("errors.retry.delay.jitter",),
    ("errors.deadletterqueue.topic.name",),
    ("errors.deadletterqueue.topic.name.prefix",),
    ("tracing", "service.name"),
    ("engine",),
]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(KNOWN_PATHS), CONFIG_VALUES | st.dictionaries(TEXT, TEXT, max_size=3)
        ),
        max_size=4,
    ),
    st.dictionaries(st.sampled_from(["A", "B"]), TEXT, max_size=2),
)
@FUZZ
def test_arbitrary_values_at_known_keys_give_a_config_or_a_config_error(
    edits: list[tuple[tuple[str, ...], Any]], env: dict[str, str]
) -> None:
    data: dict[str, Any] = yaml.safe_load(GOOD)
    for key_path, value in edits:
        target = data
        for part in key_path[:-1]:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        target[key_path[-1]] = value
    try:
        config = parse_config(data, env=env)
    except ConfigError as error:
        assert error.reason and len(error.reason) < 2000
        return
    check_config(config)


@given(st.dictionaries(TEXT, TEXT, max_size=3), TEXT, st.booleans())
@FUZZ
def test_config_accepts_only_headers_and_paths_the_wire_can_send(
    headers: dict[str, str], path: str, unix: bool
) -> None:
    data: dict[str, Any] = yaml.safe_load(GOOD)
    if unix:
        data["app"] = {"url": "/" + path, "unix_socket": "/run/app.sock", "headers": headers}
    else:
        data["app"] = {"url": "http://127.0.0.1:8080/" + path, "headers": headers}
    try:
        config = parse_config(data, env={})
    except ConfigError:
        return
    check_config(config)
