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
    "PartitionLedger": "sidecar.ledger",
    "LedgerConfig": "sidecar.ledger",
    "Ack": "sidecar.outcome",
    "Ordering": "sidecar.ledger",
    "RecordState": "sidecar.ledger",
    "RetryPolicy": "sidecar.backoff",
    "CommitState": "sidecar.commitstate",
    # the wire contract and DLQ records
    "Answer": "sidecar.wire",
    "RecordView": "sidecar.wire",
    "FailedRecord": "sidecar.dlq",
    "build_dlq_record": "sidecar.dlq",
    # running it
    "run_sidecar": "sidecar.daemon",
    "Engine": "sidecar.pipeline",
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
