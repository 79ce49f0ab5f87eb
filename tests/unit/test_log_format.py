"""`logging.format: auto` (the default): text on a terminal, where a person reads it; JSON elsewhere,
where a pod's log collector does."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from sidecar.telemetry.logs import resolved_format, setup_logging


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_is_text_on_a_terminal_and_json_elsewhere() -> None:
    assert resolved_format("auto", _Terminal()) == "text"
    assert resolved_format("auto", io.StringIO()) == "json"
    assert resolved_format("auto", object()) == "json"  # no isatty: not a terminal
    for fmt in ("json", "logfmt", "text"):  # said in the config: as said
        assert resolved_format(fmt, _Terminal()) == fmt
        assert resolved_format(fmt, io.StringIO()) == fmt


@pytest.mark.parametrize(("stream", "is_json"), [(_Terminal(), False), (io.StringIO(), True)])
def test_the_default_writes_what_the_stream_is_for(
    monkeypatch: pytest.MonkeyPatch, stream: io.StringIO, is_json: bool
) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    monkeypatch.setattr(sys, "stderr", stream)
    try:
        setup_logging("info")
        logging.getLogger("sidecar.test").warning("hello")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    line = stream.getvalue().strip()
    if is_json:
        assert json.loads(line)["msg"] == "hello"
    else:
        assert line.endswith("WARNING sidecar.test: hello"), line
