"""Records with schemas: the Confluent wire format read through a Schema Registry (Avro, Protobuf, JSON Schema).

    wire       the header (magic byte, schema id, Protobuf message indexes), why a record does not decode
    jsonvalue  a decoded value as JSON text
    catalog    the registry client and the schemas it loaded, by id, bounded (loading blocks)
    decoder    one record's key or value decoded, or why not, or which schema must be loaded first

Imports confluent-kafka's `schema_registry` package (the `schemas` extra): only when a topic decodes.
"""
