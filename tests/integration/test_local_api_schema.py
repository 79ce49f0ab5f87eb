"""The local API against openapi.yaml: Hypothesis strategies built from the document's own schemas.

One real sidecar (the real broker, its control API on loopback TCP with a token, its observability
listener on another port) serves the whole module. For every documented operation:

- request bodies generated from the documented request schema (`from_schema` below) get a
  documented status, 200 for `POST /v1/acks`, with a body that validates against the documented
  response schema (jsonschema), one result per item, in order;
- arbitrary JSON bodies get a documented status (never a 5xx) and a body matching its schema;
- every documented GET answers a documented status with a body matching its schema, on the
  control API, and on the observability listener for the read-only paths (the others are 404);
- requests without the token, with a non-loopback Host or a non-JSON Content-Type get the
  documented 401, 403 and 415.

Bounded: about 300 examples in all, each one HTTP round trip on loopback.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness import free_port, sidecar_process

ROOT = Path(__file__).resolve().parents[2]
OPENAPI: dict[str, Any] = yaml.safe_load((ROOT / "openapi.yaml").read_text())
TOKEN = "fuzz-token-0123456789abcdef"
SCHEMA_FUZZ = settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def schema_of(fragment: dict[str, Any]) -> dict[str, Any]:
    """A standalone JSON Schema for ``fragment``, its ``#/components/...`` refs resolvable."""
    return {**fragment, "components": OPENAPI["components"]}


def resolve(fragment: dict[str, Any]) -> dict[str, Any]:
    """Follow a ``$ref`` to a component (responses are referenced that way too)."""
    while "$ref" in fragment:
        node: Any = OPENAPI
        for part in fragment["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        fragment = node
    return fragment


def operation(path: str, method: str) -> dict[str, Any]:
    op: dict[str, Any] = OPENAPI["paths"][path][method.lower()]
    return op


def check_against_document(path: str, method: str, status: int, body: bytes, ctype: str) -> None:
    """``status`` is documented for the operation, and ``body`` matches the documented schema."""
    responses = operation(path, method)["responses"]
    assert str(status) in responses, (
        f"{method} {path} answered undocumented {status}: {body[:200]!r}"
    )
    documented = resolve(responses[str(status)])
    media = ctype.partition(";")[0].strip()
    content = documented.get("content", {})
    if media == "application/json" and media in content:
        jsonschema.validate(json.loads(body), schema_of(content[media]["schema"]))
    elif content:
        assert media in content, f"{method} {path} {status}: {media} is not documented"


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid under ``schema``, for the JSON Schema subset openapi.yaml uses.

    (hypothesis-jsonschema would do this, but its latest release does not run on current
    Hypothesis.) Handles $ref, oneOf, enum, type (or a list of types), string minLength,
    integer minimum, base64 contentEncoding, arrays of items, objects with
    properties/required/additionalProperties.
    """
    schema = resolve(schema)
    if "oneOf" in schema:
        return st.one_of([from_schema(option) for option in schema["oneOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": one}) for one in kind])
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(min_value=schema.get("minimum"), max_value=2**53)
    if kind == "string" and schema.get("contentEncoding") == "base64":
        return st.binary(max_size=30).map(lambda raw: base64.b64encode(raw).decode())
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=30)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {})), max_size=6)
    if kind == "object":
        properties: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", ()))
        extra = schema.get("additionalProperties", True)
        fixed = st.fixed_dictionaries(
            {name: from_schema(properties[name]) for name in sorted(required)},
            optional={
                name: from_schema(sub) for name, sub in properties.items() if name not in required
            },
        )
        if extra is False:
            return fixed
        names = st.text(max_size=10).filter(lambda name: name not in properties)
        values = from_schema(extra) if isinstance(extra, dict) else JSON_VALUES
        more = st.dictionaries(names, values, max_size=3)
        return st.tuples(fixed, more).map(lambda pair: {**pair[1], **pair[0]})
    raise AssertionError(f"schema construct not covered: {schema}")


@dataclass
class Running:
    control: int
    observability: int

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        headers: dict[str, str] | None = None,
        port: int | None = None,
    ) -> tuple[int, bytes, str]:
        conn = http.client.HTTPConnection("127.0.0.1", port or self.control, timeout=15)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, response.read(), response.getheader("content-type") or ""
        finally:
            conn.close()


@pytest.fixture(scope="module")
def running(bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    directory = tmp_path_factory.mktemp("schema")
    control, observability = free_port(), free_port()
    name = f"schema-fuzz-{os.getpid()}-{control}"
    config = {
        "kafka": {"bootstrap.servers": bootstrap, "group.id": name},
        "source": {"topics": [name]},
        "app": {"url": f"http://127.0.0.1:{free_port()}/records"},
        "api": {
            "listen": f"127.0.0.1:{control}",
            "observability.listen": f"127.0.0.1:{observability}",
            "token": TOKEN,
        },
        "logging": {"level": "warning", "format": "json"},
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    api = Running(control, observability)
    with sidecar_process(path, directory / "sidecar.log") as proc:
        deadline = time.monotonic() + 60
        while True:
            try:
                api.call("GET", "/healthz")
                api.call("GET", "/healthz", port=observability)
                break
            except OSError:
                assert proc.poll() is None, (directory / "sidecar.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the sidecar did not start listening"
                time.sleep(0.1)
        yield api


AUTH = {"dlq-sidecar-api-token": TOKEN, "Content-Type": "application/json"}
ACK_REQUEST = schema_of(
    operation("/v1/acks", "POST")["requestBody"]["content"]["application/json"]["schema"]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=20,
)


@SCHEMA_FUZZ
@given(body=st.deferred(lambda: from_schema(ACK_REQUEST)))
def test_documented_ack_requests_are_answered_as_documented(running: Running, body: Any) -> None:
    status, raw, ctype = running.call("POST", "/v1/acks", json.dumps(body).encode(), headers=AUTH)
    check_against_document("/v1/acks", "POST", status, raw, ctype)
    assert status == 200, raw
    items = body["acks"] if isinstance(body, dict) else body
    results = json.loads(raw)["results"]
    assert [r["id"] for r in results] == [item["id"] for item in items]
    # Nothing was ever delivered under these ids: none of them may be applied.
    assert {r["result"] for r in results} <= {"unknown", "expired", "already"}


@SCHEMA_FUZZ
@given(body=JSON_VALUES | st.binary(max_size=200))
def test_any_json_body_gets_a_documented_answer(running: Running, body: Any) -> None:
    # Raw bytes as they are; any JSON value (a JSON string included) serialised.
    raw_body = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, raw, ctype = running.call("POST", "/v1/acks", raw_body, headers=AUTH)
    check_against_document("/v1/acks", "POST", status, raw, ctype)
    assert status < 500


GETS = [(path, "GET") for path, ops in OPENAPI["paths"].items() if "get" in ops]
READ_ONLY = {"/healthz", "/readyz", "/metrics"}


@pytest.mark.parametrize(("path", "method"), GETS, ids=[p for p, _ in GETS])
def test_every_documented_get_answers_as_documented(
    running: Running, path: str, method: str
) -> None:
    status, raw, ctype = running.call(method, path, headers={"dlq-sidecar-api-token": TOKEN})
    check_against_document(path, method, status, raw, ctype)
    status, raw, ctype = running.call(method, path, port=running.observability)
    if path in READ_ONLY:
        check_against_document(path, method, status, raw, ctype)
    else:
        assert status == 404, (path, status)


@SCHEMA_FUZZ
@given(
    token=st.none() | st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=40),
    path=st.sampled_from(["/v1/status", "/v1/acks"]),
)
def test_without_the_right_token_v1_is_a_documented_401(
    running: Running, token: str | None, path: str
) -> None:
    headers = {"Content-Type": "application/json"}
    if token is not None and token != TOKEN:
        headers["dlq-sidecar-api-token"] = token
    method = "POST" if path == "/v1/acks" else "GET"
    status, raw, ctype = running.call(
        method, path, b"[]" if method == "POST" else None, headers=headers
    )
    assert status == 401
    check_against_document(path, method, status, raw, ctype)


@SCHEMA_FUZZ
@given(
    host=st.from_regex(
        r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,10}){0,3}(:[0-9]{1,5})?", fullmatch=True
    )
    | st.from_regex(
        r"(10|172|192)\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(:[0-9]{1,5})?", fullmatch=True
    ),
)
def test_a_non_loopback_host_is_a_documented_403(running: Running, host: str) -> None:
    if host.partition(":")[0] in ("localhost",):
        return
    headers = {**AUTH, "Host": host}
    status, raw, ctype = running.call("GET", "/v1/status", headers=headers)
    assert status == 403, host
    check_against_document("/v1/status", "GET", status, raw, ctype)


@SCHEMA_FUZZ
@given(
    ctype=st.sampled_from(
        ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""]
    )
)
def test_a_non_json_post_is_a_documented_415(running: Running, ctype: str) -> None:
    headers = {"dlq-sidecar-api-token": TOKEN, "Content-Type": ctype}
    status, raw, got = running.call("POST", "/v1/acks", b"[]", headers=headers)
    assert status == 415
    check_against_document("/v1/acks", "POST", status, raw, got)
