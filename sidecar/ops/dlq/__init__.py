"""`dlq-sidecar dlq inspect|replay`: reading DLQ topics of every dialect the tools know, and replaying them.

Blocking command-line code (no trio); reaches Kafka through `sidecar.kafka.tools` only.
"""
