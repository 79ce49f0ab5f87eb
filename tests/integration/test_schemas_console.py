"""The console decodes records with schemas, in a real browser (Playwright, Debian's Chromium): a DLQ of Avro
records in the Confluent wire format (written by confluent-kafka's serializer against the real Schema
Registry, dead-lettered by the DLQ writer's own `build_dlq_record`) and one value that is not in the wire
format, served by `dlq-sidecar console --registry URL --redact card`.

The table shows each value decoded with its subject and version and the card redacted; a record's page shows
the decoded value and its schema, and not the raw bytes (the card would be readable there); the plain value's
page shows its bytes and why it was not decoded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.core.deadletter import FailedRecord
from sidecar.core.outcome import CAUSE_REJECTED
from sidecar.kafka.dlq.record import build_dlq_record
from sidecar.ops.broker import free_port
from tests.dlqwriters import wait_for
from tests.integration.test_console_browser import browser, shots
from tests.kafkatools import Broker, Rec
from tests.registry import SchemaRegistry
from tests.schematools import order, registry_client, serializer

__all__ = ["browser", "shots"]  # the browser test's module fixtures, used here

PLAIN = b"plain text, no schema"


@pytest.fixture(scope="module")
def avro_dlq(broker: Broker, schema_registry: SchemaRegistry) -> tuple[str, str]:
    """(source topic, DLQ topic): three Avro orders and one plain value, dead-lettered with copies."""
    tag = uuid.uuid4().hex[:8]
    source = broker.create_topic(f"orders-avro-{tag}")
    dlq = broker.create_topic(f"dlq.orders-avro-{tag}")
    client = registry_client(schema_registry.url)
    try:
        encode = serializer(client, "avro")
        values = [encode(source, order(n)) for n in range(3)]
    finally:
        client.close()
    records = []
    for offset, value in enumerate([*values, PLAIN]):
        failed = FailedRecord(
            topic=source,
            partition=0,
            offset=offset,
            key=None,
            value=value,
            headers=(),
            group="orders-app",
            delivery_count=1,
            cause=CAUSE_REJECTED,
            exception_class="com.example.Invalid",
            exception_message=f"order {offset}",
        )
        rec = build_dlq_record(failed, dlq, 1, True, 4096)
        records.append(Rec(key=rec.key, value=rec.value, headers=tuple(rec.headers), partition=0))
    broker.produce(dlq, records)
    return source, dlq


@pytest.fixture(scope="module")
def console(
    broker: Broker, schema_registry: SchemaRegistry, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("console") / "console.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "console", "--bootstrap", broker.bootstrap,
             "--port", str(port), "--read-only", "--registry", schema_registry.url,
             "--redact", "card"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
        )  # fmt: skip
    try:
        wait_for(lambda: b"serving on" in log.read_bytes(), 60, "the console to serve", proc, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(15)


def test_the_console_shows_decoded_redacted_payloads(
    avro_dlq: tuple[str, str], console: str, browser: object, shots: Path
) -> None:
    from playwright.sync_api import BrowserContext, expect

    assert isinstance(browser, BrowserContext)
    source, dlq = avro_dlq
    page = browser.new_page()
    page.set_default_timeout(90_000)

    page.goto(f"{console}/topics/{dlq}/records")
    table = page.locator("table").last
    expect(table).to_contain_text(f"{source}-value v1:")
    expect(table).to_contain_text('"customer":"customer-1"')
    expect(table).to_contain_text('"card":"***"')
    expect(table).to_contain_text("not decoded: sidecar.NotWireFormat")
    assert order(1)["card"] not in page.content()
    page.screenshot(path=shots / "schemas-records.png", full_page=True)

    page.goto(f"{console}/topics/{dlq}/records/0/1")
    expect(page.locator("#value-schema")).to_contain_text(f"{source}-value v1 · AVRO")
    decoded = page.locator("#value-decoded")
    expect(decoded).to_contain_text('"customer": "customer-1"')
    expect(decoded).to_contain_text('"card": "***"')
    assert order(1)["card"] not in page.content()  # nor in the raw bytes, which are not shown
    page.screenshot(path=shots / "schemas-record.png", full_page=True)

    page.goto(f"{console}/topics/{dlq}/records/0/3")
    expect(page.locator("#value-not-decoded")).to_contain_text("sidecar.NotWireFormat")
    expect(page.locator("pre").last).to_contain_text(PLAIN.decode())


def test_the_console_filters_on_a_decoded_field(
    avro_dlq: tuple[str, str], console: str, browser: object, shots: Path
) -> None:
    """The table's "decoded field" filter (the CLI's --field): typed into the form, it keeps the one
    order of that customer, and the pages it links to carry it; a redacted field matches only ***."""
    from playwright.sync_api import BrowserContext, expect

    assert isinstance(browser, BrowserContext)
    _source, dlq = avro_dlq
    page = browser.new_page()
    page.set_default_timeout(90_000)

    page.goto(f"{console}/topics/{dlq}/records")
    page.fill("input[name=field]", "customer=customer-2")
    page.click("#apply")
    rows = page.locator("#records tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text('"customer":"customer-2"')
    expect(rows.first).to_have_attribute("data-coordinates", "0:2")
    assert "field=customer%3Dcustomer-2" in page.url
    # The redrive form carries the filter to the preview, as the other filters.
    assert page.locator("#redrive-form input[name=field]").get_attribute("value") == (
        "customer=customer-2"
    )
    page.screenshot(path=shots / "schemas-field-filter.png", full_page=True)

    page.goto(f"{console}/topics/{dlq}/records?field=id=1")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-coordinates", "0:1")

    # A redacted field cannot be probed: its real value matches nothing, *** matches every order.
    page.goto(f"{console}/topics/{dlq}/records?field=card={order(1)['card']}")
    expect(page.locator("#records tbody")).to_contain_text("no matching record on this page")
    page.goto(f"{console}/topics/{dlq}/records?field=card=***")
    expect(rows).to_have_count(3)


@pytest.fixture(scope="module")
def headers_only_dlq(broker: Broker, schema_registry: SchemaRegistry) -> tuple[str, str]:
    """(source topic, DLQ topic): two orders with Avro keys and values on the source, dead-lettered
    headers-only (copy off, the default)."""
    import json

    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    tag = uuid.uuid4().hex[:8]
    source = broker.create_topic(f"orders-ho-{tag}")
    dlq = broker.create_topic(f"dlq.orders-ho-{tag}")
    client = registry_client(schema_registry.url)
    try:
        keys = AvroSerializer(
            client,
            json.dumps(
                {"type": "record", "name": "OrderKey", "fields": [{"name": "id", "type": "long"}]}
            ),
            conf={"subject.name.strategy.type": "TOPIC"},
        )
        encode = serializer(client, "avro")
        originals = [
            Rec(keys({"id": n}, SerializationContext(source, MessageField.KEY)),
                encode(source, order(n)), partition=0)
            for n in range(2)
        ]  # fmt: skip
    finally:
        client.close()
    broker.produce(source, originals)
    records = []
    for offset, original in enumerate(originals):
        failed = FailedRecord(
            topic=source,
            partition=0,
            offset=offset,
            key=original.key,
            value=original.value,
            headers=(),
            group="orders-app",
            delivery_count=1,
            cause=CAUSE_REJECTED,
            exception_class="com.example.Invalid",
            exception_message=f"order {offset}",
        )
        rec = build_dlq_record(failed, dlq, 1, False, 4096)
        records.append(Rec(key=rec.key, value=rec.value, headers=tuple(rec.headers), partition=0))
    broker.produce(dlq, records)
    return source, dlq


def test_the_console_decodes_headers_only_records_and_keys(
    headers_only_dlq: tuple[str, str], console: str, browser: object, shots: Path
) -> None:
    from playwright.sync_api import BrowserContext, expect

    assert isinstance(browser, BrowserContext)
    source, dlq = headers_only_dlq
    page = browser.new_page()
    page.set_default_timeout(90_000)

    page.goto(f"{console}/topics/{dlq}/records")
    table = page.locator("#records")
    # The preview is cut at 120 characters: the key, then the value's start.
    expect(table).to_contain_text(f'(from the source) key {source}-key v1: {{"id":1}}; ')
    expect(table).to_contain_text('v1: {"id":1,"customer":')
    assert order(1)["card"] not in page.content()

    page.goto(f"{console}/topics/{dlq}/records?field=customer=customer-1")
    expect(page.locator("#records tbody tr")).to_have_count(1)

    page.goto(f"{console}/topics/{dlq}/records/0/1")
    expect(page.locator("#key-schema")).to_contain_text(f"{source}-key v1 · AVRO")
    expect(page.locator("#key-decoded")).to_contain_text('"id": 1')
    # The order schema is one id under this topic's subject and the first fixture's: the console's
    # catalog lists the subjects it had when it first loaded the id.
    expect(page.locator("#value-schema")).to_contain_text("-value v1 · AVRO")
    expect(page.locator("#value-decoded")).to_contain_text('"card": "***"')
    expect(page.locator("body")).to_contain_text("value, decoded (read from the source topic)")
    expect(page.locator("#original-note")).to_contain_text("Read back from the source topic")
    assert order(1)["card"] not in page.content()  # the original's bytes are not shown either
    page.screenshot(path=shots / "schemas-headers-only.png", full_page=True)
