"""The sidecar's errors: one root, like httpx's, with third-party exceptions translated at the boundary.

Owns the root (`SidecarError`) and the errors every layer shares; the whole tree is drawn in
`SidecarError`'s docstring (tests/unit/test_errors.py walks the package and checks it).

Must not import anything: every module may import this one.
"""

from __future__ import annotations

__all__ = ["CommitFailed", "DlqError", "KafkaClientError", "SidecarError"]


class SidecarError(Exception):
    """Root of every error the sidecar raises on purpose.

    Every error the package raises on purpose is a `SidecarError`; the tree below is all of them, each
    with the module that defines it (tests/unit/test_errors.py walks the package and checks it)::

        SidecarError ................. root of every error the sidecar raises on purpose       sidecar.core.errors
        ├── ConfigError .............. the configuration is invalid (exit 2)                  sidecar.config.errors
        ├── WireError ................ malformed input to a wire parser or formatter          sidecar.core.wire.values
        ├── CommitStateError ......... commit metadata this build cannot use (start over)     sidecar.core.commitstate
        ├── BudgetError .............. the memory budget cannot hold the librdkafka settings  sidecar.core.budget
        ├── IllegalBreakerCall ....... a call the DLQ circuit breaker's state does not allow  sidecar.core.breaker
        ├── LedgerError .............. an illegal call on a partition's ledger                sidecar.core.ledger.values
        │   ├── UnknownAttempt ....... an attempt id this ledger never issued                 sidecar.core.ledger.values
        │   ├── ExpiredAttempt ....... lock expired, superseded, answered, or revoked         sidecar.core.ledger.values
        │   ├── IllegalTransition .... the call does not apply to the record's state          sidecar.core.ledger.values
        │   └── LedgerClosed ......... the partition was revoked                              sidecar.core.ledger.values
        ├── KafkaClientError ......... librdkafka (`KafkaException`) seen through the sidecar  sidecar.core.errors
        │   ├── KafkaCallError ....... a broker call of an operator tool failed (exit 1)      sidecar.kafka.errors
        │   ├── SourceError .......... the consumer cannot continue (exit 1)                  sidecar.kafka.source
        │   │   ├── ShareGroupsUnavailable ... the cluster cannot run this share group        sidecar.kafka.share.errors
        │   │   └── ShareGroupLimitUnsafe .... no room to dead-letter before the broker does  sidecar.kafka.share.errors
        │   └── CommitFailed ......... one offset commit failed; the next one retries it      sidecar.core.errors
        │       └── CommitTimeout .... a commit did not complete in time                      sidecar.kafka.source
        ├── DlqError ................. the dead-letter queue                                  sidecar.core.errors
        │   ├── DlqStartupError ...... a DLQ topic is missing or unusable at start-up (exit 1) sidecar.kafka.dlq.errors
        │   ├── DlqFatalError ........ a DLQ write that cannot succeed: stop, never drop      sidecar.kafka.dlq.errors
        │   └── DlqTxnAbortable ...... a DLQ transaction to abort and redo                    sidecar.kafka.dlq.errors
        │       └── DlqTxnStuck ...... a transaction call that never returned                 sidecar.kafka.dlq.errors
        ├── AppClientError ........... talking to the app over HTTP                           sidecar.http.exchanges
        │   ├── AppNotReachable ...... nothing listening: not an attempt                      sidecar.http.exchanges
        │   │   └── AppRouteMissing .. the app has no such route (wrong URL): not an attempt  sidecar.http.exchanges
        │   └── AppRequestFailed ..... sent, then failed: an attempt                          sidecar.http.exchanges
        ├── RegistryUnreachable ...... the Schema Registry cannot be used now: pause, retry  sidecar.kafka.schemas.catalog
        ├── LimitExceeded ............ an HTTP message's head or chunk framing over budget    sidecar.http.limits
        ├── PeerClosed ............... the API client closed its connection mid-request       sidecar.http.server
        ├── BadResponse .............. a handler's response that cannot be written (a 500)    sidecar.http.server
        ├── NotPullMode .............. GET /v1/records on a sidecar that pushes               sidecar.engines.pull
        ├── PullQueryError ........... a bad GET /v1/records query (a 400)                    sidecar.service.api
        ├── DlqToolError ............. what `dlq inspect` and `dlq replay` report             sidecar.ops.dlq.errors
        │   └── UsageError ........... arguments that cannot work (exit 2)                    sidecar.ops.dlq.errors
        ├── DemoError ................ something `dlq-sidecar demo` needs is missing          sidecar.ops.demo.setup
        │   └── DemoRefused .......... topics it would replace on a broker it did not start   sidecar.ops.demo.runner
        ├── InjectorConfigError ...... the injector's config file is invalid (exit 2)         sidecar.injector.settings
        ├── Refusal .................. a pod the injector will not admit (a 400)              sidecar.injector.annotations
        │   └── BadAnnotation ........ a dlq-sidecar.io/* annotation it cannot follow         sidecar.injector.annotations
        └── MalformedReview .......... a webhook request that is no AdmissionReview           sidecar.injector.review

    `WireError`, `CommitStateError`, `BudgetError`, `BadResponse`, `PullQueryError` and `MalformedReview` are also
    `ValueError`s, for callers that catch that.  Control-flow signals are not errors and sit outside the
    tree: the config reader's ``Invalid`` (raised by its key kinds, turned into `ConfigError` by
    `sidecar.config.load`), the wire parser's ``Malformed`` (turned into `WireError`), and the private
    ``_Bad``, ``_Stale``, ``_SendTimeout``, ``_Stop``, ``_OffsetUnknown`` and ``_Refused`` that never leave their module.

    Where third-party exceptions are translated: `KafkaException` in the Kafka adapters only, through
    `sidecar.kafka.errors` (`kafka_error`, `translate`): the source (commits included), the DLQ writer, the
    share group and the operator tools' clients (`sidecar.kafka.tools`; the engines and `sidecar.ops`
    import no confluent-kafka); socket errors (`OSError`) in `sidecar.http.exchanges` and the
    pipeline's app probe. The engines catch broadly only around one record's dispatch (a DLQ write,
    one batch of a transaction); the CLI catches at the top. `trio.Cancelled` is never swallowed.
    """


class KafkaClientError(SidecarError):
    """A Kafka client call failed (librdkafka's `KafkaException`, translated)."""


class CommitFailed(KafkaClientError):
    """An offset commit failed or timed out; nothing is lost, the next commit carries the state."""


class DlqError(SidecarError):
    """Root of the dead-letter queue's errors."""
