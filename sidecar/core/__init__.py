"""The pure delivery core (sans-IO, like h11): no sockets, no trio, no Kafka, no clock.

    errors       the error hierarchy (one root, drawn in its docstring)
    outcome      ack words, causes and their Kafka texts, error classes, the attempt decision
    record       the record view built once at intake; delivery ids and their registry
    ledger       per-partition record states, delivery counts, the horizon and the isolation pass
    commitstate  the state beyond the committed offset, and its offset-metadata codec
    backoff      the redelivery backoff policy (an immutable value)
    wire         the HTTP wire contract with the app: request bytes, answers, the ack API body
    deadletter   the DLQ step: archived record -> plan -> FailedRecord -> outcome

Imports nothing from the rest of `sidecar`; every other layer may import it (checked by the
import-linter contract in pyproject.toml).
"""
