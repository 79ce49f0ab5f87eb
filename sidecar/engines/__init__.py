"""The two engines around one delivery pipeline, and the pipeline's parts.

`pipeline` (with `interfaces`, `outlet`, `pull`, `batching`, `breaker_gate`, `attempts`, `dlq_step`,
`dlq_summary`, `tier_step`, `source_topics`) is written once for both engines; `consumer/` and `share/` are the
two places to keep delivery state, independent of each other; `tiered_share` joins them for the share engine
with retry tiers. docs/architecture.md draws the parts and one record's path.

Imports no confluent-kafka and never the service or the operator tools (import-linter contracts).
"""
