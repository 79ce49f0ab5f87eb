"""End-to-end benchmark: the sidecar against a raw consumer and a hand-written bridge (issue 11).

Run: ``python -m bench [--records N] [--runs R] [--scenarios a,b,c,...]``. Not a test: it prints
a table and writes the same figures as JSON (``bench/results/latest.json`` by default).

One run, one broker, one set of records. N records (1 KiB values, 10,000 distinct keys) are
produced once to a 6-partition topic; every scenario then reads all of them with a fresh
consumer group and the figure is records/s from the first record seen to the last one done:

    a           ceiling: confluent-kafka consume() loop, commits, no app
    b           baseline: poll() + one blocking ``requests`` POST per record over a keep-alive
                session, async commit about once a second (what a user writes by hand)
    c-tcp-key   the sidecar, single mode, TCP, ordering key   (also c-tcp-none, c-unix-*)
    d-tcp-key   the sidecar, batch mode (100 records, 5 ms linger)
    e-tcp-key   the sidecar, 5 % rejects + 5 % releases (DLQ path active)
    e-txn       ... with the transactional DLQ mode            (when the engine supports it)
    f-*         tracing on vs off                              (when the sidecar has tracing)

The app (``bench.benchapp``) is one asyncio process listening on TCP and a Unix socket; it is
measured alone too. Every measured process is a child; CPU comes from /proc/<pid>/stat (all its
threads, librdkafka's included), peak RSS from VmHWM. Then: end-to-end latency at a fixed
offered rate (a ``bench-ts`` header carries the produce time, the app notes the receive time),
and RSS of the sidecar over time with a large backlog behind a slow app.

The broker is ``$KAFKA_BOOTSTRAP``, or one this command starts with ``scripts/kafka start`` in a
private state directory and stops at the end. Child roles (``--child ceiling|bridge``) are this
module run again; they print one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PARTITIONS = 6
DISTINCT_KEYS = 10_000
VALUE_BYTES = 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")
POLL_S = 0.02

ALL_SCENARIOS = [
    "a",
    "b",
    "c-tcp-key",
    "c-tcp-none",
    "c-unix-key",
    "c-unix-none",
    "d-tcp-key",
    "d-unix-none",
    "e-tcp-key",
    "e-txn",
    "f-off",
    "f-on",
    "f-on-10pct",
]
DESCRIPTIONS = {
    "a": "raw consumer (ceiling)",
    "b": "hand-written bridge",
    "c-tcp-key": "sidecar single, TCP, key",
    "c-tcp-none": "sidecar single, TCP, none",
    "c-unix-key": "sidecar single, unix, key",
    "c-unix-none": "sidecar single, unix, none",
    "d-tcp-key": "sidecar batch, TCP, key",
    "d-unix-none": "sidecar batch, unix, none",
    "e-tcp-key": "sidecar 5% rej + 5% rel, DLQ",
    "e-txn": "... transactional DLQ",
    "f-off": "tracing off (exporter none)",
    "f-on": "tracing on, all sampled",
    "f-on-10pct": "tracing on, 10 % parent-based",
}
# Tracing scenarios: OTLP over HTTP to the bench app, which accepts and drops the spans (its
# /v1/traces route); the sampler and the endpoint come from the standard OTEL_* variables the
# sidecar honours (the endpoint is added per run: the app's port).
SIDECAR_ENV = {
    "f-on": {"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
    "f-on-10pct": {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    },
}
LATENCY_SCENARIOS = ["a", "b", "c-tcp-key", "c-unix-none", "d-tcp-key"]


# ------------------------------------------------------------------------------------- helpers


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kb(pid: int, name: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 5.0) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


def http_json(conn: http.client.HTTPConnection, method: str, path: str) -> Any:
    conn.request(method, path)
    response = conn.getresponse()
    body = response.read()
    if response.status >= 300 and response.status != 503:
        raise RuntimeError(f"{method} {path}: {response.status} {body[:200]!r}")
    return json.loads(body) if body else None


def ensure_requests() -> bool:
    """The bridge uses ``requests``; install it into this interpreter's venv if it is missing."""
    if importlib.util.find_spec("requests") is not None:
        return True
    print("installing requests into the venv for the hand-written bridge ...", flush=True)
    done = subprocess.run(
        [PY, "-m", "pip", "install", "--quiet", "requests"], check=False, capture_output=True
    )
    if done.returncode != 0:
        print("  pip failed; the bridge falls back to http.client", flush=True)
        return False
    importlib.invalidate_caches()
    return importlib.util.find_spec("requests") is not None


# ------------------------------------------------------------------------------------- broker


@dataclass
class Broker:
    bootstrap: str
    own_state_dir: str | None = None
    topics: list[str] = field(default_factory=list)

    @classmethod
    def open(cls) -> Broker:
        external = os.environ.get("KAFKA_BOOTSTRAP")
        if external:
            return cls(external)
        # A private state dir: `scripts/kafka start` would otherwise hand back (and our stop
        # would later kill) a broker someone else started.
        state_dir = tempfile.mkdtemp(prefix="bench-kafka-state-")
        env = dict(os.environ, DLQ_KAFKA_STATE_DIR=state_dir)
        print("starting a broker with scripts/kafka start ...", flush=True)
        done = subprocess.run(
            [PY, str(ROOT / "scripts" / "kafka"), "start"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        return cls(done.stdout.strip().splitlines()[-1], state_dir)

    def close(self) -> None:
        from confluent_kafka.admin import AdminClient

        if self.topics:
            admin = AdminClient({"bootstrap.servers": self.bootstrap})
            for future in admin.delete_topics(self.topics, operation_timeout=30).values():
                with contextlib.suppress(Exception):
                    future.result(timeout=30)
        if self.own_state_dir:
            env = dict(os.environ, DLQ_KAFKA_STATE_DIR=self.own_state_dir)
            subprocess.run([PY, str(ROOT / "scripts" / "kafka"), "stop"], env=env, check=False)
            shutil.rmtree(self.own_state_dir, ignore_errors=True)

    def create_topic(self, name: str, partitions: int = PARTITIONS) -> str:
        from confluent_kafka.admin import AdminClient
        from confluent_kafka.cimpl import NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(name, partitions, 1)])[name].result(timeout=30)
        self.topics.append(name)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            md = admin.list_topics(name, timeout=5).topics.get(name)
            if (
                md
                and md.error is None
                and len(md.partitions) == partitions
                and all(p.leader >= 0 for p in md.partitions.values())
            ):
                return name
            time.sleep(0.05)
        raise TimeoutError(f"topic {name} has no leaders")

    def end_offsets(self, topic: str) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-watermarks"})
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)
            }
        finally:
            consumer.close()

    def produce_bulk(self, topic: str, count: int, value_bytes: int) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 20,
                "batch.size": 1_000_000,
                "queue.buffering.max.messages": 1_000_000,
            }
        )
        block = os.urandom(value_bytes)
        for i in range(count):
            value = b"%08d" % i + block[8:]
            while True:
                try:
                    producer.produce(topic, value, b"key-%05d" % (i % DISTINCT_KEYS))
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 1000 == 0:
                producer.poll(0)
        if producer.flush(60) != 0:
            raise RuntimeError("produce did not complete")

    def produce_at_rate(self, topic: str, rate: float, seconds: float) -> list[int]:
        """Produce at a fixed offered rate; each record carries its produce time (monotonic ns).

        Returns each record's produce-to-ack time in ns: the broker's own share of the latency,
        which no consumer can beat.
        """
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0})
        count = int(rate * seconds)
        value = os.urandom(VALUE_BYTES)
        acks: list[int] = []
        start = time.monotonic()
        for i in range(count):
            due = start + i / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            sent = time.monotonic_ns()
            producer.produce(
                topic,
                value,
                b"key-%05d" % (i % DISTINCT_KEYS),
                headers=[("bench-ts", b"%d" % sent)],
                on_delivery=_ack_timer(acks, sent),
            )
            producer.poll(0)
        producer.flush(30)
        return acks


def _ack_timer(acks: list[int], sent_ns: int) -> Any:
    def on_delivery(_err: Any, _msg: Any) -> None:
        acks.append(time.monotonic_ns() - sent_ns)

    return on_delivery


# ------------------------------------------------------------------------------------- app


class App:
    """The bench app child: one process, TCP + Unix socket."""

    def __init__(self, directory: str) -> None:
        self.unix_path = os.path.join(directory, "app.sock")
        self.proc = subprocess.Popen(
            [PY, "-m", "bench.benchapp", "--unix", self.unix_path],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.port = int(json.loads(self.proc.stdout.readline())["port"])
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)

    def reset(self, **mode: int) -> None:
        query = "&".join(f"{k}={v}" for k, v in mode.items())
        http_json(self.conn, "POST", f"/reset?{query}")

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = http_json(self.conn, "GET", "/stats")
        return result

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def close(self) -> None:
        self.conn.close()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def measure_app_alone(app: App, seconds: float) -> dict[str, Any]:
    """The app under the sidecar's own HTTP client (trio, 64 in flight), and the app's CPU."""
    import trio

    from bench.http_bench import load
    from sidecar.appclient import AppTarget

    out: dict[str, Any] = {}
    for transport in ("tcp", "unix"):
        if transport == "tcp":
            target = AppTarget(host="127.0.0.1", port=app.port, path="/records")
        else:
            target = AppTarget(unix_path=app.unix_path, path="/records")
        app.reset()
        cpu0 = app.cpu()
        result = trio.run(load, target, 64, seconds)
        app_cpu = app.cpu() - cpu0
        requests = app.stats()["requests"]
        out[transport] = {
            "requests_per_s": round(result.requests_per_s),
            "client_cpu_us_per_request": round(result.cpu_us_per_request, 1),
            "app_cpu_us_per_request": round(app_cpu / max(1, requests) * 1e6, 1),
        }
    return out


# ------------------------------------------------------------------------------------- sidecar


def sidecar_config(
    scenario: str,
    bootstrap: str,
    topic: str,
    group: str,
    app: App,
    api_path: str,
) -> str:
    kind, _, rest = scenario.partition("-")
    transport, _, ordering = rest.partition("-")
    if kind in ("e", "f") and not ordering:
        transport, ordering = "tcp", "key"
    if scenario in ("e-txn", "f-off", "f-on", "f-on-10pct"):
        transport, ordering = "tcp", "key"
    unix = transport == "unix"
    mode = "batch" if kind == "d" else "single"
    lines = [
        "kafka:",
        f"  bootstrap.servers: {json.dumps(bootstrap)}",
        f"  group.id: {json.dumps(group)}",
        "  auto.offset.reset: earliest",
        "source:",
        f"  topics: [{json.dumps(topic)}]",
        f"ordering: {ordering}",
        "app:",
        f"  url: http://127.0.0.1:{app.port}/records",
        f"  unix_socket: {json.dumps(app.unix_path) if unix else 'null'}",
        f"  mode: {mode}",
        "api:",
        f"  listen: {json.dumps('unix:' + api_path)}",
        "logging:",
        "  level: warning",
    ]
    if kind == "e":
        # A released record is retried after 50 ms rather than the default 1 s, so the run's
        # length is the work done, not one retry timer at the tail of a 5 s run.
        lines.append("errors.retry.delay.initial.ms: 50")
    if scenario == "e-txn":
        lines.append("errors.deadletterqueue.transactional.enable: true")
    if scenario.startswith("f-on"):
        lines += ["tracing:", "  exporter: otlp-http"]
    return "\n".join(lines) + "\n"


def unavailable(scenario: str) -> str | None:
    """Why a scenario cannot run against this sidecar, or None."""
    if scenario == "e-txn":
        engine_src = (ROOT / "sidecar" / "engine.py").read_text()
        dlq_src = (ROOT / "sidecar" / "dlq.py").read_text()
        if "transactional_enable" not in engine_src + dlq_src:
            return (
                "errors.deadletterqueue.transactional.enable is parsed but not used by the engine"
            )
    if scenario.startswith("f-") and "tracing" not in (ROOT / "sidecar" / "engine.py").read_text():
        return "the engine creates no spans: tracing.exporter is parsed but unused"
    return None


@contextlib.contextmanager
def running_sidecar(
    config_text: str, directory: str, name: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    config_path = os.path.join(directory, f"{name}.yaml")
    Path(config_path).write_text(config_text)
    log_path = os.path.join(directory, f"{name}.log")
    with open(log_path, "wb") as log:
        # Logs go to stderr; stdout carries only console-exported spans.
        proc = subprocess.Popen(
            [PY, "-m", "sidecar", "run", "-c", config_path],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
            env=dict(os.environ, **(env or {})),
        )
    spy = None
    if os.environ.get("BENCH_PYSPY"):
        # Profile the sidecar while it runs: BENCH_PYSPY=DIR writes DIR/<name>.txt (collapsed stacks,
        # with thread names and idle frames) for flame graphs or grep.
        out = os.path.join(os.environ["BENCH_PYSPY"], f"{name}.txt")
        spy = subprocess.Popen(
            [str(Path(PY).parent / "py-spy"), "record", "--pid", str(proc.pid), "--rate", "250",
             "--format", "raw", "--threads", "--idle", "--output", out, "--nonblocking"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if spy is not None:
            spy.wait(timeout=30)


def wait_until(predicate: Any, timeout_s: float, what: str, proc: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            raise RuntimeError(f"the sidecar exited ({proc.returncode}) while waiting for {what}")
        time.sleep(POLL_S)
    raise TimeoutError(f"timed out waiting for {what}")


def api_get(api_path: str, path: str) -> Any:
    conn = UnixHTTPConnection(api_path)
    try:
        return http_json(conn, "GET", path)
    except OSError:
        return None
    finally:
        conn.close()


def status_done(api_path: str, topic: str, ends: dict[int, int]) -> bool:
    status = api_get(api_path, "/v1/status")
    if not status:
        return False
    seen = {
        p["partition"]: p["committable_offset"] for p in status["partitions"] if p["topic"] == topic
    }
    return all(seen.get(p, -1) >= end for p, end in ends.items() if end > 0)


def run_sidecar_throughput(
    scenario: str,
    broker: Broker,
    topic: str,
    ends: dict[int, int],
    app: App,
    directory: str,
    run: int,
) -> dict[str, Any]:
    total = sum(ends.values())
    group = f"bench-{scenario}-{run}-{uuid.uuid4().hex[:8]}"
    api_path = os.path.join(directory, f"api-{scenario}-{run}.sock")
    config = sidecar_config(scenario, broker.bootstrap, topic, group, app, api_path)
    app.reset(fail=1 if scenario.startswith("e") else 0)
    env = dict(SIDECAR_ENV.get(scenario, {}))
    if scenario.startswith("f-on"):
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"http://127.0.0.1:{app.port}/v1/traces"
    with running_sidecar(config, directory, f"{scenario}-{run}", env) as proc:
        wait_until(lambda: app.stats()["records"] > 0, 60, "the first record", proc)
        cpu0, app_cpu0 = cpu_seconds(proc.pid), app.cpu()
        wait_until(lambda: app.stats()["records"] >= total, 300, "every record", proc)
        wait_until(lambda: status_done(api_path, topic, ends), 120, "every offset done", proc)
        end_ns = time.monotonic_ns()
        cpu1, app_cpu1 = cpu_seconds(proc.pid), app.cpu()
        rss_peak_kb = proc_status_kb(proc.pid, "VmHWM")
        stats = app.stats()
        status = api_get(api_path, "/v1/status")
    elapsed = (end_ns - stats["first_ns"]) / 1e9
    return {
        "records_per_s": total / elapsed,
        "cpu_s_per_10k": (cpu1 - cpu0) / total * 10_000,
        "peak_rss_mb": rss_peak_kb / 1024,
        "app_cpu_share": (app_cpu1 - app_cpu0) / elapsed,
        "app_requests": stats["requests"],
        "span_exports": stats.get("span_exports", 0),
        "rejected": stats["rejected"],
        "released": stats["released"],
        "counters": status["counters"] if status else None,
    }


# ------------------------------------------------------------------------------------- a and b


def run_child(
    role: str, broker: Broker, topic: str, total: int, app: App | None, **extra: Any
) -> dict[str, Any]:
    group = f"bench-{role}-{uuid.uuid4().hex[:8]}"
    args = [
        PY, "-m", "bench.sidecar_bench", "--child", role,
        "--bootstrap", broker.bootstrap, "--topic", topic, "--group", group,
        "--expect", str(total),
    ]  # fmt: skip
    if app is not None:
        args += ["--url", f"http://127.0.0.1:{app.port}/records"]
    if extra.get("latency"):
        args.append("--latency")
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        message = json.loads(line)
        if message.get("ready") and extra.get("on_ready"):
            extra["on_ready"]()
        lines.append(message)
    proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"child {role} failed with {proc.returncode}")
    result: dict[str, Any] = lines[-1]
    return result


def child_main(args: argparse.Namespace) -> None:
    """``--child ceiling|bridge``: read ``--expect`` records once, print one JSON line."""
    import resource

    from confluent_kafka import Consumer

    def ready(_consumer: Any, partitions: list[Any]) -> None:
        if partitions:
            print(json.dumps({"ready": True}), flush=True)

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([args.topic], on_assign=ready)
    latencies: list[int] = []
    count = 0
    first_ns = 0
    cpu0 = 0.0
    next_commit = 0.0

    def note(msg: Any) -> None:
        if args.latency:
            for name, value in msg.headers() or ():
                if name == "bench-ts":
                    latencies.append(time.monotonic_ns() - int(value))

    if args.child == "ceiling":
        # The fastest loop: batched consume(), nothing else.  In latency mode poll() instead,
        # because consume(n, timeout) waits out its timeout unless n records arrive.
        while count < args.expect:
            messages = consumer.consume(500, 0.1) if not args.latency else [consumer.poll(0.1)]
            got = [m for m in messages if m is not None and m.error() is None]
            if got and not first_ns:
                first_ns, cpu0 = time.monotonic_ns(), time.process_time()
                next_commit = time.monotonic() + 1
            for msg in got:
                note(msg)
            count += len(got)
            if got and time.monotonic() >= next_commit:
                consumer.commit(asynchronous=True)
                next_commit = time.monotonic() + 1
    else:
        post = bridge_poster(args.url)
        while count < args.expect:
            polled = consumer.poll(1.0)
            if polled is None or polled.error() is not None:
                continue
            msg = polled
            if not first_ns:
                first_ns, cpu0 = time.monotonic_ns(), time.process_time()
                next_commit = time.monotonic() + 1
            headers = {
                "Content-Type": "application/octet-stream",
                "Kafka-Topic": msg.topic(),
                "Kafka-Partition": str(msg.partition()),
                "Kafka-Offset": str(msg.offset()),
            }
            key = msg.key()
            if key is not None:
                headers["Kafka-Key"] = key.decode("latin-1")
            for name, value in list(msg.headers() or ()):
                if name == "bench-ts" and isinstance(value, bytes):
                    headers["Kafka-Header"] = f"bench-ts={value.decode()}"
            status = post(msg.value(), headers)
            if status >= 300:
                raise SystemExit(f"the app answered {status}")
            count += 1
            if time.monotonic() >= next_commit:
                consumer.commit(asynchronous=True)
                next_commit = time.monotonic() + 1
    consumer.commit(asynchronous=False)
    end_ns = time.monotonic_ns()
    cpu = time.process_time() - cpu0
    consumer.close()
    elapsed = (end_ns - first_ns) / 1e9
    print(
        json.dumps(
            {
                "records_per_s": count / elapsed,
                "cpu_s_per_10k": cpu / count * 10_000,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "latencies_ns": latencies,
            }
        ),
        flush=True,
    )


def bridge_poster(url: str) -> Any:
    """One blocking POST per record over a keep-alive session: requests, else http.client."""
    if importlib.util.find_spec("requests") is not None:
        import requests

        session = requests.Session()

        def post_requests(body: bytes, headers: dict[str, str]) -> int:
            status: int = session.post(url, data=body, headers=headers, timeout=10).status_code
            return status

        return post_requests
    host_port = url.split("/")[2]
    host, _, port = host_port.partition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)

    def post_stdlib(body: bytes, headers: dict[str, str]) -> int:
        conn.request("POST", "/records", body, headers)
        response = conn.getresponse()
        response.read()
        return response.status

    return post_stdlib


# ------------------------------------------------------------------------------------- latency


def run_latency(
    scenario: str, broker: Broker, app: App, directory: str, rate: float, seconds: float
) -> dict[str, Any]:
    topic = broker.create_topic(f"bench-lat-{scenario}-{uuid.uuid4().hex[:6]}")
    count = int(rate * seconds)
    extra: dict[str, float] = {}
    app.reset(latency=1)
    if scenario in ("a", "b"):
        acks: list[int] = []

        def produce() -> None:
            time.sleep(1.0)  # let the first fetch settle
            acks.extend(broker.produce_at_rate(topic, rate, seconds))

        result = run_child(
            "ceiling" if scenario == "a" else "bridge",
            broker,
            topic,
            count,
            app if scenario == "b" else None,
            latency=True,
            on_ready=produce,
        )
        latencies = result["latencies_ns"] if scenario == "a" else app.stats()["latencies_ns"]
    else:
        api_path = os.path.join(directory, f"api-lat-{scenario}.sock")
        group = f"bench-lat-{scenario}-{uuid.uuid4().hex[:8]}"
        config = sidecar_config(scenario, broker.bootstrap, topic, group, app, api_path)
        with running_sidecar(config, directory, f"lat-{scenario}") as proc:
            wait_until(
                lambda: (api_get(api_path, "/readyz") or {}).get("checks", {}).get("assigned"),
                60,
                "assignment",
                proc,
            )
            time.sleep(1.0)
            cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
            acks = broker.produce_at_rate(topic, rate, seconds)
            sidecar_cpu_share = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - t0)
            wait_until(lambda: len(app.stats()["latencies_ns"]) >= count, 60, "every record", proc)
        latencies = app.stats()["latencies_ns"]
        extra["sidecar_cpu_share"] = sidecar_cpu_share
    # The first 10 % are warm-up (connections opening, first fetch).
    kept = [v / 1e6 for v in latencies[len(latencies) // 10 :]]
    acked = [v / 1e6 for v in acks[len(acks) // 10 :]]
    return {
        "records": len(latencies),
        "produce_ack_p50_ms": percentile(acked, 50),
        "produce_ack_p99_ms": percentile(acked, 99),
        "p50_ms": percentile(kept, 50),
        "p99_ms": percentile(kept, 99),
        "max_ms": max(kept) if kept else float("nan"),
        **extra,
    }


# ------------------------------------------------------------------------------------- backlog


def run_backlog(
    broker: Broker, app: App, directory: str, records: int, delay_ms: int, seconds: float
) -> dict[str, Any]:
    topic = broker.create_topic(f"bench-backlog-{uuid.uuid4().hex[:6]}")
    print(f"  producing {records:,} records of 100 B ...", flush=True)
    broker.produce_bulk(topic, records, 100)
    app.reset(delay_ms=delay_ms)
    api_path = os.path.join(directory, "api-backlog.sock")
    group = f"bench-backlog-{uuid.uuid4().hex[:8]}"
    config = sidecar_config("c-tcp-key", broker.bootstrap, topic, group, app, api_path)
    samples: list[tuple[float, float, int]] = []
    with running_sidecar(config, directory, "backlog") as proc:
        wait_until(lambda: app.stats()["records"] > 0, 60, "the first record", proc)
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            status = api_get(api_path, "/v1/status") or {"partitions": []}
            buffered = sum(p["buffered"] + p["in_flight"] for p in status["partitions"])
            samples.append(
                (time.monotonic() - start, proc_status_kb(proc.pid, "VmRSS") / 1024, buffered)
            )
            time.sleep(0.5)
        peak = proc_status_kb(proc.pid, "VmHWM") / 1024
        delivered = app.stats()["records"]
    app.reset()
    half = [rss for t, rss, _ in samples if t >= seconds / 2]
    return {
        "backlog_records": records,
        "app_delay_ms": delay_ms,
        "seconds": seconds,
        "delivered": delivered,
        "held_in_sidecar_max": max(b for _, _, b in samples),
        "rss_first_mb": samples[0][1],
        "rss_second_half_max_mb": max(half),
        "rss_last_mb": samples[-1][1],
        "peak_rss_mb": peak,
        "samples": [(round(t, 1), round(r, 1), b) for t, r, b in samples],
    }


# ------------------------------------------------------------------------------------- report


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["records_per_s"] for r in runs]
    out: dict[str, Any] = {
        "records_per_s": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "cpu_s_per_10k": statistics.median(r["cpu_s_per_10k"] for r in runs),
        "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "runs": runs,
    }
    if "app_cpu_share" in runs[0]:
        out["app_cpu_share"] = statistics.median(r["app_cpu_share"] for r in runs)
    return out


def print_table(results: dict[str, Any]) -> None:
    scenarios = results["scenarios"]
    ceiling = scenarios.get("a", {}).get("records_per_s")
    baseline = scenarios.get("b", {}).get("records_per_s")
    latency = results.get("latency", {})
    print()
    print(
        f"{'scenario':<12}{'':<31}{'rec/s':>9}{'min-max':>17}{'/a':>8}{'/b':>7}"
        f"{'CPU s/10k':>10}{'RSS MB':>8}{'app CPU':>8}{'p50 ms':>8}{'p99 ms':>8}"
    )
    for name in ALL_SCENARIOS:
        if name not in scenarios:
            continue
        s = scenarios[name]
        label = DESCRIPTIONS[name]
        if "unavailable" in s:
            print(f"{name:<12}{label:<31}  not available: {s['unavailable']}")
            continue
        rate = s["records_per_s"]
        to_a = f"{rate / ceiling:.2g}" if ceiling else "-"
        to_b = f"{rate / baseline:.1f}" if baseline else "-"
        lat = latency.get(name)
        p50 = f"{lat['p50_ms']:.2f}" if lat else ""
        p99 = f"{lat['p99_ms']:.2f}" if lat else ""
        app_cpu = f"{s['app_cpu_share'] * 100:.0f}%" if "app_cpu_share" in s else ""
        spread = f"{s['min']:,.0f}-{s['max']:,.0f}"
        print(
            f"{name:<12}{label:<31}{rate:>9,.0f}{spread:>17}"
            f"{to_a:>8}{to_b:>7}{s['cpu_s_per_10k']:>10.2f}{s['peak_rss_mb']:>8.0f}"
            f"{app_cpu:>8}{p50:>8}{p99:>8}"
        )


def check_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, as ratios of this run's own figures."""
    rate = {
        name: s["records_per_s"] for name, s in results["scenarios"].items() if "records_per_s" in s
    }
    latency = results.get("latency", {})
    checks: list[tuple[str, str, str, float, str]] = [
        ("single mode / bridge", "c-tcp-key", "b", 10.0, ">="),
        ("batch mode / raw consumer", "d-tcp-key", "a", 0.5, ">="),
        ("DLQ path (10 % failing) / clean", "e-tcp-key", "c-tcp-key", 0.8, ">="),
        ("transactional DLQ / clean", "e-txn", "c-tcp-key", 0.8, ">="),
        ("tracing, all sampled / off", "f-on", "f-off", 0.5, ">="),
        ("tracing, 10 % sampled / off", "f-on-10pct", "f-off", 0.85, ">="),
    ]
    out = []
    for what, num, den, target, op in checks:
        if num in rate and den in rate:
            value = rate[num] / rate[den]
            out.append(
                {"target": what, "value": value, "wanted": f"{op} {target}", "met": value >= target}
            )
    if "c-tcp-key" in latency and "a" in latency:
        added = latency["c-tcp-key"]["p99_ms"] - latency["a"]["p99_ms"]
        out.append(
            {
                "target": "added p99 latency ms (c-tcp-key - a)",
                "value": added,
                "wanted": "< 2",
                "met": added < 2,
            }
        )
    if "backlog" in results:
        peak = results["backlog"]["peak_rss_mb"]
        out.append(
            {
                "target": "peak RSS MB with the backlog",
                "value": peak,
                "wanted": "< 150",
                "met": peak < 150,
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=15_000, help="records per throughput run")
    parser.add_argument("--runs", type=int, default=3, help="runs per scenario (median shown)")
    parser.add_argument(
        "--scenarios",
        default="all",
        help="comma-separated names or prefixes: " + ",".join(ALL_SCENARIOS),
    )
    parser.add_argument("--latency-rate", type=float, default=1000.0, help="records/s offered")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--backlog", type=int, default=2_000_000, help="0 skips the backlog test")
    parser.add_argument("--backlog-seconds", type=float, default=20.0)
    parser.add_argument("--app-seconds", type=float, default=2.0, help="app-alone run length")
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "latest.json"))
    parser.add_argument("--show", metavar="JSON", help="print the tables of a saved run and exit")
    # Child roles.
    parser.add_argument("--child", choices=["ceiling", "bridge"], help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--latency", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args)
        return
    if args.show:
        print_report(json.loads(Path(args.show).read_text()))
        return

    wanted = [w.strip() for w in args.scenarios.split(",") if w.strip()]
    selected = [
        s
        for s in ALL_SCENARIOS
        if "all" in wanted or any(s == w or s.startswith(w) for w in wanted)
    ]
    if not selected:
        parser.error(f"no scenario matches {args.scenarios!r}")
    has_requests = ensure_requests() if "b" in selected else False
    started = time.monotonic()
    broker = Broker.open()
    results: dict[str, Any] = {
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "broker": broker.bootstrap,
        "records": args.records,
        "runs": args.runs,
        "bridge_http": "requests" if has_requests else "http.client",
        "scenarios": {},
    }
    try:
        with tempfile.TemporaryDirectory(prefix="bench-") as directory:
            app = App(directory)
            try:
                print("app alone (sidecar AppClient, 64 in flight) ...", flush=True)
                results["app_alone"] = measure_app_alone(app, args.app_seconds)
                print(f"  {results['app_alone']}", flush=True)
                topic = broker.create_topic(f"bench-{uuid.uuid4().hex[:8]}")
                print(
                    f"producing {args.records:,} records (1 KiB, 10k keys) to {topic} ...",
                    flush=True,
                )
                broker.produce_bulk(topic, args.records, VALUE_BYTES)
                ends = broker.end_offsets(topic)
                total = sum(ends.values())
                results["partition_records"] = ends
                # Runs go round-robin over the scenarios, so a change in the machine's load
                # (other processes on a shared box) spreads over every scenario alike.
                runnable = []
                for scenario in selected:
                    reason = unavailable(scenario)
                    if reason:
                        results["scenarios"][scenario] = {"unavailable": reason}
                    else:
                        runnable.append(scenario)
                all_runs: dict[str, list[dict[str, Any]]] = {s: [] for s in runnable}
                for run in range(args.runs):
                    for scenario in runnable:
                        if scenario == "a":
                            r = run_child("ceiling", broker, topic, total, None)
                        elif scenario == "b":
                            app.reset()
                            r = run_child("bridge", broker, topic, total, app)
                        else:
                            r = run_sidecar_throughput(
                                scenario, broker, topic, ends, app, directory, run
                            )
                        r.pop("latencies_ns", None)
                        all_runs[scenario].append(r)
                        print(
                            f"  {scenario:<12} run {run + 1}: {r['records_per_s']:>8,.0f} rec/s"
                            f"  {r['cpu_s_per_10k']:.2f} CPU s/10k  {r['peak_rss_mb']:.0f} MB",
                            flush=True,
                        )
                for scenario, runs in all_runs.items():
                    if runs:  # --runs 0: latency and backlog only
                        results["scenarios"][scenario] = summarise(runs)
                if not args.no_latency:
                    results["latency"] = {}
                    for scenario in LATENCY_SCENARIOS:
                        if scenario not in selected:
                            continue
                        lat = run_latency(
                            scenario,
                            broker,
                            app,
                            directory,
                            args.latency_rate,
                            args.latency_seconds,
                        )
                        results["latency"][scenario] = lat
                        print(
                            f"  latency {scenario:<12} p50 {lat['p50_ms']:.2f} ms"
                            f"  p99 {lat['p99_ms']:.2f} ms  max {lat['max_ms']:.2f} ms"
                            f"  (produce->ack p50 {lat['produce_ack_p50_ms']:.2f}"
                            f" p99 {lat['produce_ack_p99_ms']:.2f} ms)"
                            + (
                                f"  sidecar CPU {lat['sidecar_cpu_share'] * 100:.0f} %"
                                if "sidecar_cpu_share" in lat
                                else ""
                            ),
                            flush=True,
                        )
                if args.backlog:
                    print(f"backlog: {args.backlog:,} records behind a slow app ...", flush=True)
                    results["backlog"] = run_backlog(
                        broker, app, directory, args.backlog, 50, args.backlog_seconds
                    )
                    b = results["backlog"]
                    print(
                        f"  RSS first {b['rss_first_mb']:.0f} MB, max in 2nd half "
                        f"{b['rss_second_half_max_mb']:.0f} MB, peak {b['peak_rss_mb']:.0f} MB, "
                        f"held {b['held_in_sidecar_max']:,} records",
                        flush=True,
                    )
            finally:
                app.close()
    finally:
        broker.close()
    results["wall_s"] = round(time.monotonic() - started, 1)
    results["targets"] = check_targets(results)
    print_report(results)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {args.json}")


def print_report(results: dict[str, Any]) -> None:
    print_table(results)
    print("\ntargets (this run's own ratios)")
    for t in results["targets"]:
        verdict = "met" if t["met"] else "MISSED"
        print(f"  {t['target']:<40}{t['value']:>9.2f}  wanted {t['wanted']:<7} {verdict}")
    for name, lat in results.get("latency", {}).items():
        print(
            f"  latency {name}: produce->ack p50 {lat['produce_ack_p50_ms']:.2f} ms"
            f" p99 {lat['produce_ack_p99_ms']:.2f} ms (the broker's share)"
        )
    app = results.get("app_alone", {})
    for transport, figures in app.items():
        print(
            f"  app alone over {transport}: {figures['requests_per_s']:,} req/s,"
            f" app CPU {figures['app_cpu_us_per_request']} µs/req"
        )
    if "backlog" in results:
        b = results["backlog"]
        print(
            f"  backlog {b['backlog_records']:,} records, app {b['app_delay_ms']} ms per answer:"
            f" RSS first {b['rss_first_mb']:.0f} MB, max in the 2nd half"
            f" {b['rss_second_half_max_mb']:.0f} MB, peak {b['peak_rss_mb']:.0f} MB,"
            f" at most {b['held_in_sidecar_max']:,} records held"
        )
    print(f"\nwall time {results['wall_s']} s; command: {results['command']}")


if __name__ == "__main__":
    main()
