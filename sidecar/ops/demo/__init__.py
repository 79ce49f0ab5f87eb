"""`dlq-sidecar demo`: a local broker, the example app, the sidecar, DLQ inspect and replay, end to end.

`runner` drives it; `setup` finds its files, ports, config and broker; `orders`, `children` and
`display` are its record stream, child processes and progress display. The files it ships are in `data/`.
"""
