"""The other DLQ writers, for real: a standalone Kafka Connect worker, a Kafka Streams app, a Spring program.

Their jars are fetched by `make tools` (scripts/fetch-dlq-writers, from the POMs here) into
<cache>/dlq-writers/<writer>/libs; a test that finds them missing fails and says so. The small Java
sources in java/dlqwriters/ are compiled with javac once (the classes are cached under
<cache>/dlq-writers/classes/, keyed by a hash of the sources and the jars, so a second session or a
second test worker reuses them). `java_process` starts one of them against the test broker, waits until
it is ready, and stops it with SIGTERM (its own shutdown hooks close it cleanly) when the block ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
JAVA_SOURCES = HERE / "java" / "dlqwriters"
SOURCES = {
    "connect": ("RecordingSinkConnector.java", "RecordingSinkTask.java"),
    "streams": ("StreamsDlqApp.java",),
    "spring": ("SpringDlqApp.java",),
}
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
LOG4J2_PROPERTIES = """\
# Written by tests/dlqwriters: warnings and errors only, to stdout (the test's log file).
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = STDOUT
"""


def cache_root() -> Path:
    base = Path(os.environ.get("DLQ_SIDECAR_CACHE", Path.home() / ".cache" / "dlq-sidecar"))
    return base / "dlq-writers"


def libs(writer: str) -> Path:
    """The writer's jars, as fetched by `make tools`; the test fails when they are missing."""
    path = cache_root() / writer / "libs"
    if not (cache_root() / writer / ".complete").exists() or not any(path.glob("*.jar")):
        pytest.fail(
            f"the {writer} jars are missing from {path}: run `make tools` (scripts/fetch-dlq-writers)",
            pytrace=False,
        )
    return path


def classes(writer: str) -> Path:
    """The writer's compiled Java classes: compiled once, then reused while sources and jars are the same."""
    jars = libs(writer)
    digest = hashlib.sha256()
    for name in SOURCES[writer]:
        digest.update(name.encode() + b"\0" + (JAVA_SOURCES / name).read_bytes())
    for jar in sorted(jars.glob("*.jar")):
        digest.update(jar.name.encode() + b"\0")
    target = cache_root() / "classes" / f"{writer}-{digest.hexdigest()[:16]}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{writer}-", dir=target.parent))
    proc = subprocess.run(
        [
            "javac",
            "--release",
            "17",
            "-d",
            str(staging),
            "-cp",
            f"{jars}/*",
            *(str(JAVA_SOURCES / name) for name in SOURCES[writer]),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.fail(f"javac failed for the {writer} writer:\n{proc.stderr}", pytrace=False)
    try:
        staging.rename(target)
    except OSError:  # another test worker compiled the same classes meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _log4j_config() -> Path:
    path = cache_root() / "log4j2.properties"
    if not path.exists() or path.read_text() != LOG4J2_PROPERTIES:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(LOG4J2_PROPERTIES)
        tmp.replace(path)
    return path


def log_tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    proc: subprocess.Popen[bytes] | None = None,
    log: Path | None = None,
) -> None:
    """Poll `predicate` until it holds; fail with the process's log when it exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc is not None and proc.poll() is not None:
            tail = log_tail(log) if log else ""
            raise AssertionError(
                f"the process exited ({proc.returncode}) waiting for {what}:\n{tail}"
            )
        if time.monotonic() > deadline:
            tail = log_tail(log) if log else ""
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}:\n{tail}")
        time.sleep(0.2)


@contextlib.contextmanager
def java_process(
    writer: str,
    main: str,
    args: Sequence[str],
    log: Path,
    ready: Callable[[], bool],
    heap: str = "256m",
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `main` with the writer's classes and jars until the block ends; yield once `ready()` holds."""
    classpath = f"{classes(writer)}:{libs(writer)}/*"
    cmd = [
        "java",
        f"-Xmx{heap}",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",  # short-lived: start-up time matters more than peak speed
        f"-Dlog4j2.configurationFile={_log4j_config()}",
        "-cp",
        classpath,
        main,
        *args,
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(ready, START_TIMEOUT_S, f"{writer} ({main}) to be ready", proc, log)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def log_says(log: Path, text: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return text in log.read_text(errors="replace")
        except OSError:
            return False

    return check


def connect_task_running(port: int, connector: str) -> Callable[[], bool]:
    """True once the standalone worker's REST API reports the connector's task RUNNING."""

    def check() -> bool:
        url = f"http://127.0.0.1:{port}/connectors/{connector}/status"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body = resp.read().decode()
        except (urllib.error.URLError, OSError):
            return False
        return '"tasks":[{"id":0,"state":"RUNNING"' in body.replace(" ", "")

    return check
