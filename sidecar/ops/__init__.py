"""Operator tools: `dlq/` (inspect, replay), `console/` (the web console), `demo/`, `broker/` (the local broker).

Blocking command-line tools (no trio) above the sidecar's configuration and the DLQ writer's vocabulary;
nothing in the delivery path imports them. They reach Kafka through `sidecar.kafka.tools` only (an
import-linter contract forbids confluent_kafka here).
"""
