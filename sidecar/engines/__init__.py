"""The two engines around one delivery pipeline, and the pipeline's parts.

    interfaces        Engine, StateAdapter and its StateView (what the pipeline uses of an adapter),
                      Outlet (what an adapter uses of the pipeline), EngineParts; Delivery, Room
    pipeline          app requests and answers, app prober, status, shutdown: shared by both engines
    outlet            the Outlet an adapter is given: issue, send, retire, the DLQ step, the room
    pull              pull mode's queue between intake and `GET /v1/records`
    batching          batch assembly: when a batch leaves as a request
    breaker_gate      the DLQ circuit breaker's gate: held records, the probe, its timer
    dlq_step          the DLQ step (stop, skip, hold or write), the DLQ writer built from the config,
                      whether the DLQ is transactional
    delivery          what both engines build from the config: app client, attempt spans
    tier_step         the retry tier step: a long release written to its tier (both engines)
    consumer_group    delivery state in the ledger plus commit metadata (`engine: consumer`): builds
                      its parts, keeps the source's callbacks and the answers
    consumer_slots    the consumer engine's partitions (Partitions, Slot), horizon window and clock
    consumer_scheduler the consumer engine's scheduler (Scheduler, Wakeup): turns, flow control
    consumer_handout  the consumer engine's hand-out (Sender) and write-ahead group commit
    consumer_commits  the consumer engine's offset commits and transactional DLQ batches (Committer)
    consumer_isolation the consumer engine's isolation step (horizon mode: a suspect alone)
    consumer_archive  the consumer engine's archive tasks and held records (Archiver)
    consumer_status   the consumer engine's StateView: readiness, status, partitions
    consumer_tiers    the consumer engine's retry tier intake: a tier record back to the original
    share_group       delivery state in the broker's share partitions (`engine: share`, KIP-932); its
                      share consumers and start-up checks are `sidecar.kafka.share`'s
    share_batch       a share consumer's batch and its suspects
    share_journal     the share engine's local journal of deaths (`share.journal.path`)
    share_recovery    the account of deaths: the sidecar's own counts, the recovery after a death
    share_tier_write  the share engine's long releases: to a retry tier, then ACCEPT
    share_tiers       the share engine with retry tiers: its tier reader and the one adapter of both

Import no confluent-kafka (an import-linter contract): the Kafka side is `sidecar.kafka`.

May import the core, the config and the adapters (Kafka, HTTP, telemetry); never the service or the
operator tools.
"""
