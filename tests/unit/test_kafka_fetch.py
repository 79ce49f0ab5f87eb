"""The broker launcher's jar fetch on a machine where nothing ran yet (no cache directory)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.ops.broker import jars as kafka_broker


def test_fetch_on_a_fresh_machine_creates_the_cache_or_says_which_command_fetches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "never" / "created"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mvn = bin_dir / "mvn"
    mvn.write_text("#!/bin/sh\necho 'Could not resolve dependencies (offline)'\nexit 1\n")
    mvn.chmod(0o755)
    monkeypatch.setenv("DLQ_SIDECAR_CACHE", str(cache))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    # Before: FileNotFoundError for .../kafka-libs-XXXX (the cache directory did not exist).
    with pytest.raises(SystemExit) as info:
        kafka_broker.fetch_jars()
    message = str(info.value.code)
    assert message.splitlines()[0].endswith(
        "run `scripts/kafka fetch` where Maven Central is reachable:"
    )
    assert "offline" in message
    assert cache.is_dir() and not list(cache.glob("kafka-libs-*"))  # the staging dir is removed
