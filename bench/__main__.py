"""``python -m bench``: the end-to-end benchmark (see :mod:`bench.sidecar_bench`)."""

from bench.sidecar_bench import main

main()
