"""The running service: `dlq-sidecar run` (daemon), the local API's two listeners (api), Prometheus (metrics),
the exit record that outlives a container restart (exits).

May import everything below it (engines, adapters, config, core); never the operator tools.
"""
