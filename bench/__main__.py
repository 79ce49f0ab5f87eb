"""``python -m bench``: the end-to-end benchmark (see :mod:`bench.sidecar_bench`: the parts, the
options, ``main``, and which module holds the rest)."""

from bench.sidecar_bench import main

main()
