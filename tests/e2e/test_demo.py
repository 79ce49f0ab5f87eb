"""`dlq-sidecar demo` as a user runs it: a subprocess without a TTY, against the session's broker.

Each run uses its own topic (`--topic`), so it does not disturb other tests on the shared broker.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.harness import ROOT, free_port
from tests.kafkatools import Broker, Rec


def demo_command() -> list[str]:
    return [sys.executable, "-m", "sidecar", "demo"]


def run_demo(
    bootstrap: str, *args: str, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "COLUMNS": "120"}
    return subprocess.run(
        [*demo_command(), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def workdir_of(output: str) -> Path:
    match = re.search(r"-c (/\S+/dlq-sidecar-demo-[^/\s]+)/config\.yaml", output)
    assert match, output
    return Path(match.group(1))


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(proc.name))
    return pids


def summary_counts(output: str) -> dict[str, tuple[int, int | None]]:
    """Rows of the summary table: label -> (count, expected)."""
    rows: dict[str, tuple[int, int | None]] = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) >= 2 and cells[1].isdigit():
            expected = int(cells[2]) if len(cells) > 2 and cells[2].isdigit() else None
            rows[cells[0]] = (int(cells[1]), expected)
    return rows


def test_demo_small_run_succeeds_and_shows_dlq_records(bootstrap: str, unique: str) -> None:
    started = time.monotonic()
    proc = run_demo(bootstrap, "--records", "150", "--topic", f"orders-{unique}", "--show-dlq", "2")
    elapsed_s = time.monotonic() - started
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert elapsed_s < 100, f"the demo took {elapsed_s:.1f}s"  # quick even on a loaded machine

    # Non-interactive: plain progress lines, then the summary table.
    assert re.search(r"^\[\s*\d+\.\d+s\] produced \d+/150 +done \d+/150", out, re.M), out
    assert "dlq-sidecar demo: 150 orders in" in out
    assert "MISMATCH" not in out
    rows = summary_counts(out)
    # seed 7, 150 orders: ok 127, slow 7, flaky 6, hopeless 5, poison 5; delivery limit 5.
    assert rows["accepted"] == (127 + 7 + 6, 127 + 7 + 6)
    assert rows["rejected by the app -> DLQ"] == (5, 5)
    assert rows["archived at the limit (5) -> DLQ"] == (5, 5)
    assert rows["DLQ records written"] == (10, 10)
    assert rows["deliveries to the app (attempts)"][0] == 127 + 7 + 5 + 3 * 6 + 5 * 5

    # Two DLQ records, one per kind of failure, with their headers decoded.
    assert re.search(rf"dlq\.orders-{unique}\[0\]@\d+", out)

    def header(name: str, value: str) -> bool:
        return re.search(rf"{re.escape(name)}\s+│ {re.escape(value)}", out) is not None

    assert header("__dlq.errors.exception.class.name", "OrderValidationError"), out
    assert header("__dlq.errors.message", "Offset rejected by client.")
    assert header("__dlq.errors.exception.class.name", "InventoryUnavailable")
    assert header("__dlq.errors.message", "Offset delivery count exceeded")
    assert header("__dlq.errors.delivery.count", "5")
    assert header("__dlq.errors.topic", f"orders-{unique}")

    # Everything it started is stopped, and a successful run leaves no files behind.
    workdir = workdir_of(out)
    assert not workdir.exists()
    assert processes_mentioning(str(workdir)) == []


def test_demo_with_own_app_go_example(bootstrap: str, unique: str, tmp_path: Path) -> None:
    """--app-url: the demo pushes to an app the user runs (here the Go example), no expectations."""
    binary = tmp_path / "orders"
    build = subprocess.run(
        ["go", "build", "-o", str(binary), "."],
        cwd=ROOT / "examples" / "go",
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    api_port, app_port = free_port(), free_port()
    app = subprocess.Popen(
        [str(binary), "-port", str(app_port), "-quiet"],
        env={**os.environ, "SIDECAR_API": f"http://127.0.0.1:{api_port}"},
        stdout=subprocess.DEVNULL,
    )
    try:
        proc = run_demo(
            bootstrap,
            "--records",
            "100",
            "--topic",
            f"orders-{unique}",
            "--app-url",
            f"http://127.0.0.1:{app_port}/records",
            "--api-port",
            str(api_port),
            "--show-dlq",
            "1",
        )
    finally:
        app.send_signal(signal.SIGTERM)
        app.wait(10)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"using your app at http://127.0.0.1:{app_port}/records" in out
    assert "starting the example app" not in out
    rows = summary_counts(out)
    # Same rule, other language: seed 7, 100 orders: ok 86, slow 4, flaky 4, hopeless 3, poison 3.
    assert rows["accepted"] == (86 + 4 + 4, None)
    assert rows["DLQ records written"] == (6, None)
    assert "OrderValidationError" in out


def test_demo_fails_clearly_when_the_app_is_not_there(bootstrap: str, unique: str) -> None:
    port = free_port()
    proc = run_demo(
        bootstrap,
        "--records",
        "20",
        "--topic",
        f"orders-{unique}",
        "--app-url",
        f"http://127.0.0.1:{port}/records",
        "--timeout",
        "6",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert re.search(
        rf"dlq-sidecar demo: the sidecar cannot reach the app at http://127\.0\.0\.1:{port}/records",
        out,
    ), out
    # The logs are kept to explain the failure; the sidecar it started is stopped.
    workdir = workdir_of(out)
    assert (workdir / "sidecar.log").exists()
    assert processes_mentioning(str(workdir)) == []
    assert f"logs kept in {workdir}" in out
    shutil.rmtree(workdir)


def test_demo_rejects_bad_arguments() -> None:
    proc = subprocess.run(
        [*demo_command(), "--records", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "--records: must be at least 1" in proc.stderr


def test_demo_stops_everything_on_sigterm_mid_run(
    bootstrap: str, unique: str, tmp_path: Path
) -> None:
    out_path = tmp_path / "demo.out"
    env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "COLUMNS": "120"}
    with open(out_path, "wb") as out_file:
        proc = subprocess.Popen(
            [*demo_command(), "--records", "2000", "--topic", f"orders-{unique}"],
            cwd=ROOT,
            env=env,
            stdout=out_file,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while "] produced" not in out_path.read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, out_path.read_text()
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = out_path.read_text()
    assert code == 130, out
    assert "dlq-sidecar demo: interrupted" in out
    workdir = workdir_of(out)
    assert processes_mentioning(str(workdir)) == []
    assert not workdir.exists()


def test_derived_config_is_the_example_with_this_runs_addresses(tmp_path: Path) -> None:
    """The demo's config is config.example.yaml plus overrides, and the sidecar accepts it."""
    from sidecar.config import load_config
    from sidecar.ops.demo.setup import derive_config, find_layout

    layout = find_layout()
    out = tmp_path / "config.yaml"
    derived = derive_config(
        layout.example_config,
        out,
        bootstrap="127.0.0.1:19092",
        group="g-demo",
        topic="orders-x",
        app_url="http://127.0.0.1:18080/records",
        api_listen="127.0.0.1:18787",
    )
    config = load_config(out)
    assert config.group_id == "g-demo"
    assert list(config.source.topics) == ["orders-x"]
    assert config.dlq_topic_for("orders-x") == "dlq.orders-x"
    assert derived["kafka"]["bootstrap.servers"] == "127.0.0.1:19092"
    assert derived["errors.retry.delay.initial.ms"] == 100
    # Everything not overridden is the example's own value.
    example = yaml.safe_load(layout.example_config.read_text())
    overridden = {"kafka", "source", "app", "api"} | {
        k for k in derived if k.startswith("errors.retry.delay") or k.endswith(".ms")
    }
    for key, value in example.items():
        if key not in overridden:
            assert derived[key] == value, key
    assert derived["delivery.count.limit"] == example["delivery.count.limit"]


def test_expected_outcomes_follow_the_apps_rule() -> None:
    from sidecar.ops.demo.orders import expected_outcomes, plan_orders

    orders = plan_orders(150, 7)
    assert orders == plan_orders(150, 7)  # seeded: every run sees the same stream
    exp = expected_outcomes(orders, 5)
    assert (exp.accepted, exp.rejected, exp.exhausted) == (127 + 7 + 6, 5, 5)
    assert exp.attempts == 127 + 7 + 5 + 3 * 6 + 5 * 5
    # With a limit of 2, flaky orders cannot reach their accepting 3rd delivery.
    low = expected_outcomes(orders, 2)
    assert (low.accepted, low.exhausted) == (127 + 7, 5 + 6)


def test_demo_asks_before_replacing_topics_on_a_broker_it_did_not_start(
    broker: Broker, bootstrap: str, unique: str
) -> None:
    """A broker the demo did not start (KAFKA_BOOTSTRAP) with the topic there: no TTY to ask, so the
    demo stops before touching it; with --yes it goes on, and its listing shows each kind first."""
    topic = f"orders-{unique}"
    broker.create_topic(topic, partitions=1)
    broker.produce(topic, [Rec(b"k", b"someone else's order")])
    refused = run_demo(bootstrap, "--records", "150", "--topic", topic)
    out = refused.stdout + refused.stderr
    assert refused.returncode == 1, out
    assert f"was not started by the demo and has {topic}" in out, out
    assert "--yes" in out and "--topic NAME" in out
    assert "logs kept" not in out  # nothing was started
    assert broker.count_records(topic) == 1  # untouched

    proc = run_demo(bootstrap, "--yes", "--records", "150", "--topic", topic, "--show-dlq", "3")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "the first of each kind of failure" in out
    classes = re.findall(r"__dlq\.errors\.exception\.class\.name\s+│ (\w+)", out)
    assert len(classes) == 3, out
    # Two kinds in the demo's mix (rejected, archived at the limit): both come first.
    assert set(classes[:2]) == {"OrderValidationError", "InventoryUnavailable"}, classes
