"""The console's pure parts: the timeline and its chart, header decoding, the new filters, the
token and CSRF rules, how bytes are shown, and the query parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.kafka.dlq import H_EXC_CLASS, H_MESSAGE, H_TOPIC
from sidecar.ops.console.access import Access, load_token
from sidecar.ops.console.app import _cursor, filters_of
from sidecar.ops.console.record_view import MAX_SHOWN_BYTES, show_bytes
from sidecar.ops.console.timeline import OTHER, Timeline, svg_chart
from sidecar.ops.dlq.entries import DlqEntry
from sidecar.ops.dlq.errors import UsageError
from sidecar.ops.dlq.filters import Filters, filters_from_values
from sidecar.ops.dlq.formats import SP_OFFSET, SP_PARTITION, header_display


def _entry(ts_ms: int, cls: str = "C", reason: str = "R", offset: int = 0) -> DlqEntry:
    return DlqEntry(
        dlq_topic="dlq.t",
        dlq_partition=0,
        dlq_offset=offset,
        timestamp_ms=ts_ms,
        key=None,
        value=b"v",
        headers=((H_TOPIC, b"t"), (H_MESSAGE, reason.encode()), (H_EXC_CLASS, cls.encode())),
    )


def test_the_timeline_stays_within_its_buckets_whatever_the_span() -> None:
    timeline = Timeline(max_buckets=10)
    stamps = [1_700_000_000_000 + i * 37_000 for i in range(500)]
    for ts in reversed(stamps):  # any order
        timeline.add(_entry(ts))
    assert timeline.low is not None and timeline.high is not None
    assert timeline.high - timeline.low < 10
    assert sum(sum(c.values()) for c in timeline.by_class.buckets.values()) == 500
    span = timeline.span()
    assert span is not None and span[0] <= stamps[0] and stamps[-1] < span[1]


def test_the_timeline_keeps_a_few_names_and_counts_the_rest_as_other() -> None:
    timeline = Timeline(max_series=3)
    for i in range(10):
        timeline.add(_entry(1_000_000 + i, cls=f"C{i}"))
    assert len(timeline.by_class.totals) == 4
    assert timeline.by_class.totals[OTHER] == 7


def test_the_chart_escapes_what_comes_from_records() -> None:
    timeline = Timeline()
    timeline.add(_entry(1_000_000, cls="<script>alert(1)</script>"))
    svg = svg_chart(timeline, "class", "t")
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert svg.count("<rect") >= 2  # a bar and its legend swatch
    assert "no records" in svg_chart(Timeline(), "reason", "t")


def test_spring_binary_numbers_are_shown_as_numbers() -> None:
    assert header_display(SP_PARTITION, (3).to_bytes(4, "big"), "spring") == ("3", "int32")
    assert header_display(SP_OFFSET, (2**40).to_bytes(8, "big"), "spring") == (str(2**40), "int64")
    assert header_display(SP_OFFSET, b"12", "spring") == ("12", "text")
    assert header_display("x", b"\xff\x00", "spring") == ("ff 00", "hex")
    assert header_display(SP_OFFSET, (7).to_bytes(8, "big"), "dlq")[1] == "hex"
    assert header_display("x", None, "dlq") == ("", "null")


def test_the_new_filters_match_and_stay_out_of_old_fingerprints() -> None:
    entry = _entry(5, cls="A", reason="Offset rejected by client.", offset=7)
    assert Filters(reasons=("Offset rejected by client.",)).mismatch(entry, 10) is None
    assert Filters(reasons=("other",)).mismatch(entry, 10) == "reason"
    assert Filters(message_contains="REJECTED").mismatch(entry, 10) is None
    assert Filters(message_contains="nope").mismatch(entry, 10) == "message-contains"
    assert Filters(records=((0, 7),)).mismatch(entry, 10) is None
    assert Filters(records=((0, 8),)).mismatch(entry, 10) == "record"
    assert Filters().describe() == {}
    assert filters_from_values(records=["0:7", "1/2"]).records == ((0, 7), (1, 2))
    with pytest.raises(UsageError, match="PARTITION:OFFSET"):
        filters_from_values(records=["x"])


def test_the_token_opens_sessions_and_csrf_is_per_session(tmp_path: Path) -> None:
    access = Access("s3cret-token")
    assert access.login("wrong", "me") is None
    session = access.login("s3cret-token", "  Ada  ")
    assert session is not None and access.who(session) == "Ada"
    assert access.csrf(session) != access.csrf(None)
    assert access.csrf_ok(session, access.csrf(session))
    assert not access.csrf_ok(session, access.csrf(None))
    access.logout(session)
    assert access.who(session) is None
    assert Access(None).login("", "x") is None and Access(None).read_only


def test_where_the_token_comes_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DLQ_CONSOLE_TOKEN", raising=False)
    assert load_token(None, read_only=True) == (None, False)
    token, generated = load_token(None, read_only=False)
    assert generated and token is not None and len(token) >= 24
    monkeypatch.setenv("DLQ_CONSOLE_TOKEN", "from-env")
    assert load_token(None, read_only=False) == ("from-env", False)
    path = tmp_path / "token"
    path.write_text("from-file\n")
    assert load_token(str(path), read_only=False) == ("from-file", False)
    path.write_text("")
    with pytest.raises(UsageError, match="empty"):
        load_token(str(path), read_only=False)


def test_bytes_are_shown_as_json_text_or_hex() -> None:
    assert show_bytes(b'{"a":1}').kind == "json" and '"a": 1' in show_bytes(b'{"a":1}').shown
    assert show_bytes(b"plain").kind == "text"
    assert show_bytes(b"\xff\x00").shown == "ff 00"
    assert show_bytes(None).kind == "null"
    big = show_bytes(b"x" * (MAX_SHOWN_BYTES + 1))
    assert big.cut and big.size == MAX_SHOWN_BYTES + 1 and len(big.shown) == MAX_SHOWN_BYTES


def test_query_parsing_refuses_what_the_cli_refuses() -> None:
    with pytest.raises(UsageError, match="unknown format"):
        filters_of({"format": ["nope"]})
    with pytest.raises(UsageError, match="bad time"):
        filters_of({"since": ["yesterday-ish"]})
    assert filters_of({"exception_class": ["A", ""], "message": ["x"]}) == Filters(
        exception_classes=("A",), message_contains="x"
    )
    assert _cursor("0:5,1:7") == {0: 5, 1: 7}
    with pytest.raises(UsageError):
        _cursor("0-5")


def test_pages_load_nothing_from_elsewhere_and_run_no_inline_script() -> None:
    """No CDN, no build step: every template and static file refers to the console's own /static files
    only, and no page holds an inline script (the CSP forbids them; the chart is server-side SVG)."""
    import re

    root = Path(__file__).resolve().parents[2] / "sidecar" / "ops" / "console"
    files = [*(root / "templates").glob("*.html"), *(root / "static").glob("*")]
    assert len(files) >= 10
    for path in files:
        text = path.read_text()
        assert not re.search(r"(?:src|href)=\"(?:https?:)?//", text), path.name
        assert "@import" not in text and "url(http" not in text, path.name
        for tag in re.findall(r"<script[^>]*>", text):
            assert re.fullmatch(r'<script src="/static/[a-z]+\.js" defer>', tag), (path.name, tag)
        assert not re.search(r"<script[^>]*>\s*[^<\s]", text), f"inline script in {path.name}"
        assert "javascript:" not in text and " on" + "click=" not in text, path.name
