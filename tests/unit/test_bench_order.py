"""`python -m bench --baseline`: which side runs first in each round."""

from __future__ import annotations

from pathlib import Path

from bench.sidecar_bench import round_order
from bench.sidecars import Side


def test_the_sides_swap_their_order_every_other_round() -> None:
    new, old = Side("new", Path("/new")), Side("old", Path("/old"))
    orders = [[s.name for s in round_order([new, old], r)] for r in range(4)]
    assert orders == [["new", "old"], ["old", "new"], ["new", "old"], ["old", "new"]]
    assert round_order([new], 1) == [new]  # no baseline: one side, nothing to swap
