"""Kafka adapters (confluent-kafka): the consumer driven from trio, and the DLQ writer.

    source   the consumer: subscribe, the poll loop, commits with metadata, pause/resume, close
    dlq      DLQ topics (admin), DLQ writes (acks=all, idempotent), the transactional protocol

May import `sidecar.core` and `sidecar.config`; never the engines, the HTTP adapters or the service.
"""
