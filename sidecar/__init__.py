"""dlq-sidecar: Kafka share-group-style delivery with a dead-letter queue, for any app over HTTP."""

__version__ = "0.1.0"

__all__ = ["__version__"]
