"""The broker's jars: fetched once with Maven into the cache, the JVM command line, the cache's paths."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KAFKA_VERSION = "4.4.0"
HERE = Path(__file__).resolve().parent
POM = HERE / "kafka-pom.xml"

LOG4J2_PROPERTIES = """\
# Written by scripts/kafka: the broker logs to stdout, which the script sends to <run dir>/broker.log.
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.stdout.ref = STDOUT
logger.kafka.name = kafka
logger.kafka.level = info
logger.state.name = state.change.logger
logger.state.level = warn
logger.controller.name = kafka.controller
logger.controller.level = info
logger.zk.name = org.apache.kafka.clients
logger.zk.level = warn
"""


def cache_dir() -> Path:
    return Path(os.environ.get("DLQ_SIDECAR_CACHE", Path.home() / ".cache" / "dlq-sidecar"))


def kafka_home() -> Path:
    return cache_dir() / f"kafka-{KAFKA_VERSION}"


def say(msg: str) -> None:
    print(f"kafka: {msg}", file=sys.stderr, flush=True)


def fetch_jars() -> Path:
    """Resolve the broker's runtime jars with Maven into the cache; a second call downloads nothing."""
    home = kafka_home()
    libs = home / "libs"
    marker = home / ".complete"
    if marker.exists() and any(libs.glob("kafka_2.13-*.jar")):
        return libs
    if shutil.which("mvn") is None:
        sys.exit(
            "kafka: Maven (mvn) is needed to fetch the broker's jars; install it, or set KAFKA_BOOTSTRAP"
        )
    say(f"fetching Apache Kafka {KAFKA_VERSION} jars from Maven Central into {libs} (once)")
    cache_dir().mkdir(parents=True, exist_ok=True)  # a machine where nothing ran yet
    staging = Path(tempfile.mkdtemp(prefix="kafka-libs-", dir=cache_dir()))
    started = time.monotonic()
    cmd = [
        "mvn",
        "-q",
        "-B",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        sys.exit(
            f"kafka: Maven could not fetch the broker's jars (exit {proc.returncode}); "
            f"run `scripts/kafka fetch` where Maven Central is reachable:\n{tail}"
        )
    if libs.exists():
        shutil.rmtree(libs)
    home.mkdir(parents=True, exist_ok=True)
    staging.rename(libs)
    (home / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
    marker.write_text(f"{KAFKA_VERSION}\n")
    size_mb = sum(p.stat().st_size for p in libs.iterdir()) / 1e6
    say(
        f"fetched {len(list(libs.iterdir()))} jars, {size_mb:.0f} MB, in {time.monotonic() - started:.1f}s"
    )
    return libs


def java_cmd(libs: Path, main: str, *args: str, heap: str | None = None) -> list[str]:
    java = os.environ.get("JAVA_HOME")
    java_bin = str(Path(java) / "bin" / "java") if java else "java"
    cmd = [java_bin]
    if heap:
        cmd += [f"-Xms{heap}", f"-Xmx{heap}"]
    cmd += [
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={kafka_home() / 'log4j2.properties'}",
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]
    return cmd
