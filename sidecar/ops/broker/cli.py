"""`scripts/kafka`'s command line: start, stop, status, fetch."""

from __future__ import annotations

import argparse

from .jars import cache_dir, fetch_jars
from .process import start, status, stop

USAGE = """\
A real, local Apache Kafka broker (KRaft, one combined broker+controller) for development, tests and the demo.

    scripts/kafka start     fetch the jars (once, with Maven), format fresh storage, start, wait, print the bootstrap address
    scripts/kafka start --secured
                            the same broker with two more listeners, SASL_SSL (SCRAM-SHA-512) and SSL with
                            required client certificates (mTLS); a CA, the broker's and a client's certificate
                            are generated with openssl, the SCRAM user is created with Kafka's storage tool at
                            format time; where everything is goes to <state dir>/broker.json ("secured")
    scripts/kafka stop      stop the broker cleanly and delete its storage
    scripts/kafka status    print the bootstrap address if it is running (exit 0), else exit 3
    scripts/kafka fetch     only fetch the jars into the cache

With KAFKA_BOOTSTRAP=host:port set, nothing is fetched or started: `start` and `status` check that broker instead.

Standard library only, and relative imports only: it runs before any virtual environment exists (`--secured` also needs `openssl` 1.1.1+).

Environment:
    KAFKA_BOOTSTRAP        use this broker instead of starting one
    DLQ_SIDECAR_CACHE      cache directory (default ~/.cache/dlq-sidecar); jars go to <cache>/kafka-<version>/libs
    DLQ_KAFKA_STATE_DIR    where the running broker's state file lives (default <cache>/run); lets tests run a second broker
    DLQ_KAFKA_HEAP         JVM heap (default 512m)
"""


def main() -> int:
    parser = argparse.ArgumentParser(
        description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["start", "stop", "status", "fetch"])
    parser.add_argument(
        "--secured",
        action="store_true",
        help="start: add SASL_SSL (SCRAM) and mTLS listeners, with generated certificates",
    )
    args = parser.parse_args()
    if args.secured and args.command != "start":
        parser.error("--secured goes with start only")
    cache_dir().mkdir(parents=True, exist_ok=True)
    if args.command == "start":
        return start(secured=args.secured)
    if args.command == "stop":
        return stop()
    if args.command == "status":
        return status()
    print(fetch_jars())
    return 0
