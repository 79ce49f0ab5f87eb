"""The sidecar's retry tiers side by side with Spring Kafka's non-blocking retries (retry topics),
``python -m bench --scenarios spring-vs-tiers``: the same broker, records, failure pattern and machine,
runs alternated (A B A B).

Both contenders read the same records (``--records``, 1 KiB, 6 partitions) with a fresh consumer group
per run, and both accept every record at once except 10 % of the source offsets (the same function of
partition and offset, ``bench.benchapp.tier_fate``), which fail on their first delivery and are accepted
when they come back 2 s later:

- Spring: ``bench/spring/RetryTopicsBench.java``, a plain Spring context (no Spring Boot) whose
  ``@KafkaListener`` gets a ``RetryTopicConfiguration`` of a fixed 2 s back-off and 2 attempts (the
  first delivery and one from the retry topic), then the DLT. The listener is in the JVM: no HTTP.
  Compiled with ``javac`` at bench time against the spring-kafka jars that ``scripts/fetch-dlq-writers``
  fetches once into ``~/.cache/dlq-sidecar/dlq-writers/spring/libs`` (the classes are cached beside
  them, by the source's digest). Java 17+.
- the sidecar: scenario ``t-tiers`` (``bench.sidecars.sidecar_config``): single mode, TCP, ordering
  key, ``errors.retry.tiers: [2s]``; the bench app answers 503 for the 10 % on their first delivery.

Each run's retry topic (Spring's ``<topic>-retry-<run>`` and DLT, the sidecar's tier topic) is created
by the bench with ``message.timestamp.type=LogAppendTime``: a retry record's timestamp is the time the
broker wrote it, for both. A retried record's lateness is its receive time at the app (the JVM's
listener; the bench app) minus its due time, the retry record's write time + 2 s. After each run the
bench reads the retry topic to match each retry record to its original (Spring's
``kafka_original-partition`` / ``-offset`` headers, the sidecar's ``__dlq.retry.partition`` /
``.offset``).

Figures per run: clean records/s (the records accepted on their first delivery, from the first
record to the last of them), CPU per source record (utime + stime from /proc of the JVM, or of the
sidecar process, from the first record to every offset committed; the sidecar's app separately), the
lateness p50 / p99 / max, records lost (never accepted) or delivered more than the pattern needs
(once, or twice for the 10 %), DLT records, and peak RSS (VmHWM). The medians over the rounds are
printed in one table.

``BENCH_SPRING_JAVA_OPTS`` adds options to the JVM's command line (e.g. ``-Xmx256m``, or
``-Dbench.consumer.fetch.max.wait.ms=10``: a ``bench.consumer.*`` property is a consumer setting of
the Spring side; ``-Dbench.verifyPartition=false``: its recoverer does not look up the retry topic's
partitions; ``-Dbench.failPercent=0``: its listener fails nothing); the figures of record use none.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from bench.app import App
from bench.broker import PARTITIONS, VALUE_BYTES, Broker
from bench.measure import ROOT, cpu_seconds, percentile, proc_status_kb
from bench.sidecars import Side, running_sidecar, sidecar_config, wait_until

SPRING_SCENARIOS = ["spring-vs-tiers"]
CONTENDERS = ("sidecar", "spring")
DELAY_MS = 2000
SOURCE = ROOT / "bench" / "spring" / "RetryTopicsBench.java"
MAIN_CLASS = "RetryTopicsBench"
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}
# The original's coordinates on a retry record: Spring's (binary, big-endian) and the sidecar's (text).
SPRING_PARTITION, SPRING_OFFSET = "kafka_original-partition", "kafka_original-offset"
TIER_PARTITION, TIER_OFFSET = "__dlq.retry.partition", "__dlq.retry.offset"
# The due time each writes on its retry record (epoch ms): Spring's back-off timestamp (a Java
# BigInteger's bytes: signed big-endian, as long as it needs) and the sidecar's (decimal text).
SPRING_DUE, TIER_DUE = "retry_topic-backoff-timestamp", "__dlq.retry.due"


def selected(wanted: list[str]) -> list[str]:
    return [s for s in SPRING_SCENARIOS if any(s == w or s.startswith(w) for w in wanted)]


# ------------------------------------------------------------------------------- pure helpers


def retry_origin(headers: Iterable[tuple[str, bytes | None]]) -> tuple[int, int] | None:
    """The original (partition, offset) a retry record names: Spring's binary headers (a 4-byte
    partition, an 8-byte offset) or the sidecar's decimal text; None when it names none. The last
    occurrence of a header counts (a record retried twice carries each)."""
    found: dict[str, bytes] = {}
    for name, value in headers:
        if value is not None and name in (
            SPRING_PARTITION,
            SPRING_OFFSET,
            TIER_PARTITION,
            TIER_OFFSET,
        ):
            found[name] = value
    if SPRING_PARTITION in found and SPRING_OFFSET in found:
        partition, offset = found[SPRING_PARTITION], found[SPRING_OFFSET]
        if len(partition) != 4 or len(offset) != 8:
            raise ValueError(
                f"Spring's original partition/offset: {len(partition)}/{len(offset)} bytes"
            )
        return int.from_bytes(partition, "big", signed=True), int.from_bytes(
            offset, "big", signed=True
        )
    if TIER_PARTITION in found and TIER_OFFSET in found:
        return int(found[TIER_PARTITION]), int(found[TIER_OFFSET])
    return None


def retry_due(headers: Iterable[tuple[str, bytes | None]]) -> int | None:
    """The due time (epoch ms) a retry record carries, Spring's or the sidecar's; the last counts."""
    due: int | None = None
    for name, value in headers:
        if value is None:
            continue
        if name == SPRING_DUE:
            due = int.from_bytes(value, "big", signed=True)
        elif name == TIER_DUE:
            due = int(value)
    return due


def outcome(
    ends: dict[int, int],
    trace: Sequence[Sequence[int]],
    written_ms: dict[tuple[int, int], int],
    own_due_ms: dict[tuple[int, int], int] | None = None,
    delay_ms: int = DELAY_MS,
) -> dict[str, Any]:
    """The records' fate from one run: ``trace`` rows are [partition, offset, deliveries, accepts,
    retry received µs or 0] per source record seen; ``written_ms`` maps an original to its retry
    record's write time (epoch ms). Lost: a source record never accepted; doubled: delivered more than
    the pattern needs (once; twice when it has a retry record) or accepted more than once. Lateness of
    each retried record: received - (written + delay), in ms; and against the due time the retry
    record itself carries (``own_due_ms``: each contender's own clock, before the broker's write)."""
    seen = {(int(r[0]), int(r[1])): r for r in trace}
    lost = doubled = 0
    late: list[float] = []
    own_late: list[float] = []
    for partition, end in ends.items():
        for offset in range(end):
            row = seen.get((partition, offset))
            if row is None or int(row[3]) == 0:
                lost += 1
                continue
            retried = (partition, offset) in written_ms
            if int(row[2]) > (2 if retried else 1) or int(row[3]) > 1:
                doubled += 1
            if retried and int(row[4]):
                due_us = (written_ms[partition, offset] + delay_ms) * 1000
                late.append((int(row[4]) - due_us) / 1000)
                own = (own_due_ms or {}).get((partition, offset))
                if own is not None:
                    own_late.append((int(row[4]) - own * 1000) / 1000)
    return {
        "lost": lost,
        "doubled": doubled,
        "retried": len(written_ms),
        "late_p50_ms": percentile(late, 50),
        "late_p99_ms": percentile(late, 99),
        "late_max_ms": max(late) if late else float("nan"),
        "late_min_ms": min(late) if late else float("nan"),
        "own_late_p50_ms": percentile(own_late, 50),
        "own_late_p99_ms": percentile(own_late, 99),
        "own_late_max_ms": max(own_late) if own_late else float("nan"),
        "own_late_min_ms": min(own_late) if own_late else float("nan"),
    }


# ------------------------------------------------------------------------------- broker reads


def retry_writes(
    broker: Broker, topic: str
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], int], int]:
    """Every record of a retry topic: original -> its write time (the broker's LogAppendTime, ms),
    original -> the due time the record carries, and how many records there were (a second retry
    record of one original would show as more records than originals)."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": f"bench-read-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    out: dict[tuple[int, int], int] = {}
    dues: dict[tuple[int, int], int] = {}
    count = 0
    try:
        ends = {}
        for p in range(PARTITIONS):
            ends[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        want = sum(ends.values())
        consumer.assign([TopicPartition(topic, p, 0) for p in ends if ends[p] > 0])
        deadline = time.monotonic() + 60
        while count < want and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is not None:
                    raise RuntimeError(f"reading {topic}: {msg.error()}")
                count += 1
                kind, ms = msg.timestamp()
                if kind != TIMESTAMP_LOG_APPEND_TIME:
                    raise RuntimeError(f"{topic}: a record without LogAppendTime ({kind})")
                origin = retry_origin(msg.headers() or ())
                if origin is None:
                    raise RuntimeError(f"{topic}: a record naming no original")
                out.setdefault(origin, ms)
                due = retry_due(msg.headers() or ())
                if due is not None:
                    dues.setdefault(origin, due)
        if count < want:
            raise TimeoutError(f"read {count} of {want} records of {topic}")
    finally:
        consumer.close()
    return out, dues, count


def committed_all(broker: Broker, group: str, targets: dict[str, dict[int, int]]) -> bool:
    """Whether ``group`` has committed every partition of ``targets`` (topic -> end offsets)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    wanted = [TopicPartition(t, p) for t, ends in targets.items() for p, e in ends.items() if e > 0]
    if not wanted:
        return True
    request = ConsumerGroupTopicPartitions(group, wanted)
    try:
        result = admin.list_consumer_group_offsets([request])[group].result(timeout=10)
    except Exception:  # the group may not exist yet
        return False
    done = {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}
    return all(
        done.get((t, p), -1) >= e for t, ends in targets.items() for p, e in ends.items() if e > 0
    )


def end_offsets(broker: Broker, topic: str) -> dict[int, int]:
    return broker.end_offsets(topic)


# ----------------------------------------------------------------------------- the Spring side


def spring_libs() -> Path:
    """The spring-kafka jars, fetched once by scripts/fetch-dlq-writers (a no-op when present)."""
    cache = Path(os.environ.get("DLQ_SIDECAR_CACHE", Path.home() / ".cache" / "dlq-sidecar"))
    libs = cache / "dlq-writers" / "spring" / "libs"
    if not (libs.parent / ".complete").exists():
        subprocess.run([str(ROOT / "scripts" / "fetch-dlq-writers")], check=True)
    return libs


def compiled_classes(libs: Path) -> Path:
    """RetryTopicsBench compiled once per source digest, beside the jars."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = libs.parent / f"bench-classes-{digest}"
    if not (out / f"{MAIN_CLASS}.class").exists():
        if shutil.which("javac") is None:
            raise RuntimeError("javac (Java 17+) is needed for the Spring side")
        staging = out.with_name(out.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        cmd = ["javac", "-d", str(staging), "-cp", f"{libs}/*", str(SOURCE)]
        subprocess.run(cmd, check=True)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    return out


def java_version() -> str:
    done = subprocess.run(["java", "-version"], capture_output=True, text=True, check=False)
    return (done.stderr.splitlines() or ["?"])[0]


LOG4J = """status = warn
appender.console.type = Console
appender.console.name = STDERR
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = STDERR
"""


@dataclass
class SpringProcess:
    """The JVM and its one-line-per-command protocol on stdin / stdout."""

    proc: subprocess.Popen[str]
    log: IO[bytes]

    def ask(self, command: str) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the JVM exited ({self.proc.poll()}) on {command!r}")
        return json.loads(line)

    def stop(self) -> None:
        assert self.proc.stdin is not None
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start_spring(
    classes: Path, libs: Path, directory: str, bootstrap: str, topic: str, group: str, run: str
) -> SpringProcess:
    log4j = Path(directory) / "spring-log4j2.properties"
    log4j.write_text(LOG4J)
    log = open(Path(directory) / f"spring-{run}.log", "wb")  # noqa: SIM115 (closed by stop)
    props = {
        "log4j2.configurationFile": str(log4j),
        "bench.bootstrap": bootstrap,
        "bench.topic": topic,
        "bench.group": group,
        "bench.retrySuffix": f"-retry-{run}",
        "bench.dltSuffix": f"-dlt-{run}",
    }
    extra = os.environ.get("BENCH_SPRING_JAVA_OPTS", "").split()
    cmd = [
        "java",
        *(f"-D{k}={v}" for k, v in props.items()),
        *extra,
        "-cp",
        f"{classes}:{libs}/*",
        MAIN_CLASS,
    ]
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1
    )
    spring = SpringProcess(proc, log)
    assert proc.stdout is not None
    started = proc.stdout.readline()
    if not started:
        spring.stop()
        tail = (Path(directory) / f"spring-{run}.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"the JVM did not start:\n{tail}")
    return spring


def run_spring(
    broker: Broker,
    topic: str,
    ends: dict[int, int],
    directory: str,
    run: int,
    where: tuple[Path, Path],
) -> dict[str, Any]:
    classes, libs = where
    total = sum(ends.values())
    name = f"r{run}-{uuid.uuid4().hex[:6]}"
    group = f"bench-spring-{name}"
    retry_topic = broker.create_topic(f"{topic}-retry-{name}", config=LOG_APPEND)
    dlt = broker.create_topic(f"{topic}-dlt-{name}", config=LOG_APPEND)
    spring = start_spring(classes, libs, directory, broker.bootstrap, topic, group, name)
    pid = spring.proc.pid

    def alive() -> None:
        if spring.proc.poll() is not None:
            raise RuntimeError(f"the JVM exited ({spring.proc.returncode})")

    try:
        deadline = time.monotonic() + 120
        while spring.ask("stats")["records"] == 0:
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError("the JVM's first record")
            time.sleep(0.02)
        cpu0 = cpu_seconds(pid)
        deadline = time.monotonic() + 600
        while (st := spring.ask("stats"))["clean"] + st["retried_accepted"] < total:
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"every record accepted (the JVM: {st})")
            time.sleep(0.2)  # each question costs the JVM a little CPU: not too often
        retry_ends = end_offsets(broker, retry_topic)
        targets = {topic: ends}
        retry_targets = {retry_topic: retry_ends}
        deadline = time.monotonic() + 120
        while not (
            committed_all(broker, group, targets)
            and committed_all(broker, f"{group}-retry-{name}", retry_targets)
        ):
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError("every offset committed (the JVM)")
            time.sleep(0.05)
        cpu1 = cpu_seconds(pid)
        rss_peak_kb = proc_status_kb(pid, "VmHWM")
        assigned = spring.ask("topics")["assigned"]
        trace = spring.ask("dump")["records"]
    finally:
        spring.stop()
    if retry_topic not in assigned:
        raise RuntimeError(f"the JVM read {assigned}, not the retry topic {retry_topic}")
    written, dues, retry_records = retry_writes(broker, retry_topic)
    dlt_records = sum(end_offsets(broker, dlt).values())
    clean_s = (st["clean_last_ns"] - st["first_ns"]) / 1e9
    return {
        "clean_records_per_s": st["clean"] / clean_s if clean_s > 0 else float("nan"),
        "cpu_us_per_record": (cpu1 - cpu0) / total * 1e6,
        "peak_rss_mb": rss_peak_kb / 1024,
        "retry_records": retry_records,
        "dlt_records": dlt_records,
        **outcome(ends, trace, written, dues),
    }


# ---------------------------------------------------------------------------- the sidecar side


def run_tiers(
    broker: Broker, topic: str, ends: dict[int, int], app: App, directory: str, run: int, side: Side
) -> dict[str, Any]:
    total = sum(ends.values())
    group = f"bench-tiers-r{run}-{uuid.uuid4().hex[:6]}"
    api_path = os.path.join(directory, f"api-tiers-{run}.sock")
    # t-tiers names its tier topic dlq.<group>.2s: created here, LogAppendTime, before the sidecar.
    tier_topic = broker.create_topic(f"dlq.{group}.2s", config=LOG_APPEND)
    config = sidecar_config("t-tiers", broker.bootstrap, topic, group, app, api_path)
    app.reset(tier=1, trace=1)
    with running_sidecar(config, directory, f"vs-spring-{run}", side) as proc:
        wait_until(lambda: app.stats()["records"] > 0, 60, "the first record", proc)
        cpu0, app_cpu0 = cpu_seconds(proc.pid), app.cpu()
        # every first delivery answered, and every released record back and accepted
        wait_until(
            lambda: (s := app.stats())["clean"] + s["released"] >= total
            and s["records"] - s["released"] >= total,
            600,
            "every record accepted",
            proc,
        )  # fmt: skip
        targets = {topic: ends, tier_topic: end_offsets(broker, tier_topic)}
        wait_until(
            lambda: committed_all(broker, group, targets), 120, "every offset committed", proc
        )
        cpu1, app_cpu1 = cpu_seconds(proc.pid), app.cpu()
        rss_peak_kb = proc_status_kb(proc.pid, "VmHWM")
        stats = app.stats()
    written, dues, retry_records = retry_writes(broker, tier_topic)
    clean_s = (stats["clean_last_ns"] - stats["first_ns"]) / 1e9
    return {
        "clean_records_per_s": stats["clean"] / clean_s if clean_s > 0 else float("nan"),
        "cpu_us_per_record": (cpu1 - cpu0) / total * 1e6,
        "app_cpu_us_per_record": (app_cpu1 - app_cpu0) / total * 1e6,
        "peak_rss_mb": rss_peak_kb / 1024,
        "retry_records": retry_records,
        "dlt_records": 0,  # the sidecar's DLQ is not created: nothing reaches the limit
        **outcome(ends, stats["tier_trace"], written, dues),
    }


# ------------------------------------------------------------------------------------- the part


def part_spring(broker: Broker, app: App, directory: str, args: Any) -> dict[str, Any]:
    """``args.runs`` rounds (default 3), each running both contenders, the order flipped every round."""
    from bench.measure import git_commit

    libs = spring_libs()
    where = (compiled_classes(libs), libs)
    side = Side("new", ROOT)
    rounds = args.runs
    out: dict[str, Any] = {
        "commit": git_commit(ROOT),
        "spring_kafka": sorted(p.name for p in libs.glob("spring-kafka-*.jar")),
        "kafka_clients": sorted(p.name for p in libs.glob("kafka-clients-*.jar")),
        "java": java_version(),
        "records": args.records,
        "value_bytes": VALUE_BYTES,
        "partitions": PARTITIONS,
        "rounds": rounds,
        "load_average_start": os.getloadavg(),
        "runs": {who: [] for who in CONTENDERS},
    }
    topic = broker.create_topic(f"bench-vs-spring-{uuid.uuid4().hex[:8]}")
    print(f"producing {args.records:,} records (1 KiB, 10k keys) to {topic} ...", flush=True)
    broker.produce_bulk(topic, args.records, VALUE_BYTES)
    ends = broker.end_offsets(topic)
    for round_no in range(rounds):
        order = CONTENDERS if round_no % 2 == 0 else CONTENDERS[::-1]
        for who in order:
            if who == "spring":
                r = run_spring(broker, topic, ends, directory, round_no, where)
            else:
                r = run_tiers(broker, topic, ends, app, directory, round_no, side)
            out["runs"][who].append(r)
            print(
                f"  {who:<8} run {round_no + 1}: {r['clean_records_per_s']:>8,.0f} clean rec/s"
                f"  {r['cpu_us_per_record']:.0f} µs CPU/record  late p50 {r['late_p50_ms']:.0f}"
                f" p99 {r['late_p99_ms']:.0f} max {r['late_max_ms']:.0f} ms  lost {r['lost']}"
                f" doubled {r['doubled']}  {r['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    out["load_average_end"] = os.getloadavg()
    out["median"] = {who: medians(out["runs"][who]) for who in CONTENDERS}
    return out


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = [k for k, v in runs[0].items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return {k: statistics.median(r[k] for r in runs) for k in keys}


LABELS = [
    ("clean_records_per_s", "clean records/s (accepted at the first delivery)", "{:,.0f}"),
    ("cpu_us_per_record", "CPU per record, JVM / sidecar process (µs)", "{:,.0f}"),
    ("app_cpu_us_per_record", "... the sidecar's app, a separate process (µs)", "{:,.0f}"),
    ("late_p50_ms", "retried: late against due, p50 (ms)", "{:,.0f}"),
    ("late_p99_ms", "retried: late against due, p99 (ms)", "{:,.0f}"),
    ("late_max_ms", "retried: late against due, max (ms)", "{:,.0f}"),
    ("late_min_ms", "retried: late against due, min (ms)", "{:,.1f}"),
    ("own_late_p50_ms", "... against the due time on the record, p50 (ms)", "{:,.0f}"),
    ("own_late_p99_ms", "... against the due time on the record, p99 (ms)", "{:,.0f}"),
    ("own_late_max_ms", "... against the due time on the record, max (ms)", "{:,.0f}"),
    ("own_late_min_ms", "... against the due time on the record, min (ms)", "{:,.1f}"),
    ("retried", "records retried (retry records' originals)", "{:,.0f}"),
    ("lost", "records lost (never accepted)", "{:,.0f}"),
    ("doubled", "records delivered more than needed", "{:,.0f}"),
    ("dlt_records", "DLT records", "{:,.0f}"),
    ("peak_rss_mb", "peak RSS (MB, median of the runs)", "{:,.0f}"),
]


def print_spring(result: dict[str, Any]) -> None:
    print(
        f"\nThe sidecar's retry tiers ({result['commit']}) and Spring Kafka's retry topics"
        f" ({', '.join(result['spring_kafka'])}; {result['java']}), {result['records']:,} records of"
        f" {result['value_bytes']} B, {result['partitions']} partitions, 10 % retried once after"
        f" {DELAY_MS / 1000:g} s; {result['rounds']} rounds, medians; load average"
        f" {result['load_average_start'][0]:.1f} at the start, {result['load_average_end'][0]:.1f} at"
        " the end"
    )
    print(f"| {'figure':<50} | {'sidecar tiers':>13} | {'Spring':>9} |")
    print(f"|{'-' * 52}|{'-' * 15}|{'-' * 11}|")
    med = result["median"]
    for key, label, fmt in LABELS:
        cells = [fmt.format(med[who][key]) if key in med[who] else "—" for who in CONTENDERS]
        print(f"| {label:<50} | {cells[0]:>13} | {cells[1]:>9} |")
