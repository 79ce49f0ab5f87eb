"""Share engine crash isolation, app answering in 10 ms (tests/reliability/share_killer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.share_killer import check, run_share_killer


@pytest.mark.parametrize(("consumers", "ordering"), [(4, "none"), (1, "key")])
async def test_share_killer_alone_in_dlq_fast_app(
    bootstrap: str, tmp_path: Path, consumers: int, ordering: str
) -> None:
    o = await run_share_killer(
        bootstrap, tmp_path, delay_s=0.01, consumers=consumers, ordering=ordering
    )
    check(o, f"10 ms, {consumers} consumers, ordering {ordering}")
    # The first start found no journal and said so.
    assert "not found, starting a new one" in o.logs[0]
