"""The share-group engine (`engine: share`, KIP-932): delivery state in the broker's share partitions.

`group.ShareGroupEngine` is the pipeline's `StateAdapter`; its share consumers are `sidecar.kafka.share`'s.
Must not import the consumer engine (an import-linter `independence` contract); `sidecar.engines.tiered_share`
is the one module that joins the two.
"""
