"""`dlq inspect`'s rendering: readable at any terminal width, and record data is never rich markup."""

from __future__ import annotations

import io
from collections import Counter

import pytest
from rich.console import Console

from sidecar.kafka.dlq import (
    H_DELIVERY_COUNT,
    H_EXC_CLASS,
    H_EXC_MESSAGE,
    H_OFFSET,
    H_PARTITION,
    H_TOPIC,
)
from sidecar.ops.dlq.entries import DlqEntry
from sidecar.ops.dlq.inspect import InspectResult
from sidecar.ops.dlq.render import WIDE_TABLE_MIN_COLUMNS, render_inspect

MESSAGE = "index [/x] out of range [bold]here[/bold]"
CLASS = "com.example.orders.[red]PoisonPillException"


def entry(offset: int) -> DlqEntry:
    return DlqEntry(
        dlq_topic="orders.dlq",
        dlq_partition=0,
        dlq_offset=offset,
        timestamp_ms=1_700_000_000_000,
        key=b"k",
        value=b'{"order": "[/]"}',
        headers=(
            (H_TOPIC, b"orders"),
            (H_PARTITION, b"2"),
            (H_OFFSET, str(100 + offset).encode()),
            (H_DELIVERY_COUNT, b"4"),
            (H_EXC_CLASS, CLASS.encode()),
            (H_EXC_MESSAGE, MESSAGE.encode()),
        ),
    )


def rendered(width: int) -> str:
    result = InspectResult(
        entries=[entry(0), entry(1)],
        scanned=2,
        matched=2,
        by_exception_class=Counter({CLASS: 2}),
        by_source_topic=Counter({"orders": 2}),
    )
    out = io.StringIO()
    render_inspect(Console(file=out, width=width), result, "orders.dlq")
    return out.getvalue()


def squeezed(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("width", [60, 80, 120])
def test_narrow_terminals_show_every_field_whole_one_block_per_record(width: int) -> None:
    text = rendered(width)
    assert all(len(line) <= width for line in text.splitlines()), text
    records = text.split("2 matching of 2 records read")[0]
    assert "┏" not in records and records.count("exception class:") == 2, text
    for value in (
        "orders",
        "2@100",
        "2@101",
        "0/0",
        "0/1",
        "2023-11-14 22:13:20.000",
        MESSAGE,
        CLASS,
    ):
        assert squeezed(value) in squeezed(records), (value, text)
    assert records.count(f"({len(entry(0).value or b'')} B)") == 2, text  # payload preview and size


@pytest.mark.parametrize("width", [WIDE_TABLE_MIN_COLUMNS, 400])
def test_wide_terminals_get_the_table(width: int) -> None:
    text = rendered(width)
    assert all(len(line) <= width for line in text.splitlines()), text
    assert "exception class:" not in text and "┃ DLQ p/offset" in text
    assert text.count(f"({len(entry(0).value or b'')} B)") == 2, text


@pytest.mark.parametrize("width", [80, 400])
def test_record_data_is_printed_as_text_not_markup(width: int) -> None:
    # As markup, the stray closing tag would raise, and "[bold]" / "[red]" would vanish into styles.
    text = rendered(width)
    for value in (MESSAGE, CLASS, '{"order": "[/]"}'):
        assert squeezed(value) in squeezed(text), (value, text)


def test_a_headers_only_records_payload_gone_is_said_plainly() -> None:
    from dataclasses import replace

    from sidecar.kafka.tools import payload_gone
    from sidecar.ops.dlq.payloads import Decoded, Payload
    from sidecar.ops.dlq.render import payload_preview

    headers_only = replace(entry(0), key=None, value=None)
    assert payload_preview(headers_only) == "(headers only)"
    gone = payload_gone("orders", 2, 100, 250)
    assert gone == (
        "payload gone: source offset orders[2]@100 was deleted (log start now 250; "
        "retention or delete-records)"
    )
    object.__setattr__(headers_only, "payload_gone", gone)
    assert payload_preview(headers_only) == gone
    assert headers_only.to_json()["payload_gone"] == gone
    result = InspectResult(entries=[headers_only], scanned=1, matched=1, payload_gone=1)
    out = io.StringIO()
    render_inspect(Console(file=out, width=200), result, "orders.dlq")
    assert "1 headers-only records: payload gone" in out.getvalue()

    # Decoded from its source record, key first.
    schema = {"subject": "orders-value", "version": 1, "id": 3, "type": "AVRO"}
    key = Decoded({"id": 7}, {**schema, "subject": "orders-key"})
    decoded = replace(entry(1), key=None, value=None)
    object.__setattr__(decoded, "payload", Payload({"id": 7}, schema, key=key, from_source=True))
    assert payload_preview(decoded) == (
        '(from the source) key orders-key v1: {"id":7}; orders-value v1: {"id":7}'
    )
    assert decoded.to_json()["decoded_from_source"] is True
    assert decoded.to_json()["key_decoded"] == {"id": 7}
