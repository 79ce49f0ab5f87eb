"""The `dlq-sidecar` command as users run it: the installed console script, exit codes, messages, signals."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from sidecar.http.server import Response
from tests.harness import (
    ROOT,
    RecordingApp,
    running_sidecar,
    wait_until,
    wait_until_thread,
)
from tests.kafkatools import Broker, Rec


def _script() -> str:
    beside = Path(sys.executable).parent / "dlq-sidecar"
    found = str(beside) if beside.exists() else shutil.which("dlq-sidecar")
    assert found, "the dlq-sidecar console script is not installed"
    return found


def cli(*args: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_script(), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=str(ROOT),
        check=False,
    )


GOOD = {
    "kafka": {"bootstrap.servers": "127.0.0.1:1", "group.id": "g"},
    "source": {"topics": ["orders"]},
    "app": {"url": "http://127.0.0.1:8080/records"},
}


def _write(tmp_path: Path, doc: object, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def _with(path: list[str], value: object) -> dict[str, object]:
    doc = yaml.safe_load(yaml.safe_dump(GOOD))
    node = doc
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return doc  # type: ignore[no-any-return]


def test_help_lists_the_commands() -> None:
    top = cli("--help")
    assert top.returncode == 0, top.stderr
    assert "run" in top.stdout and "check-config" in top.stdout
    for command in ("run", "check-config"):
        sub = cli(command, "--help")
        assert sub.returncode == 0, sub.stderr
        assert "--config" in sub.stdout
    bare = cli()
    assert bare.returncode == 2


def test_check_config_accepts_a_good_file(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD)
    done = cli("check-config", "-c", str(path))
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout and "dlq.orders" in done.stdout
    printed = cli("check-config", "-c", str(path), "--print")
    assert printed.returncode == 0, printed.stderr
    assert "orders" in printed.stdout


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        (_with(["app", "urlx"], "http://127.0.0.1:1/"), "app.urlx"),
        (_with(["share.delivery.count.limit"], "five"), "share.delivery.count.limit"),
        (_with(["share.delivery.count.limit"], 0), "share.delivery.count.limit"),
        (
            _with(["errors.deadletterqueue.topic.name"], "__dlq"),
            "errors.deadletterqueue.topic.name",
        ),
        (_with(["app", "url"], "http://10.1.2.3:80/records"), "app.url"),
        ({k: v for k, v in GOOD.items() if k != "source"}, "source: required"),
        ("kafka: [unclosed\n", "invalid yaml"),
    ],
    ids=["unknown-key", "bad-type", "bad-range", "dlq-name", "non-loopback", "missing", "syntax"],
)
def test_check_config_rejects_a_bad_file_naming_the_key(
    tmp_path: Path, doc: object, named: str
) -> None:
    path = _write(tmp_path, doc)
    done = cli("check-config", "-c", str(path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert named.lower() in done.stderr.lower(), done.stderr
    assert "Traceback" not in done.stderr


_GOOD_TEXT = yaml.safe_dump(GOOD)


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        (_GOOD_TEXT + "commit.interval.ms: " + "9" * 5000 + "\n", "5000 digits"),
        (_GOOD_TEXT + "x: " + "[" * 5000 + "\n", "nested more than 64 levels"),
        (_GOOD_TEXT + "x: !!timestamp never\n", "timestamp"),
        (_with(["app", "headers"], {"X-A": "a\tb"}), "app.headers.X-A"),
        (_with(["app", "headers"], {"X-A": "caf\u00e9"}), "app.headers.X-A"),
        (_with(["app", "headers"], {"X-A": "a\rb"}), "app.headers.X-A"),
        (_with(["app", "headers"], {"X(A)": "v"}), "app.headers.X(A)"),
        (_with(["app", "url"], "http://127.0.0.1:8080/a b"), "app.url"),
        (_with(["app", "url"], "http://127.0.0.1:8080/a|b"), "app.url"),
        (_with(["kafka", "group.id"], "g\ud800"), "kafka.group.id"),
    ],
    ids=[
        "huge-int",
        "deep-nesting",
        "tag",
        "header-tab",
        "header-non-ascii",
        "header-cr",
        "header-name",
        "url-space",
        "url-pipe",
        "surrogate",
    ],
)
def test_check_config_rejects_inputs_that_used_to_crash(
    tmp_path: Path, doc: object, named: str
) -> None:
    # Before: a traceback and exit 1 (huge integer, deep nesting, a tag), or "ok" and then an
    # uncaught WireError at the first delivery (headers, URL).
    path = _write(tmp_path, doc)
    done = cli("check-config", "-c", str(path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "config error" in done.stderr and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr) < 1000


def test_check_config_print_masks_secrets(tmp_path: Path) -> None:
    doc = _with(["app", "headers"], {"X-Auth": "hunter2", "X-Tenant": "acme"})
    doc["kafka"]["sasl.oauthbearer.config"] = "principal=p secret=s3cr3t"
    doc["kafka"]["sasl.oauthbearer.token.endpoint.url"] = "https://id:pw0rd@idp.example/token"
    done = cli("check-config", "-c", str(_write(tmp_path, doc)), "--print")
    assert done.returncode == 0, done.stderr
    for secret in ("hunter2", "s3cr3t", "pw0rd"):
        assert secret not in done.stdout, secret
    assert "https://***@idp.example/token" in done.stdout and "acme" in done.stdout


def test_check_config_on_a_missing_file_exits_2(tmp_path: Path) -> None:
    done = cli("check-config", "-c", str(tmp_path / "nope.yaml"))
    assert done.returncode == 2
    assert "nope.yaml" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("app", "named"),
    [
        ({"mode": "pull", "url": "http://127.0.0.1:8080/records"}, "app.url: must be left out"),
        ({"mode": "pull", "unix_socket": "/tmp/app.sock"}, "app.unix_socket: must be left out"),
        ({"mode": "single"}, "app.url: required with app.mode: single"),
    ],
    ids=["pull-with-url", "pull-with-socket", "push-without-url"],
)
def test_pull_mode_contradictions_exit_2_naming_the_key(
    tmp_path: Path, app: dict[str, Any], named: str
) -> None:
    path = _write(tmp_path, {**GOOD, "app": app})
    done = cli("check-config", "-c", str(path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert named in done.stderr, done.stderr
    path = _write(tmp_path, {**GOOD, "app": {"mode": "pull"}})
    assert cli("check-config", "-c", str(path)).returncode == 0


def test_run_with_a_bad_config_exits_2_before_connecting(tmp_path: Path) -> None:
    path = _write(tmp_path, _with(["app", "timeout.ms"], -1))
    done = cli("run", "-c", str(path), timeout_s=20)
    assert done.returncode == 2, done.stderr
    assert "app.timeout.ms" in done.stderr


# --------------------------------------------------------------------------------------------- signals


def _running(
    broker: Broker, unique: str, tmp_path: Path, app: RecordingApp, n: int, **extra: Any
) -> Any:
    """`n` records in a fresh topic, the app, and the installed console script running them."""
    return running_sidecar(
        broker,
        tmp_path,
        app,
        unique=unique,
        extra=extra or None,
        produce_first=[Rec(key=f"k{i}".encode(), value=b"v") for i in range(n)],
        command=[_script()],
    )


async def test_sigterm_drains_commits_and_exits_0(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    app = RecordingApp()
    async with _running(broker, unique, tmp_path, app, 20) as r:
        topic, group, sc = r.topic, r.group, r.sc
        await wait_until(lambda: len(app.deliveries) >= 20, 60, "20 deliveries")
        start = trio.current_time()
        assert await sc.stop(signal.SIGTERM, timeout_s=30) == 0, sc.log_text()[-2000:]
        assert trio.current_time() - start < 15
    assert "stopped cleanly" in sc.log_text()
    end = (await trio.to_thread.run_sync(broker.end_offsets, topic, [0]))[0]
    await wait_until_thread(
        lambda: broker.committed(group, topic, [0])[0][0] == end, 60, "the final commit"
    )


async def test_second_sigterm_cuts_a_long_drain_short(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    # Every record is deferred and never answered: the drain would wait its full minute.
    app = RecordingApp(policy=lambda _d: Response(202))
    async with _running(
        broker,
        unique,
        tmp_path,
        app,
        5,
        **{"shutdown.drain.timeout.ms": 60000, "share.record.lock.duration.ms": 120000},
    ) as r:
        topic, group, sc = r.topic, r.group, r.sc
        await wait_until(lambda: len(app.deliveries) >= 5, 60, "5 deliveries")
        sc.proc.send_signal(signal.SIGTERM)
        first_sigterm = trio.current_time()

        async def draining() -> bool:
            code, st = await sc.get("/v1/status")
            return code == 200 and st["draining"] is True

        with trio.fail_after(30):
            while sc.proc.poll() is None and not await draining():
                await trio.sleep(0.1)
        # Still running 1.5 s after the first SIGTERM: it waits for the drain (60 s).
        await trio.sleep_until(first_sigterm + 1.5)
        assert sc.proc.returncode is None, "the first SIGTERM did not wait for the drain"
        code, st = await sc.get("/v1/status")
        assert code == 200 and st["draining"] is True, st
        start = trio.current_time()
        assert await sc.stop(signal.SIGTERM, timeout_s=30) == 0, sc.log_text()[-2000:]
        assert trio.current_time() - start < 20, "the second SIGTERM did not cut the drain"
    assert "again" in sc.log_text()
    # Nothing was answered: the committed offset must not pass the deferred records.
    committed = await trio.to_thread.run_sync(broker.committed, group, topic, [0])
    assert committed[0][0] in (0, -1001), committed
