"""The scale bench (``python -m bench --scenarios scale-wide,scale-many,scale-share,scale-dapr``).

Its own part, runnable alone: ``wide`` (one sidecar, many partitions), ``rollout`` (many sidecars in
one group through a rolling restart: consumer groups, share groups, Dapr beside it), ``journal``
(the verdict on a run from the app's journal and the DLQ) and ``report`` (the figures, with their
ratios to the targets). ``part_scale`` runs the selected scenarios and returns their figures.
"""
