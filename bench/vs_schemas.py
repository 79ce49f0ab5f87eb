"""What decoding records with schemas costs, ``python -m bench --scenarios schemas-avro``: the same Avro
records (~1 KiB in the wire format, by confluent-kafka's ``AvroSerializer``, 10,000 keys, 6 partitions)
delivered decoded (``schemas.decode``: JSON to the app) and undecoded, by the sidecar in scenario
``c-tcp-key``, runs alternated (A B A B), with a real Schema Registry (``scripts/install-registry``) started
on loopback for the part.

Figures per run: records/s at saturation and the sidecar process's CPU per record (utime + stime), then at
a fixed offered rate (``--latency-rate``, 1,000 records/s, for ``--rate-seconds``) its CPU per record and
share of a core. The medians are printed with the difference decoded minus undecoded.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import threading
import time
import urllib.request
import uuid
from typing import Any

from bench.app import App
from bench.broker import DISTINCT_KEYS, PARTITIONS, Broker
from bench.measure import ROOT, cpu_seconds
from bench.sidecars import Side, running_sidecar, sidecar_config, wait_until

SCHEMAS_SCENARIOS = ["schemas-avro"]
SIDES = ("decoded", "bytes")
CCOMPAT = "/apis/ccompat/v7"
ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "email", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "currency", "type": "string"},
        {"name": "status", "type": "string"},
        {"name": "created_ms", "type": "long"},
        {"name": "note", "type": "string"},
    ],
}


def selected(wanted: list[str]) -> list[str]:
    return [s for s in SCHEMAS_SCENARIOS if any(s == w or s.startswith(w) for w in wanted)]


def order(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "customer": f"customer-{i % DISTINCT_KEYS:05d}",
        "email": f"c{i % DISTINCT_KEYS}@example.com",
        "amount": (i % 10_000) / 100,
        "currency": "EUR",
        "status": ("new", "paid", "shipped")[i % 3],
        "created_ms": 1_700_000_000_000 + i,
        "note": "n" * 900,
    }


class Registry:
    """Apicurio Registry on loopback ports, started for the part and stopped after it."""

    def __init__(self, directory: str) -> None:
        from sidecar.ops.broker import free_port

        home = (
            subprocess.run(
                [str(ROOT / "scripts" / "install-registry")],
                check=True,
                capture_output=True,
                text=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        self.port = free_port()
        env = dict(
            os.environ,
            QUARKUS_HTTP_HOST="127.0.0.1",
            QUARKUS_HTTP_PORT=str(self.port),
            QUARKUS_MANAGEMENT_HOST="127.0.0.1",
            QUARKUS_MANAGEMENT_PORT=str(free_port()),
        )
        log = open(os.path.join(directory, "registry.log"), "wb")  # noqa: SIM115 (closed in stop)
        self._log = log
        self.proc = subprocess.Popen(
            [os.path.join(home, "start")], env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the schema registry did not start (registry.log)")
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{CCOMPAT}"

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        self._log.close()


def avro_values(url: str, topic: str, count: int) -> list[bytes]:
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": url, "timeout": 10})
    try:
        serializer = AvroSerializer(
            client, json.dumps(ORDER), conf={"subject.name.strategy.type": "TOPIC"}
        )
        ctx = SerializationContext(topic, MessageField.VALUE)
        return [serializer(order(i), ctx) for i in range(count)]
    finally:
        client.close()


def produce(broker: Broker, topic: str, values: list[bytes], rate: float | None = None) -> None:
    """`values` to `topic` (key ``key-<i mod 10,000>``), paced at `rate` records/s when given."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 0 if rate else 20,
         "queue.buffering.max.messages": 1_000_000}
    )  # fmt: skip
    start = time.monotonic()
    for i, value in enumerate(values):
        if rate:
            pause = start + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        while True:
            try:
                producer.produce(topic, value, b"key-%05d" % (i % DISTINCT_KEYS))
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("produce did not complete")


def _config(side: str, broker: Broker, topic: str, group: str, app: App, api: str, url: str) -> str:
    extra = {"schemas": {"registry": {"url": url}, "decode": {topic: ["value"]}}}
    return sidecar_config(
        "c-tcp-key", broker.bootstrap, topic, group, app, api,
        extra=extra if side == "decoded" else None,
    )  # fmt: skip


def run_saturation(
    side: str, broker: Broker, topic: str, total: int, app: App, directory: str, run: int, url: str
) -> dict[str, Any]:
    group = f"bench-schemas-{side}-{run}-{uuid.uuid4().hex[:6]}"
    api = os.path.join(directory, f"api-schemas-{side}-{run}.sock")
    app.reset()
    config = _config(side, broker, topic, group, app, api, url)
    with running_sidecar(config, directory, f"schemas-{side}-{run}", Side("new", ROOT)) as proc:
        wait_until(lambda: app.stats()["records"] > 0, 60, "the first record", proc)
        cpu0 = cpu_seconds(proc.pid)
        wait_until(lambda: app.stats()["records"] >= total, 600, "every record", proc)
        cpu1 = cpu_seconds(proc.pid)
        stats = app.stats()
    seconds = (stats["last_ns"] - stats["first_ns"]) / 1e9
    return {
        "records_per_s": stats["records"] / seconds if seconds > 0 else float("nan"),
        "cpu_us_per_record": (cpu1 - cpu0) / total * 1e6,
    }


def run_rate(
    side: str, broker: Broker, values: list[bytes], app: App, directory: str, run: int, url: str,
    rate: float,
) -> dict[str, Any]:  # fmt: skip
    topic = broker.create_topic(f"bench-schemas-rate-{uuid.uuid4().hex[:8]}")
    group = f"bench-schemas-rate-{side}-{run}-{uuid.uuid4().hex[:6]}"
    api = os.path.join(directory, f"api-schemas-rate-{side}-{run}.sock")
    app.reset()
    config = _config(side, broker, topic, group, app, api, url)
    with running_sidecar(
        config, directory, f"schemas-rate-{side}-{run}", Side("new", ROOT)
    ) as proc:
        time.sleep(3)  # joined and assigned before the offered load starts (not measured)
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        producer = threading.Thread(target=produce, args=(broker, topic, values, rate))
        producer.start()
        producer.join()
        wait_until(lambda: app.stats()["records"] >= len(values), 120, "every record", proc)
        cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
    return {
        "rate_cpu_us_per_record": (cpu1 - cpu0) / len(values) * 1e6,
        "rate_core_share": (cpu1 - cpu0) / (t1 - t0),
    }


def part_schemas(broker: Broker, app: App, directory: str, args: Any) -> dict[str, Any]:
    """``args.runs`` rounds, each running both sides at saturation then at the offered rate, the
    order flipped every round."""
    from bench.measure import git_commit

    registry = Registry(directory)
    try:
        topic = broker.create_topic(f"bench-schemas-{uuid.uuid4().hex[:8]}")
        print(f"encoding and producing {args.records:,} Avro records to {topic} ...", flush=True)
        values = avro_values(registry.url, topic, args.records)
        produce(broker, topic, values)
        rate = args.latency_rate
        rate_values = values[: int(rate * args.rate_seconds)]
        out: dict[str, Any] = {
            "commit": git_commit(ROOT),
            "records": args.records,
            "value_bytes": round(statistics.mean(len(v) for v in values)),
            "partitions": PARTITIONS,
            "offered_rate": rate,
            "rate_records": len(rate_values),
            "rounds": args.runs,
            "load_average_start": os.getloadavg(),
            "runs": {side: [] for side in SIDES},
        }
        for round_no in range(args.runs):
            for side in SIDES if round_no % 2 == 0 else SIDES[::-1]:
                r = run_saturation(side, broker, topic, args.records, app, directory, round_no, registry.url)  # fmt: skip
                r |= run_rate(side, broker, rate_values, app, directory, round_no, registry.url, rate)  # fmt: skip
                out["runs"][side].append(r)
                print(
                    f"  {side:<8} run {round_no + 1}: {r['records_per_s']:>8,.0f} rec/s"
                    f"  {r['cpu_us_per_record']:.0f} µs CPU/record at saturation,"
                    f" {r['rate_cpu_us_per_record']:.0f} µs at {rate:,.0f}/s"
                    f" ({r['rate_core_share']:.2f} core)",
                    flush=True,
                )
        out["load_average_end"] = os.getloadavg()
        out["median"] = {
            side: {k: statistics.median(r[k] for r in out["runs"][side]) for k in out["runs"][side][0]}
            for side in SIDES
        }  # fmt: skip
        return out
    finally:
        registry.stop()


def print_schemas(out: dict[str, Any]) -> None:
    med = out["median"]
    rate = f"{out['offered_rate']:,.0f}/s"
    print(
        f"\nrecords with schemas (Avro, ~{out['value_bytes']} B, {out['records']:,} records,"
        f" medians of {out['rounds']} rounds, commit {out['commit']})"
    )
    rows = [
        ("records_per_s", "records/s at saturation", "{:,.0f}"),
        ("cpu_us_per_record", "sidecar CPU per record at saturation (µs)", "{:,.1f}"),
        (
            "rate_cpu_us_per_record",
            f"sidecar CPU per record at {out['offered_rate']:,.0f}/s (µs)",
            "{:,.1f}",
        ),
        ("rate_core_share", f"sidecar share of a core at {rate}", "{:,.3f}"),
    ]
    print(f"  {'':<48}{'decoded':>12}{'bytes':>12}{'difference':>14}")
    for key, label, fmt in rows:
        a, b = med["decoded"][key], med["bytes"][key]
        print(f"  {label:<48}{fmt.format(a):>12}{fmt.format(b):>12}{fmt.format(a - b):>14}")
