"""The pure delivery core (sans-IO, like h11): no sockets, no trio, no Kafka, no clock.

    errors       the error hierarchy (one root, drawn in its docstring)
    outcome      ack words, causes and their Kafka texts, error classes, the attempt decision
    record       the record view built once at intake; delivery ids and their registry
    ordering     the `ordering` enum (shared with the configuration)
    ledger/      per-partition record states (a transition table), delivery counts, the horizon
                 and the isolation pass, commit metadata, flow control, archiving
    commitstate  the state beyond the committed offset, and its offset-metadata codec
    backoff      the redelivery backoff policy (an immutable value)
    budget       the byte budget for buffered records (`max.buffered.bytes`) and its split
    breaker      the DLQ circuit breaker
    text         the one UTF-8 check
    wire/        the HTTP wire contract with the app: requests, CloudEvents, answers, the ack API
    deadletter   the DLQ step: archived record -> plan -> FailedRecord -> outcome

Imports the standard library only, and nothing from the rest of `sidecar`; every other layer may
import it. Both are checked by import-linter contracts in pyproject.toml, with one more: no import
cycle between sibling modules anywhere in the package.
"""
