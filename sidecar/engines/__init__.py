"""The two engines around one delivery pipeline, and the pipeline's parts.

    interfaces        Engine, DeliveryState and Pipe (what an adapter may use of the pipeline); Delivery
    pipeline          app requests and answers, app prober, status, shutdown: shared by both engines
    pull              pull mode's queue between intake and `GET /v1/records`
    batching          batch assembly: when a batch leaves as a request
    breaker_gate      the DLQ circuit breaker's gate: held records, the probe, its timer
    dlq_step          the DLQ step (stop, skip, hold or write) and the DLQ writer built from the config
    delivery          what both engines build from the config: app client, attempt spans
    consumer_group    delivery state in the ledger plus commit metadata (`engine: consumer`)
    consumer_scheduler the consumer engine's scheduler: its turns, flow control, when a turn runs
    consumer_commits  the consumer engine's offset commits and transactional DLQ batches
    consumer_slots    the consumer engine's per-partition slot, horizon window and clock
    share_group       delivery state in the broker's share partitions (`engine: share`, KIP-932); its
                      share consumers and start-up checks are `sidecar.kafka.share`'s
    share_batch       a share consumer's batch and its suspects
    share_journal     the share engine's local journal of deaths (`share.journal.path`)
    share_recovery    the account of deaths: the sidecar's own counts, the recovery after a death

Import no confluent-kafka (an import-linter contract): the Kafka side is `sidecar.kafka`.

May import the core, the config and the adapters (Kafka, HTTP, telemetry); never the service or the
operator tools.
"""
