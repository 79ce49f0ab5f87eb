"""What a console page costs with a large DLQ topic: ``python -m bench.console_pages``.

Seeds a DLQ topic with N records in the sidecar's own format (`build_dlq_record`, the records the DLQ
writer produces: four exception classes, both causes, 200-byte JSON values), starts
`dlq-sidecar console` as a child process against the broker, then fetches each page several times and
reports the median wall time per page and the console's peak RSS (VmHWM) after each page kind.

    python -m bench.console_pages --bootstrap HOST:PORT [--records 100000] [--repeat 3]

Without --bootstrap it uses $KAFKA_BOOTSTRAP, else starts a broker with scripts/kafka.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sidecar.core.deadletter import FailedRecord
from sidecar.core.outcome import CAUSE_DELIVERY_COUNT, CAUSE_REJECTED
from sidecar.kafka.dlq.record import build_dlq_record

ROOT = Path(__file__).resolve().parents[1]
CLASSES = (
    "com.example.InvalidOrder",
    "com.example.PaymentDeclined",
    "java.lang.IllegalStateException",
    "com.example.Timeout",
)


def seed(bootstrap: str, topic: str, source: str, records: int, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for name, parts in ((topic, partitions), (source, partitions)):
        admin.create_topics([NewTopic(name, parts, 1)])[name].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    for i in range(records):
        failed = FailedRecord(
            topic=source,
            partition=i % partitions,
            offset=i // partitions,
            key=f"order-{i}".encode(),
            value=(f'{{"order": {i}, "amount": {i % 997}, "note": "' + "x" * 150 + '"}').encode(),
            headers=(("trace", f"t{i}".encode()),),
            group="orders-app",
            delivery_count=1 + i % 5,
            cause=CAUSE_REJECTED if i % 3 else CAUSE_DELIVERY_COUNT,
            exception_class=CLASSES[i % len(CLASSES)],
            exception_message=f"order {i} failed validation",
        )
        rec = build_dlq_record(failed, topic, partitions, True, 4096)
        while True:
            try:
                producer.produce(
                    topic,
                    key=rec.key,
                    value=rec.value,
                    headers=list(rec.headers),
                    partition=i % partitions,
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    assert producer.flush(60) == 0


def _peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _get(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as resp:
        resp.read()
        assert resp.status == 200, resp.status
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.console_pages")
    ap.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP"))
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--port", type=int, default=18686)
    args = ap.parse_args()
    bootstrap = (
        args.bootstrap
        or subprocess.run(
            [str(ROOT / "scripts" / "kafka"), "start"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    tag = uuid.uuid4().hex[:6]
    topic, source = f"dlq.bench-{tag}", f"bench-{tag}"
    t0 = time.perf_counter()
    seed(bootstrap, topic, source, args.records)
    print(f"seeded {args.records} records into {topic} in {time.perf_counter() - t0:.1f}s")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sidecar",
            "console",
            "--bootstrap",
            bootstrap,
            "--port",
            str(args.port),
            "--read-only",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "serving on" in proc.stdout.readline()
        base = f"http://127.0.0.1:{args.port}"
        pages = {
            "topics": f"{base}/",
            "topic summary (first: full scan)": f"{base}/topics/{topic}",
            "records page 1": f"{base}/topics/{topic}/records",
            "records, filter matching 1 in 4": f"{base}/topics/{topic}/records?exception_class={CLASSES[1]}",
            "records, filter matching none (scan budget)": f"{base}/topics/{topic}/records?message=nomatch",
            "one record": f"{base}/topics/{topic}/records/0/{args.records // 6}",
        }
        print(f"{'page':48} {'first s':>8} {'median s':>9} {'peak RSS MiB':>13}")
        for name, url in pages.items():
            times = [_get(url) for _ in range(args.repeat)]
            print(
                f"{name:48} {times[0]:8.3f} {statistics.median(times):9.3f} "
                f"{_peak_rss_kib(proc.pid) / 1024:13.1f}"
            )
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
