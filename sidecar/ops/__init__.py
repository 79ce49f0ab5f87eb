"""Operator tools: reading and replaying DLQ topics (docs/dlq-operations.md), and the local demo.

    dlq_errors    DlqToolError, UsageError; exit codes
    dlq_filters   --format/--since/--until/--offset-range parsing and the filter set
    dlq_formats   which system wrote a DLQ record (ours and share groups, Kafka Streams, Kafka Connect,
                  Spring Kafka) and its context headers decoded into the fields they share
    dlq_entries   one DLQ record read back, its context decoded (by dlq_formats)
    dlq_reader    the tools' client settings, a DLQ topic's partitions (the consumer and the bounded
                  read are `sidecar.kafka.tools`)
    dlq_inspect   dlq inspect: read to the end, count what matches
    dlq_replay    dlq replay: send, confirm, commit under a replay name
    dlq_render    tables and summaries (rich)
    dlq_command   argparse and exit codes for `dlq-sidecar dlq inspect|replay`
    demo          `dlq-sidecar demo`: broker, example app, sidecar, DLQ inspect and replay, end to end
    demo_setup    the demo's files, ports, derived config, broker and topic
    demo_orders   the demo's seeded order stream and what the example app makes of it
    demo_children the demo's producer thread, child processes and status reads
    demo_display  the demo's progress display and the DLQ records it shows

These are blocking command-line tools (no trio). They sit above the sidecar's configuration and the DLQ
writer's vocabulary and may import them; nothing in the sidecar's delivery path may import `sidecar.ops`.
They reach Kafka through `sidecar.kafka.tools` only (an import-linter contract forbids confluent_kafka
here).
"""
