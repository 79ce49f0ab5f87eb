"""The sidecar's errors: one root, like httpx's, with third-party exceptions translated at the boundary.

    SidecarError
    ├── ConfigError ............ the configuration is invalid (exit 2)                  sidecar.config
    ├── WireError .............. malformed input to a wire parser or formatter          sidecar.core.wire
    ├── LedgerError ............ an illegal call on a partition's ledger                sidecar.core.ledger
    │   ├── UnknownAttempt, ExpiredAttempt, IllegalTransition, LedgerClosed
    ├── AppClientError ......... talking to the app over HTTP                           sidecar.http.appclient
    │   ├── AppNotReachable .... nothing listening: not an attempt (socket errors end here)
    │   └── AppRequestFailed ... sent, then failed: an attempt (timeouts, resets, bad HTTP)
    ├── KafkaClientError ....... librdkafka (`KafkaException`) seen through the sidecar
    │   ├── SourceError ........ the consumer cannot continue (exit 1)                  sidecar.kafka.source
    │   │   ├── ShareGroupsUnavailable ... the cluster cannot run this share group     sidecar.engines.share_group
    │   │   └── ShareGroupLimitUnsafe .... the group's delivery limit leaves no room to dead-letter first
    │   └── CommitFailed ....... one offset commit failed; the next one retries it     sidecar.engines.consumer_group
    └── DlqError ............... the dead-letter queue                                  sidecar.kafka.dlq
        ├── DlqStartupError .... a DLQ topic is missing or unusable at start-up (exit 1)
        ├── DlqFatalError ...... a DLQ write that cannot succeed: stop, never drop (exit 1)
        └── DlqTxnAbortable .... a DLQ transaction to abort and redo
            └── DlqTxnStuck .... a transaction call that never returned

Where third-party exceptions are translated: `KafkaException` in `sidecar.source`, `sidecar.dlq`,
`sidecar.share_engine` and (commits) `sidecar.engine`; socket errors (`OSError`) in `sidecar.appclient`
and the pipeline's app probe. The engines catch broadly only around one record's dispatch (a DLQ write, one
batch of a transaction); the CLI catches at the top. `trio.Cancelled` is never swallowed.

Must not import anything: every module may import this one.
"""

from __future__ import annotations

__all__ = ["CommitFailed", "DlqError", "KafkaClientError", "SidecarError"]


class SidecarError(Exception):
    """Root of every error the sidecar raises on purpose."""


class KafkaClientError(SidecarError):
    """A Kafka client call failed (librdkafka's `KafkaException`, translated)."""


class CommitFailed(KafkaClientError):
    """An offset commit failed or timed out; nothing is lost, the next commit carries the state."""


class DlqError(SidecarError):
    """Root of the dead-letter queue's errors."""
