"""A real, local Apache Kafka broker (KRaft, one combined broker+controller) for development, tests and the demo.

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

from .cli import main
from .jars import KAFKA_VERSION, cache_dir, fetch_jars, java_cmd, kafka_home
from .ports import PORT_RANGE_ENV, default_pick_range, ephemeral_port_range, free_port
from .process import broker_answers, log_tail, new_cluster_id, start, status, stop

__all__ = [
    "KAFKA_VERSION",
    "PORT_RANGE_ENV",
    "broker_answers",
    "cache_dir",
    "default_pick_range",
    "ephemeral_port_range",
    "fetch_jars",
    "free_port",
    "java_cmd",
    "kafka_home",
    "log_tail",
    "main",
    "new_cluster_id",
    "start",
    "status",
    "stop",
]
