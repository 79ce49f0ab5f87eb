"""The memory a sidecar may take for its assigned partitions, and the container limit it is held to."""

from __future__ import annotations

from pathlib import Path

from sidecar.core.budget import (
    BASE_PROCESS_BYTES,
    PARTITION_OVERHEAD_BYTES,
    memory_needed_bytes,
    partitions_within,
)
from sidecar.engines.consumer.status import memory_limit_bytes

MiB = 1024 * 1024


def test_partitions_within_a_limit_is_the_inverse_of_the_memory_needed() -> None:
    budget = 64 * MiB
    within = partitions_within(256 * MiB, budget)
    assert (
        memory_needed_bytes(budget, within) <= 256 * MiB < memory_needed_bytes(budget, within + 1)
    )
    # The chart's default: 256 Mi and the default budget hold several thousand idle partitions.
    assert 8000 < within < 9000
    assert partitions_within(BASE_PROCESS_BYTES + budget - 1, budget) == 0
    assert memory_needed_bytes(budget, 1000) - memory_needed_bytes(budget, 0) == (
        1000 * PARTITION_OVERHEAD_BYTES
    )


def test_the_memory_limit_comes_from_the_cgroup(tmp_path: Path) -> None:
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    assert memory_limit_bytes((v2, v1)) is None  # neither file: no limit known
    v1.write_text("268435456\n")
    assert memory_limit_bytes((v2, v1)) == 256 * MiB
    v2.write_text("max\n")
    assert memory_limit_bytes((v2, v1)) is None  # v2 first: unlimited
    v2.write_text("134217728\n")
    assert memory_limit_bytes((v2, v1)) == 128 * MiB
    v2.unlink()
    v1.write_text("9223372036854771712\n")  # cgroup v1's "no limit"
    assert memory_limit_bytes((v2, v1)) is None
