"""Records with schemas: the Confluent wire format read through a Schema Registry (Avro, Protobuf, JSON Schema).

    wire       the wire format's header (magic byte, schema id, Protobuf message indexes), the reasons a
               record cannot be decoded and their exception class names; pure
    jsonvalue  a decoded value as JSON (Avro's bytes, decimals, dates; Protobuf's JSON mapping)
    catalog    the registry client (confluent-kafka's `schema_registry`) and the schemas it loaded, by id,
               bounded; loading blocks (a worker thread), decoding does not
    decoder    what the engines call: one record's key or value decoded, or why not, or which schema
               must be loaded first

Imports confluent-kafka's `schema_registry` package (the `schemas` extra): import this package only when
a topic is configured to decode.
"""
