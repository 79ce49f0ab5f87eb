"""HTTP adapters on trio (httptools): the server for the local API, the injector and test apps, the client to the app.

    server     HTTP/1.1 server framing, keep-alive, hard limits, TCP and Unix sockets, TLS
    appclient  the keep-alive client that pushes records to the app; "not reachable" vs "failed"
    limits     byte budgets of header blocks, trailers, chunk framing and bodies, shared by both sides
    room       who holds a listener's connection slots, and whom to close to make room (sans-IO)
    sockets    the server's listening side: Unix-socket listeners, bursts of accepts, idle waits

May import `sidecar.core`; never Kafka, the engines or the service.
"""
