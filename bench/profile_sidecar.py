"""``python -m bench.profile_sidecar OUT.prof ARGS...``: the sidecar's CLI under cProfile, timed in CPU.

What ``BENCH_CPROFILE=DIR`` runs instead of ``python -m sidecar``. The profiler's clock is the trio
thread's own CPU time (``time.thread_time``), so on a loaded machine the figures are the work done,
not the time spent waiting for a core; the poll thread and librdkafka's threads are not in it.
Profiling slows every call: the profile says where the time goes, the bench's figures how much.
"""

from __future__ import annotations

import cProfile
import sys
import time


def main() -> int:
    out, args = sys.argv[1], sys.argv[2:]
    from sidecar.cli import main as sidecar_main

    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    try:
        return sidecar_main(args)
    finally:
        profiler.disable()
        profiler.dump_stats(out)


if __name__ == "__main__":
    sys.exit(main())
