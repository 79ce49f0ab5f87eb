"""Records with schemas: the Confluent wire format read through a Schema Registry (Avro, Protobuf, JSON Schema).

Owns the wire format's header (`wire`), decoded values as JSON (`jsonvalue`), the registry client and
its schemas (`catalog`) and what the engines call (`decoder`: one key or value decoded, or why not).

Imports confluent-kafka's `schema_registry` package (the `schemas` extra): import this package only when
a topic is configured to decode.
"""
