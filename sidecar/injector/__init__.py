"""The sidecar injector: a mutating admission webhook that adds dlq-sidecar to annotated pods.

    settings     the injector's own config file: listener, TLS files, the defaults of what it injects
    annotations  the dlq-sidecar.io/* pod annotations and what they choose (pure)
    patch        the sidecar container, its volumes and the JSONPatch for one pod (pure)
    review       AdmissionReview admission.k8s.io/v1 in and out (pure)
    server       `dlq-sidecar injector`: HTTPS on trio through sidecar.http, certificate reloads

May import `sidecar.core`, `sidecar.http` and `sidecar.telemetry`; never Kafka, the engines or the
service. The pure modules import no trio, sockets or files (a contract in pyproject.toml).
"""
