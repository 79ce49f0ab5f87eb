"""The fields a schema marks sensitive, as dotted paths the DLQ tools redact by default.

Owns `sensitive_paths`: the fields of an Avro or JSON Schema schema that carry a sensitive tag in the
`confluent:tags` property (Confluent's data contracts), read from the schema text itself, so any
registry that keeps the text as registered (Apicurio included) carries them; and `protobuf_sensitive`:
the fields of a Protobuf file with the `(confluent.field_meta).tags` option. Paths as
`sidecar.ops.dlq.payloads.redact` takes them: field names from the top, list items and unions passing
through. Imports the standard library and confluent-kafka's `meta_pb2` (Protobuf's tags).
"""

from __future__ import annotations

import json
from typing import Any

# A field with one of these tags (any case) is redacted by default.
SENSITIVE_TAGS = frozenset({"PII", "SENSITIVE", "PHI", "PCI"})
TAGS_PROPERTY = "confluent:tags"
# Nesting deeper than this is not looked into (a schema that refers to itself, a hostile one).
MAX_DEPTH = 32


def _tagged(node: dict[str, Any]) -> bool:
    tags = node.get(TAGS_PROPERTY)
    return isinstance(tags, list) and any(
        isinstance(t, str) and t.upper() in SENSITIVE_TAGS for t in tags
    )


def _avro(node: Any, at: str, named: dict[str, Any], out: set[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        return
    if isinstance(node, list):  # a union
        for member in node:
            _avro(member, at, named, out, depth + 1)
        return
    if isinstance(node, str):
        found = named.get(node)
        if found is not None and found is not node:
            _avro(found, at, named, out, depth + 1)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind == "record":
        name = node.get("name")
        if isinstance(name, str):
            named.setdefault(name, node)
            namespace = node.get("namespace")
            if isinstance(namespace, str) and "." not in name:
                named.setdefault(f"{namespace}.{name}", node)
        for field in node.get("fields") or []:
            if not isinstance(field, dict) or not isinstance(field.get("name"), str):
                continue
            path = f"{at}.{field['name']}" if at else field["name"]
            if _tagged(field):
                out.add(path)
            else:
                _avro(field.get("type"), path, named, out, depth + 1)
    elif kind == "array":
        _avro(node.get("items"), at, named, out, depth + 1)
    elif isinstance(kind, dict | list):
        _avro(kind, at, named, out, depth + 1)


def _json_schema(node: Any, at: str, out: set[str], depth: int) -> None:
    if depth > MAX_DEPTH or not isinstance(node, dict):
        return
    for name, prop in (node.get("properties") or {}).items():
        if not isinstance(prop, dict):
            continue
        path = f"{at}.{name}" if at else str(name)
        if _tagged(prop):
            out.add(path)
        else:
            _json_schema(prop, path, out, depth + 1)
    items = node.get("items")
    if isinstance(items, dict):
        _json_schema(items, at, out, depth + 1)
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in node.get(key) or []:
            _json_schema(sub, at, out, depth + 1)


def sensitive_paths(schema_type: str, schema_str: str) -> frozenset[str]:
    """The dotted paths of the fields tagged sensitive in an AVRO or JSON schema's text; none for
    another type, or text that does not parse."""
    if schema_type not in ("AVRO", "JSON"):
        return frozenset()
    try:
        parsed = json.loads(schema_str)
    except ValueError:
        return frozenset()
    out: set[str] = set()
    if schema_type == "AVRO":
        _avro(parsed, "", {}, out, 0)
    else:
        _json_schema(parsed, "", out, 0)
    return frozenset(out)


def _protobuf_message(message: Any, at: str, out: set[str], depth: int) -> None:
    from confluent_kafka.schema_registry.confluent import meta_pb2

    if depth > MAX_DEPTH:
        return
    field_meta: Any = getattr(meta_pb2, "field_meta")  # noqa: B009 (generated: no stub names it)
    for field in message.fields:
        path = f"{at}.{field.name}" if at else field.name
        options = field.GetOptions()
        tags = options.Extensions[field_meta].tags if options.HasExtension(field_meta) else ()
        if any(t.upper() in SENSITIVE_TAGS for t in tags):
            out.add(path)
        elif field.message_type is not None:
            _protobuf_message(field.message_type, path, out, depth + 1)


def protobuf_sensitive(file_descriptor: Any) -> frozenset[str]:
    """The dotted paths (`.proto` field names) of the fields tagged sensitive with the
    `(confluent.field_meta).tags` option, in every message of the file (a path names the field in
    whichever message a record is of)."""
    out: set[str] = set()
    try:
        for message in file_descriptor.message_types_by_name.values():
            _protobuf_message(message, "", out, 0)
    except Exception:  # an option the pool cannot parse: no tags rather than no decoding
        return frozenset()
    return frozenset(out)


__all__ = ["SENSITIVE_TAGS", "TAGS_PROPERTY", "protobuf_sensitive", "sensitive_paths"]
