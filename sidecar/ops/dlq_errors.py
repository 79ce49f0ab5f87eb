"""The errors and exit codes of `dlq-sidecar dlq inspect` and `dlq replay`.

    DlqToolError          root of everything the two commands report (under SidecarError)
    ├── UsageError        the arguments cannot work (bad filter, unknown topic, a name used with other
    │                     filters): exit 2
    └── ToolKafkaError    the broker could not be reached or refused a read, a write or a commit: exit 1

confluent-kafka errors are translated at this boundary (`_kafka_error`).

Imports: the standard library, confluent-kafka and `sidecar.core.errors` (the root) only.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from sidecar.core.errors import SidecarError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class DlqToolError(SidecarError):
    """Root of the errors `dlq inspect` and `dlq replay` report."""


class UsageError(DlqToolError):
    """The arguments cannot work (bad filter, unknown topic, a name used with other filters): exit 2."""


class ToolKafkaError(DlqToolError):
    """The broker could not be reached or refused a read, a write or a commit: exit 1."""


def _kafka_error(what: str, exc: KafkaException) -> ToolKafkaError:
    err = exc.args[0] if exc.args else None
    text = err.str() if isinstance(err, KafkaError) else str(exc)
    return ToolKafkaError(f"{what}: {text}")
