"""Mistakes in the config file, through the installed command: librdkafka's own verdict on `kafka:`
(names and values), typos of required keys and of every section's keys, each an exit 2 with the key's
path, the reason and a "did you mean", from `check-config` and from `run`, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.test_cli import GOOD, _with, _write, cli

CASES = [
    # (what, path to set, value, the key's path in the message, parts of the reason)
    (
        "unknown librdkafka name",
        ["kafka", "auto.offset.rest"],
        "earliest",
        "kafka.auto.offset.rest",
        ['No such configuration property: "auto.offset.rest"', "did you mean 'auto.offset.reset'?"],
    ),
    (
        "enum word librdkafka refuses",
        ["kafka", "auto.offset.reset"],
        "begining",
        "kafka.auto.offset.reset",
        ['Invalid value "begining"', "earliest", "did you mean 'beginning'?"],
    ),
    (
        "integer with a unit",
        ["kafka", "session.timeout.ms"],
        "45s",
        "kafka.session.timeout.ms",
        ["expected a whole number, got '45s'", "read it as 45"],
    ),
    (
        "integer out of librdkafka's range",
        ["kafka", "session.timeout.ms"],
        0,
        "kafka.session.timeout.ms",
        ["outside allowed range 1..3600000"],
    ),
    (
        "integer past 32 bits",
        ["kafka", "message.timeout.ms"],
        9_999_999_999,
        "kafka.message.timeout.ms",
        ["outside librdkafka's range", "2147483647"],
    ),
    (
        "bool librdkafka refuses",
        ["kafka", "enable.idempotence"],
        "maybe",
        "kafka.enable.idempotence",
        ["Expected bool value"],
    ),
    (
        "producer property misspelt",
        ["kafka", "linger.msec"],
        5,
        "kafka.linger.msec",
        ["did you mean 'linger.ms'?"],
    ),
    (
        "SASL without credentials",
        ["kafka", "sasl.mechanism"],
        "PLAIN",
        "kafka",
        ["librdkafka refuses the consumer: sasl.username and sasl.password must be set"],
    ),
    (
        "acks against idempotence",
        ["kafka", "acks"],
        1,
        "kafka.acks",
        ["`acks` must be set to `all` when `enable.idempotence` is true"],
    ),
    ("app typo", ["app", "ulr"], "http://x/", "app.ulr", ["unknown key; did you mean 'url'?"]),
    ("api typo", ["api", "lisen"], "127.0.0.1:1", "api.lisen", ["did you mean 'listen'?"]),
    ("source typo", ["source", "topcs"], ["a"], "source.topcs", ["did you mean 'topics'?"]),
    (
        "top-level typo",
        ["delivery.count.limt"],
        3,
        "delivery.count.limt",
        ["did you mean 'delivery.count.limit'?"],
    ),
]


# The other half of the cases librdkafka refuses as a whole configuration.
COMPANIONS = {
    "sasl.mechanism": {"security.protocol": "sasl_plaintext"},
    "acks": {"enable.idempotence": True},
}


def _check(result: object, path: str, parts: list[str]) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)  # type: ignore[attr-defined]
    err = result.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in err and "ExceptionGroup" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert f": {path}: " in err, err
    for part in parts:
        assert part in err, (part, err)


@pytest.mark.parametrize(
    ("what", "key", "value", "path", "parts"), CASES, ids=[c[0] for c in CASES]
)
def test_check_config_and_run_name_the_key(
    tmp_path: Path, what: str, key: list[str], value: object, path: str, parts: list[str]
) -> None:
    doc = _with(key, value)
    doc["kafka"].update(COMPANIONS.get(key[-1], {}))  # type: ignore[attr-defined]
    config = _write(tmp_path, doc)
    _check(cli("check-config", "-c", str(config)), path, parts)
    _check(cli("run", "-c", str(config), timeout_s=60), path, parts)


def test_a_misspelt_required_key_is_pointed_at(tmp_path: Path) -> None:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    doc["kafka"]["bootstrap.server"] = doc["kafka"].pop("bootstrap.servers")
    config = _write(tmp_path, doc)
    for args in (("check-config",), ("run",)):
        _check(cli(*args, "-c", str(config)), "kafka.bootstrap.server", ["'bootstrap.servers'"])
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    doc["kafka"]["group.ib"] = doc["kafka"].pop("group.id")
    _check(cli("check-config", "-c", str(_write(tmp_path, doc))), "kafka.group.ib", ["'group.id'"])


def test_secrets_are_not_echoed(tmp_path: Path) -> None:
    config = _write(tmp_path, _with(["kafka", "ssl.key.password"], ["hunter2-secret"]))
    result = cli("check-config", "-c", str(config))
    assert result.returncode == 2
    assert "hunter2-secret" not in result.stderr


def test_good_librdkafka_properties_pass(tmp_path: Path) -> None:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    doc["kafka"].update(
        {
            "auto.offset.reset": "latest",
            "session.timeout.ms": 45000,
            "enable.idempotence": True,
            "acks": "all",
            "compression.type": "zstd",
            "security.protocol": "plaintext",
            "client.id": "1-shop",
            "debug": "cgrp",
            "ssl.ca.location": "/only/in/the/pod/ca.crt",  # files are read at run time, not here
        }
    )
    result = cli("check-config", "-c", str(_write(tmp_path, doc)))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # the check's own clients log nothing
