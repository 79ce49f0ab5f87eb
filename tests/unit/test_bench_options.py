"""`python -m bench --set KEY=VALUE`: keys for this checkout's sidecar only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from bench import sidecars
from bench.sidecar_bench import parse_args


@pytest.fixture(autouse=True)
def _clean_keys() -> Iterator[None]:
    sidecars.NEW_SIDE_KEYS.clear()
    yield
    sidecars.NEW_SIDE_KEYS.clear()


def test_set_keys_are_read_as_yaml() -> None:
    parse_args(["--set", "source.intake=signal", "--set", "app.max.in.flight=64"])
    assert sidecars.NEW_SIDE_KEYS == {"source.intake": "signal", "app.max.in.flight": 64}


def test_a_set_without_a_value_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--set", "source.intake"])
    assert exc.value.code == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


def test_a_set_key_goes_into_its_section_and_the_sidecar_takes_the_config() -> None:
    from sidecar.config import parse_config

    text = (
        "kafka:\n  bootstrap.servers: 127.0.0.1:9\n  group.id: g\n"
        "source:\n  topics: [t]\n"
        "app:\n  url: http://127.0.0.1:9/records\n"
        "errors.deadletterqueue.topic.name: dlq.t\n"
    )
    out = sidecars.with_keys(text, {"source.intake": "signal", "commit.interval.ms": 500})
    config = parse_config(yaml.safe_load(out), env={})
    assert config.source.intake.value == "signal"
    assert config.commit_interval_ms == 500
