"""Telemetry: OpenTelemetry spans and W3C trace context (tracing), structured log lines (logs).

May import `sidecar.core` and `sidecar.config`; never Kafka, HTTP, the engines or the service.
"""
