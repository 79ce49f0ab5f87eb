"""The dead-letter queue: DLQ records, DLQ topics, plain writes and the transactional protocol.

Owns the package's surface: `from sidecar.kafka.dlq import X` is how the engines, the operator tools
and the tests import it (`FailedRecord` and the cause texts are re-exported from the pure core).
Each module's docstring says what it owns; docs/architecture.md lists them.

Must not import the ledger, the source, the engines or the HTTP modules.
"""

from __future__ import annotations

from sidecar.core.deadletter import FailedRecord
from sidecar.core.outcome import CAUSE_DELIVERY_COUNT, CAUSE_REJECTED
from sidecar.kafka.dlq.errors import DlqFatalError, DlqStartupError, DlqTxnAbortable, DlqTxnStuck
from sidecar.kafka.dlq.record import (
    DLQ_HEADER_PREFIX,
    H_COPY_DROPPED,
    H_DELIVERY_COUNT,
    H_EXC_CAUSE_CLASS,
    H_EXC_CLASS,
    H_EXC_MESSAGE,
    H_EXC_STACKTRACE,
    H_GROUP,
    H_MESSAGE,
    H_OFFSET,
    H_PARTITION,
    H_ROUTE_REFUSED,
    H_TOPIC,
    H_VALUE_NOT_ENCODED,
    REPLAY_HEADER_PREFIX,
    DlqRecord,
    Header,
    build_dlq_record,
    is_reserved_header,
)
from sidecar.kafka.dlq.topics import TOPIC_CONFIG_GROUP_DLQ, DlqTopics, producer_properties
from sidecar.kafka.dlq.txn import (
    ABORT_CHECK_BUDGET_S,
    ABORT_REPAIR_ROUNDS,
    ABORT_SETTLE_S,
    OUTCOME_READ_BUDGET_S,
    PROBE_HEADER,
    TXN_CALL_TIMEOUT_S,
    TXN_CALL_WATCHDOG_S,
    CommittedOffsets,
    DlqWriter,
    default_transactional_id,
    replaceable,
    transaction_committed,
)
from sidecar.kafka.dlq.writer import PlainDlqWriter

__all__ = [
    "ABORT_CHECK_BUDGET_S",
    "ABORT_REPAIR_ROUNDS",
    "ABORT_SETTLE_S",
    "CAUSE_DELIVERY_COUNT",
    "CAUSE_REJECTED",
    "DLQ_HEADER_PREFIX",
    "H_COPY_DROPPED",
    "H_DELIVERY_COUNT",
    "H_EXC_CAUSE_CLASS",
    "H_EXC_CLASS",
    "H_EXC_MESSAGE",
    "H_EXC_STACKTRACE",
    "H_GROUP",
    "H_MESSAGE",
    "H_OFFSET",
    "H_PARTITION",
    "H_ROUTE_REFUSED",
    "H_TOPIC",
    "H_VALUE_NOT_ENCODED",
    "OUTCOME_READ_BUDGET_S",
    "PROBE_HEADER",
    "REPLAY_HEADER_PREFIX",
    "TOPIC_CONFIG_GROUP_DLQ",
    "TXN_CALL_TIMEOUT_S",
    "TXN_CALL_WATCHDOG_S",
    "CommittedOffsets",
    "DlqFatalError",
    "DlqRecord",
    "DlqStartupError",
    "DlqTopics",
    "DlqTxnAbortable",
    "DlqTxnStuck",
    "DlqWriter",
    "FailedRecord",
    "Header",
    "PlainDlqWriter",
    "build_dlq_record",
    "default_transactional_id",
    "is_reserved_header",
    "producer_properties",
    "replaceable",
    "transaction_committed",
]
