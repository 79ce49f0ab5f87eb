"""The two engines around one delivery pipeline.

    pipeline        workers, app prober, answers, DLQ step, status: shared by both engines
    delivery        what both engines build from the config: app client, DLQ writer, attempt spans
    consumer_group  delivery state in the ledger plus commit metadata (`engine: consumer`)
    share_group     delivery state in the broker's share partitions (`engine: share`, KIP-932)

May import the core, the config and the adapters (Kafka, HTTP, telemetry); never the service or the
operator tools.
"""
