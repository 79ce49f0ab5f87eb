"""``python -m bench.fetch_backoff``: what librdkafka's ``fetch.queue.backoff.ms`` costs while the queue is full.

The sidecar sets ``fetch.queue.backoff.ms`` to 10 ms (``sidecar.kafka.consumer_config``): once a
partition's prefetch queue is over its limits, librdkafka checks again every 10 ms instead of every second.
This measures the price of those checks where it is highest: a bare consumer on a topic of many partitions
with a backlog, which fetches until its queue is full and then takes nothing (as when a slow app holds the
sidecar back), for each backoff in turn, alternated. It prints the process's CPU in that state.

Needs ``KAFKA_BOOTSTRAP`` (a broker to create the topic on). The queue limits are the sidecar's defaults
for the 64 MiB budget (``sidecar.core.budget``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _backlog(bootstrap: str, partitions: int, per_partition: int, value_bytes: int) -> str:
    topic = f"bench-fetch-backoff-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    value = b"x" * value_bytes
    for i in range(partitions * per_partition):
        while True:
            try:
                producer.produce(topic, value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(60)
    return topic


def _full_queue_cpu(
    bootstrap: str, topic: str, partitions: int, backoff_ms: int, seconds: float
) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-fetch-backoff-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "queued.max.messages.kbytes": 16384,
            "queued.min.messages": 16384,
            "fetch.max.bytes": 8 * 1024 * 1024,
            "fetch.queue.backoff.ms": backoff_ms,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        consumer.poll(
            1.0
        )  # fetching starts; from here on nothing is taken: the queue fills, stays full
        time.sleep(5)
        cpu0, t0 = _cpu_s(), time.monotonic()
        time.sleep(seconds)
        return (_cpu_s() - cpu0) / (time.monotonic() - t0)
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=120)
    parser.add_argument("--records-per-partition", type=int, default=2000)
    parser.add_argument("--value-bytes", type=int, default=200)
    parser.add_argument(
        "--backoffs", default="1000,10", help="fetch.queue.backoff.ms values, alternated"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured per round and value")
    args = parser.parse_args(argv)
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        print("set KAFKA_BOOTSTRAP (scripts/kafka start prints it)", file=sys.stderr)
        return 2
    backoffs = [int(b) for b in args.backoffs.split(",")]
    print(
        f"producing {args.partitions * args.records_per_partition:,} records to {args.partitions} partitions ..."
    )
    topic = _backlog(bootstrap, args.partitions, args.records_per_partition, args.value_bytes)
    shares: dict[int, list[float]] = {b: [] for b in backoffs}
    for rnd in range(args.rounds):
        for backoff in backoffs:
            share = _full_queue_cpu(bootstrap, topic, args.partitions, backoff, args.seconds)
            shares[backoff].append(share)
            print(
                f"  round {rnd + 1}: fetch.queue.backoff.ms={backoff}: {share * 100:.2f} % of a core"
            )
    first = backoffs[0]
    for backoff in backoffs:
        median = statistics.median(shares[backoff])
        ratio = median / statistics.median(shares[first]) if shares[first] else float("nan")
        print(
            f"fetch.queue.backoff.ms={backoff}: median {median * 100:.2f} % of a core with the queue full"
            f" ({args.partitions} partitions; {ratio:.2f} x the {first} ms figure)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
