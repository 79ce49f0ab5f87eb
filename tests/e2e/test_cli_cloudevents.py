"""The CLI on bad CloudEvents settings: the key's dotted path and the reason, exit code 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli import GOOD, _write, cli


def _app(**app: Any) -> dict[str, Any]:
    return {**GOOD, "app": {**GOOD["app"], **app}}


@pytest.mark.parametrize(
    ("app", "named"),
    [
        ({"format": "structured"}, "app.format: must be one of raw, cloudevents"),
        (
            {"format": "cloudevents", "cloudevents.source": "my source"},
            "app.cloudevents.source: 'my source' is not a URI-reference",
        ),
        ({"cloudevents.type": ""}, "app.cloudevents.type: must not be empty"),
    ],
    ids=["format", "source", "type"],
)
def test_check_config_rejects_bad_cloudevents_keys(
    tmp_path: Path, app: dict[str, Any], named: str
) -> None:
    done = cli("check-config", "-c", str(_write(tmp_path, _app(**app))))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_check_config_accepts_cloudevents(tmp_path: Path) -> None:
    path = _write(tmp_path, _app(format="cloudevents", **{"cloudevents.type": "com.x.{topic}"}))
    done = cli("check-config", "-c", str(path))
    assert done.returncode == 0, (done.stdout, done.stderr)
