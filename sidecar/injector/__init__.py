"""The sidecar injector: a mutating admission webhook that adds dlq-sidecar to annotated pods.

Owns its config (`settings`), the ``dlq-sidecar.io/*`` annotations (`annotations`), the container and
JSONPatch for one pod (`patch`), AdmissionReview in and out (`review`), all pure, and `server`.

May import `sidecar.core`, `sidecar.http` and `sidecar.telemetry`; never Kafka, the engines or the
service. The pure modules import no trio, sockets or files (a contract in pyproject.toml).
"""
