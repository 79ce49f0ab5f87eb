"""`delivery.count.limit` and its old name `share.delivery.count.limit` (read with a deprecation note)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.cli import main
from sidecar.config import ConfigError, dump_config, parse_config

BASE: dict[str, Any] = {
    "kafka": {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"},
    "source": {"topics": ["t"]},
    "app": {"url": "http://127.0.0.1:8080/records"},
}
OLD, NEW = "share.delivery.count.limit", "delivery.count.limit"


@pytest.mark.parametrize("engine", ["consumer", "share"])
def test_the_new_name_sets_the_limit_of_either_engine(engine: str) -> None:
    config = parse_config({**BASE, "engine": engine, NEW: 3}, env={})
    assert config.delivery.delivery_count_limit == 3
    assert config.deprecations == ()


def test_the_old_name_is_read_with_a_deprecation_note() -> None:
    config = parse_config({**BASE, OLD: 3}, env={})
    assert config.delivery.delivery_count_limit == 3
    (note,) = config.deprecations
    assert note.startswith(f"{OLD} is deprecated: it is now {NEW}")
    # The same configuration as with the new name, and written back under the new name only.
    assert config == parse_config({**BASE, NEW: 3}, env={})
    dumped = dump_config(config)
    assert dumped[NEW] == 3 and OLD not in dumped


def test_both_names_at_once_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({**BASE, OLD: 3, NEW: 4}, env={})
    assert info.value.path == OLD
    assert f"keep {NEW} only" in info.value.reason


def test_the_old_name_keeps_its_range_check_under_its_own_path() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config({**BASE, OLD: 101}, env={})
    assert (info.value.path, "1..100" in info.value.reason) == (OLD, True)


def _file(tmp_path: Path, extra: dict[str, Any]) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({**BASE, **extra}), encoding="utf-8")
    return str(path)


def test_check_config_shows_the_deprecation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", "-c", _file(tmp_path, {OLD: 2})]) == 0
    err = capsys.readouterr().err
    assert f"config warning: {OLD} is deprecated: it is now {NEW}" in err
    assert main(["check-config", "--print", "-c", _file(tmp_path, {OLD: 2})]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)[NEW] == 2 and "deprecated" in err
    assert main(["check-config", "-c", _file(tmp_path, {NEW: 2})]) == 0
    assert "warning" not in capsys.readouterr().err


def test_check_config_refuses_both_names_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", "-c", _file(tmp_path, {OLD: 2, NEW: 2})]) == 2
    err = capsys.readouterr().err
    assert "config error" in err and OLD in err and f"keep {NEW} only" in err
