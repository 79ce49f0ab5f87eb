"""dlq-sidecar: Kafka share-group-style delivery with a dead-letter queue, for any app over HTTP.

The public surface is listed in `__all__`; names are imported lazily so `import sidecar` (and the CLI's
start-up) does not load confluent-kafka, trio or OpenTelemetry until they are used.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # configuration
    "Config": "sidecar.config",
    "ConfigError": "sidecar.config",
    "load_config": "sidecar.config",
    "parse_config": "sidecar.config",
    # the pure delivery core
    "PartitionLedger": "sidecar.core.ledger",
    "LedgerConfig": "sidecar.core.ledger",
    "Ack": "sidecar.core.outcome",
    "Ordering": "sidecar.core.ordering",
    "RecordState": "sidecar.core.ledger",
    "RetryPolicy": "sidecar.core.backoff",
    "CommitState": "sidecar.core.commitstate",
    # the wire contract and DLQ records
    "Answer": "sidecar.core.wire",
    "RecordView": "sidecar.core.wire",
    "FailedRecord": "sidecar.kafka.dlq",
    "build_dlq_record": "sidecar.kafka.dlq",
    # running it
    "run_sidecar": "sidecar.service.daemon",
    "Engine": "sidecar.engines.pipeline",
}

__all__ = [
    "Ack",
    "Answer",
    "CommitState",
    "Config",
    "ConfigError",
    "Engine",
    "FailedRecord",
    "LedgerConfig",
    "Ordering",
    "PartitionLedger",
    "RecordState",
    "RecordView",
    "RetryPolicy",
    "__version__",
    "build_dlq_record",
    "load_config",
    "parse_config",
    "run_sidecar",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sidecar' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
