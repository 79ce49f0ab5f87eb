"""The consumer-group engine (`engine: consumer`): delivery state in the sidecar's ledgers and commit metadata.

`group.ConsumerGroupEngine` builds its parts (partitions, scheduler, hand-out, commits, isolation, archive,
status, tiers) and is the pipeline's `StateAdapter`. Must not import the share engine (an import-linter
`independence` contract) nor the service or the operator tools.
"""
