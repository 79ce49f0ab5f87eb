"""`dlq-sidecar console` in a real browser: Playwright for Python driving Debian's Chromium against the
console (a child process, real HTTP) and the real broker, with DLQs of every format: ours (records built
by the DLQ writer's own `build_dlq_record`), and the Kafka Connect, Kafka Streams and Spring Kafka
writers the DLQ tool's tests run (their module fixtures, imported).

Opens the topics page (found by prefix and by format), a topic's chart, the table filtered by exception
class, a Spring record with its binary offset decoded; refuses a write without the token; redrives two
Spring records at a rate with the progress page, finds them on the source topic with the redrive's
`__dlq.replay.by` header; Spring fails them again and the loop guard refuses the second redrive.
Screenshots of each page go to a pytest tmp dir (its path is printed).

Skipped only where Chromium is not installed and cannot be (scripts/install-chromium needs root): never
under CI (CI set) or after the install script ran, where a missing browser fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.core.deadletter import FailedRecord
from sidecar.core.outcome import CAUSE_DELIVERY_COUNT, CAUSE_REJECTED
from sidecar.kafka.dlq.record import build_dlq_record
from sidecar.ops.broker import free_port
from sidecar.ops.dlq.formats import SP_OFFSET
from tests.dlqwriters import cache_root, wait_for
from tests.dlqwriters.tool import end_offsets, records_after
from tests.integration.test_dlq_connect import ConnectDlq, connect_dlq
from tests.integration.test_dlq_spring import FAILING, LISTENER_FAILED, SpringDlt, spring_dlt
from tests.integration.test_dlq_streams import StreamsDlq, streams_dlq
from tests.kafkatools import Broker, Rec

__all__ = ["connect_dlq", "spring_dlt", "streams_dlq"]  # the writers' module fixtures, used here

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "console-test-token-" + uuid.uuid4().hex
OPERATOR = "Ada the operator"
OURS = 12


def _require_chromium() -> None:
    if CHROMIUM.exists():
        return
    installed = (cache_root().parent / "chromium.installed").exists()
    if os.environ.get("CI") or installed:
        pytest.fail(
            f"{CHROMIUM} is missing: scripts/install-chromium (make tools) must install it here",
            pytrace=False,
        )
    pytest.skip(
        f"{CHROMIUM} is not installed and cannot be here (scripts/install-chromium needs root "
        "and apt-get): the console's browser tests are skipped"
    )


@pytest.fixture(scope="module")
def ours(broker: Broker) -> str:
    """A DLQ topic in our format, as the DLQ writer builds its records."""
    tag = uuid.uuid4().hex[:8]
    source = broker.create_topic(f"orders-{tag}", partitions=2)
    dlq = broker.create_topic(f"dlq.orders-{tag}", partitions=2)
    records = []
    for i in range(OURS):
        failed = FailedRecord(
            topic=source,
            partition=i % 2,
            offset=i,
            key=f"k{i}".encode(),
            value=f'{{"order": {i}}}'.encode(),
            headers=(),
            group="orders-app",
            delivery_count=1 + i % 3,
            cause=CAUSE_REJECTED if i % 2 else CAUSE_DELIVERY_COUNT,
            exception_class="com.example.InvalidOrder" if i % 3 else "com.example.Timeout",
            exception_message=f"order {i} is invalid",
        )
        rec = build_dlq_record(failed, dlq, 2, True, 4096)
        records.append(
            Rec(key=rec.key, value=rec.value, headers=tuple(rec.headers), partition=i % 2)
        )
    broker.produce(dlq, records)
    return dlq


@pytest.fixture(scope="module")
def console(broker: Broker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """`dlq-sidecar console` on a free loopback port, the token from the environment: (URL, its log)."""
    port = free_port()
    log = tmp_path_factory.mktemp("console") / "console.log"
    env = {**os.environ, "DLQ_CONSOLE_TOKEN": TOKEN}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sidecar",
                "console",
                "--bootstrap",
                broker.bootstrap,
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        wait_for(lambda: b"serving on" in log.read_bytes(), 60, "the console to serve", proc, log)
        assert b"127.0.0.1" in log.read_bytes()  # loopback unless told otherwise
        assert TOKEN.encode() not in log.read_bytes()  # a token given is never printed
        yield f"http://127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Path:
    """Where the screenshots go: a pytest tmp dir, its path written to the terminal (not captured)."""
    path = tmp_path_factory.mktemp("console-screenshots")
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"console screenshots: {path}")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    _require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            tempfile.mkdtemp(prefix="console-chromium-"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


def test_the_console_in_a_browser(
    broker: Broker,
    console: tuple[str, Path],
    browser: object,
    shots: Path,
    ours: str,
    connect_dlq: ConnectDlq,
    streams_dlq: StreamsDlq,
    spring_dlt: SpringDlt,
) -> None:
    from playwright.sync_api import BrowserContext, expect

    assert isinstance(browser, BrowserContext)
    page = browser.new_page()
    # The session's broker holds every test module's topics, and CI runs three files at once: the
    # topics page probes them all on its first load.
    page.set_default_timeout(90_000)
    s = spring_dlt
    url, log = console

    # The topics page: every format's DLQ, by prefix or (Spring's TOPIC-dlt) by format.
    page.goto(url + "/")
    for topic, found_by in (
        (ours, "prefix"),
        (connect_dlq.dlq, "prefix"),
        (streams_dlq.dlq, "prefix"),
        (s.dlt, "format"),
    ):
        row = page.locator(f'tr[data-topic="{topic}"]')
        expect(row).to_have_count(1)
        expect(row.locator("td").nth(1)).to_have_text(found_by)
    expect(page.locator(f'tr[data-topic="{s.dlt}"]')).to_contain_text("spring")
    expect(page.locator(f'tr[data-topic="{connect_dlq.dlq}"]')).to_contain_text("connect")
    page.screenshot(path=shots / "topics.png", full_page=True)

    # A topic's summary: the dead letters over time, by reason and by exception class.
    page.goto(f"{url}/topics/{ours}")
    expect(page.locator("svg.chart")).to_have_count(2)
    expect(page.locator("svg.chart").nth(1)).to_contain_text("com.example.InvalidOrder (8)")
    page.screenshot(path=shots / "topic.png", full_page=True)

    # The table, filtered by exception class (Spring's root cause counts too).
    page.goto(f"{url}/topics/{s.dlt}/records")
    page.fill('input[name="exception_class"]', LISTENER_FAILED)
    page.click("#apply")
    expect(page.locator("#records tbody tr[data-coordinates]")).to_have_count(FAILING)
    page.fill('input[name="exception_class"]', "com.example.NoSuchClass")
    page.click("#apply")
    expect(page.locator("#records tbody tr[data-coordinates]")).to_have_count(0)
    page.goto(f"{url}/topics/{ours}/records?exception_class=com.example.Timeout")
    expect(page.locator("#records tbody tr[data-coordinates]")).to_have_count(OURS // 3)
    page.screenshot(path=shots / "records.png", full_page=True)

    # A Spring record: its 8-byte binary offset decoded as a number.
    page.goto(f"{url}/topics/{s.dlt}/records/0/0")
    source_offset = int(page.locator('td[data-field="source offset"]').inner_text())
    source_partition = int(page.locator('td[data-field="source partition"]').inner_text())
    offsets = {o.offset for o in s.originals.values() if o.partition == source_partition}
    assert source_offset in offsets
    header = page.locator(f'#headers tr[data-header="{SP_OFFSET}"] td')
    expect(header.nth(1)).to_have_text(str(source_offset))
    expect(header.nth(2)).to_have_text("int64")
    expect(header.nth(3)).to_have_text("8")
    page.screenshot(path=shots / "record.png", full_page=True)

    # A write without the token is refused, with or without the page's CSRF value.
    csrf = page.locator('input[name="csrf"]').first.get_attribute("value") or ""
    for form in ({"record": "0:0", "csrf": csrf}, {"record": "0:0"}):
        refused = page.request.post(f"{url}/topics/{s.dlt}/redrive", form=form)
        assert refused.status == 403, refused.text()
    wrong = page.request.post(f"{url}/login", form={"token": "wrong", "who": "x", "csrf": csrf})
    assert wrong.status == 403

    # Log in, tick two Spring records, preview (the dry run), redrive at a rate.
    page.goto(f"{url}/topics/{s.dlt}/records")
    page.fill('input[name="who"]', OPERATOR)
    page.fill('input[name="token"]', TOKEN)
    page.click('#login button[type="submit"]')
    expect(page.locator("#who")).to_have_text(OPERATOR)
    starts = end_offsets(broker, s.source, 2)
    dlt_ends = end_offsets(broker, s.dlt, 2)
    boxes = page.locator('#records input[name="record"]')
    chosen = [boxes.nth(0).get_attribute("value"), boxes.nth(1).get_attribute("value")]
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.click("#preview")
    expect(page.locator("#planned li")).to_have_count(2)
    expect(page.locator("#planned")).to_contain_text(f"to {s.source}[")
    page.screenshot(path=shots / "preview.png", full_page=True)
    page.fill('input[name="rate"]', "20")
    page.click("#start")
    expect(page.locator("#redrive")).to_have_attribute("data-state", "done", timeout=60_000)
    expect(page.locator("#replayed")).to_contain_text("2 redriven of 2 matching")
    page.screenshot(path=shots / "redrive.png", full_page=True)

    # The two are on the source topic, recorded as this operator's redrive.
    back = records_after(broker, s.source, starts, 2)
    assert len(back) == 2
    for rec in back:
        headers = dict(rec.headers)
        assert headers["__dlq.replay.by"] == f"{OPERATOR} (dlq-sidecar console)".encode()
        assert headers["__dlq.replay.count"] == b"1"
        assert headers["__dlq.replay.from"].decode().split("/", 1)[1].replace("/", ":") in chosen

    # Spring fails them again and dead-letters them with the replay markers: the loop guard refuses them.
    wait_for(
        lambda: sum(end_offsets(broker, s.dlt, 2).values()) >= sum(dlt_ends.values()) + 2,
        60,
        "Spring to dead-letter the redriven records again",
    )
    again = [
        f"{p}:{o}" for p in (0, 1) for o in range(dlt_ends[p], end_offsets(broker, s.dlt, 2)[p])
    ]
    assert len(again) == 2
    page.goto(f"{url}/topics/{s.dlt}/records?size=200")
    for coordinates in again:
        page.locator(f'#records input[value="{coordinates}"]').check()
    page.click("#preview")
    expect(page.locator("#skipped li.refused")).to_have_count(2)
    expect(page.locator("#skipped")).to_contain_text("replayed 1 times already")
    expect(page.locator("#nothing")).to_be_visible()
    # The same words as `dlq replay --dry-run` prints them.
    expect(page.locator("#cli-summary")).to_contain_text(
        "DRY RUN: would replay 0 of 2 matching records"
    )
    page.screenshot(path=shots / "loop-guard.png", full_page=True)

    # Who redrove is in the console's log; no payload is.
    text = log.read_text(errors="replace")
    assert f"started by {OPERATOR}" in text, text[-2000:]
    assert '{"order"' not in text and "oops" not in text, text[-2000:]
