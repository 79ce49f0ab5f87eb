"""Headers-only DLQ records whose source offset was deleted: the sidecar counts them, the tools say so.

A real sidecar (copy off, the default: every DLQ record is headers-only) dead-letters five records of
a real broker's topic; delete-records then cuts the source partition at offset 3. The sidecar's
`dlq_sidecar_dlq_source_deleted_total{topic}` reaches 3 (and the two still readable stay watched),
with a log line; `dlq inspect` says "payload gone" with the log start for exactly those three, in
JSON and in its summary; the console (Playwright, Debian's Chromium) says it in the table and on
the record's page, and shows the original of a record still in the source.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from confluent_kafka import TopicPartition

from sidecar.http.server import Response
from sidecar.ops.broker import free_port
from sidecar.ops.dlq.command import cmd_dlq
from tests.dlqwriters import wait_for
from tests.harness import (
    Delivery,
    RecordingApp,
    json_answer,
    running_sidecar,
    wait_until,
    wait_until_thread,
)
from tests.integration.test_console_browser import browser, shots
from tests.integration.test_dlqtool import _parser
from tests.kafkatools import Broker, Rec

__all__ = ["browser", "shots"]  # the browser test's module fixtures, used here

RECORDS = 5
CUT = 3  # delete-records up to this source offset


def _reject(_d: Delivery) -> Response:
    return json_answer({"ack": "reject", "error": {"class": "app.Invalid", "message": "bad"}})


@dataclass
class Scenario:
    source: str
    dlq: str
    metrics: str
    log: str


def _sample(text: str, name: str, topic: str | None = None) -> float | None:
    labels = f'\\{{topic="{re.escape(topic)}"\\}}' if topic is not None else ""
    m = re.search(rf"^{name}{labels} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


@pytest.fixture(scope="module")
def gone(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    """Five records dead-lettered headers-only by a real sidecar, the first three deleted from the
    source; the sidecar's /metrics once it counted them, and its log."""
    unique = uuid.uuid4().hex[:8]
    tmp = tmp_path_factory.mktemp("payload-gone")
    found: dict[str, Any] = {}

    async def scenario() -> None:
        async with running_sidecar(
            broker,
            tmp,
            RecordingApp(_reject),
            unique=unique,
            path="/",
            extra={"errors.deadletterqueue.source.check.interval.ms": 200},
            produce_first=[
                Rec(key=f"k{i}".encode(), value=f"v{i}".encode()) for i in range(RECORDS)
            ],
        ) as rig:
            found["source"], found["dlq"] = rig.topic, rig.dlq_topic
            dlq = rig.dlq_topic
            await wait_until_thread(
                lambda: broker.topic_exists(dlq) and broker.count_records(dlq) >= RECORDS,
                60,
                "the DLQ records",
            )
            for fut in broker.admin.delete_records([TopicPartition(rig.topic, 0, CUT)]).values():
                fut.result(timeout=30)
            text = ""

            async def counted() -> bool:
                nonlocal text
                _code, text = await rig.sc.get("/metrics")
                return _sample(text, "dlq_sidecar_dlq_source_deleted_total", rig.topic) == CUT

            with trio.fail_after(60):
                while not await counted():
                    await trio.sleep(0.1)
            found["metrics"] = text
            await wait_until(
                lambda: "now point at deleted source offsets" in rig.sc.log_text(), 10, "the log"
            )
            found["log"] = rig.sc.log_text()

    trio.run(scenario)
    return Scenario(found["source"], found["dlq"], found["metrics"], found["log"])


def test_the_sidecar_counts_records_whose_source_offset_was_deleted(gone: Scenario) -> None:
    assert _sample(gone.metrics, "dlq_sidecar_dlq_source_deleted_total", gone.source) == CUT
    assert _sample(gone.metrics, "dlq_sidecar_dlq_headers_only_watched") == RECORDS - CUT
    assert _sample(gone.metrics, "dlq_sidecar_dlq_written_total") == RECORDS
    assert f"{CUT} headers-only DLQ records of source topic {gone.source} now point at" in gone.log


def _inspect(broker: Broker, *argv: str) -> tuple[int, str, str]:
    args = _parser().parse_args(["dlq", "inspect", "--bootstrap", broker.bootstrap, *argv])
    out, err = io.StringIO(), io.StringIO()
    rc = cmd_dlq(args, out, err)
    return rc, out.getvalue(), err.getvalue()


def test_inspect_says_the_payload_is_gone(broker: Broker, gone: Scenario) -> None:
    rc, out, err = _inspect(broker, "--topic", gone.dlq, "--json")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == RECORDS and all(r["headers_only"] for r in rows)
    for r in rows:
        offset = r["source_offset"]
        if offset < CUT:
            assert r["payload_gone"] == (
                f"payload gone: source offset {gone.source}[0]@{offset} was deleted "
                f"(log start now {CUT}; retention or delete-records)"
            )
        else:
            assert r["payload_gone"] is None
    assert f"{CUT} headers-only records: payload gone" in err

    rc, out, err = _inspect(broker, "--topic", gone.dlq)
    assert rc == 0, err
    assert f"{CUT} headers-only records: payload gone" in out


@pytest.fixture(scope="module")
def console(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("console") / "console.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "console", "--bootstrap", broker.bootstrap,
             "--port", str(port), "--read-only"],
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


def test_the_console_says_the_payload_is_gone(
    broker: Broker, gone: Scenario, console: str, browser: object, shots: Path
) -> None:
    from playwright.sync_api import BrowserContext, expect

    assert isinstance(browser, BrowserContext)
    _rc, out, _ = _inspect(broker, "--topic", gone.dlq, "--json")
    by_source = {json.loads(line)["source_offset"]: json.loads(line) for line in out.splitlines()}
    page = browser.new_page()
    page.set_default_timeout(90_000)

    page.goto(f"{console}/topics/{gone.dlq}/records")
    table = page.locator("table").last
    expect(table).to_contain_text(f"payload gone: source offset {gone.source}[0]@0 was deleted")
    expect(table).to_contain_text("(headers only)")  # the two still in the source
    assert page.content().count("payload gone:") == CUT
    page.screenshot(path=shots / "payload-gone-records.png", full_page=True)

    lost = by_source[0]
    page.goto(f"{console}/topics/{gone.dlq}/records/{lost['dlq_partition']}/{lost['dlq_offset']}")
    expect(page.locator("#original-note")).to_contain_text(
        f"payload gone: source offset {gone.source}[0]@0 was deleted (log start now {CUT}"
    )
    page.screenshot(path=shots / "payload-gone-record.png", full_page=True)

    kept = by_source[CUT]
    page.goto(f"{console}/topics/{gone.dlq}/records/{kept['dlq_partition']}/{kept['dlq_offset']}")
    expect(page.locator("#original-note")).to_contain_text("Read back from the source topic")
    expect(page.locator("body")).to_contain_text(f"v{CUT}")
