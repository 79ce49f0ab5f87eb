"""A real, local Apache Kafka broker (KRaft, one combined broker+controller) for development, tests and the demo.

Owns the launcher behind `scripts/kafka` (its commands and environment: `sidecar.ops.broker.cli.USAGE`):
fetching the jars (`jars`), certificates for ``--secured`` (`certs`), the process's life (`process`),
free ports (`ports`) and the command line (`cli`).

Standard library only, and relative imports only: it runs before any virtual environment exists.
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
