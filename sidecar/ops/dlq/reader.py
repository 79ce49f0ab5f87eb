"""Reading a DLQ topic: the tools' client settings and a DLQ topic's partitions, through the Kafka adapter.

The consumer itself (assign, read_committed, never committing on its own, a read bounded by the
watermarks seen at start) is `sidecar.kafka.tools.ReadConsumer`; this module adds what the commands
make of it: a topic that does not exist is a usage error (exit 2).

Imports: the standard library, `sidecar.kafka.tools` and `sidecar.ops.dlq.errors`.
Must not import the engines, the ledger, the source, the daemon or the HTTP modules; of the DLQ writer it
shares only the header names (`sidecar.kafka.dlq`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.kafka.tools import ReadConsumer
from sidecar.ops.dlq.errors import UsageError


def client_properties(bootstrap: str, extra: Mapping[str, str]) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, **extra}


def dlq_partitions(consumer: ReadConsumer, topic: str, timeout_s: float = 15) -> list[int]:
    """The DLQ topic's partitions; UsageError when it does not exist."""
    parts = consumer.partitions(topic, timeout_s)
    if not parts:
        raise UsageError(f"topic {topic} does not exist (or is not readable)")
    return parts


__all__ = ["client_properties", "dlq_partitions"]
