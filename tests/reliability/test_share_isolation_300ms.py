"""Share engine crash isolation, app holding each record 300 ms (tests/reliability/share_killer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.share_killer import check, run_share_killer


@pytest.mark.parametrize(("consumers", "ordering"), [(4, "key"), (1, "none")])
async def test_share_killer_alone_in_dlq_300ms_app(
    bootstrap: str, tmp_path: Path, consumers: int, ordering: str
) -> None:
    o = await run_share_killer(
        bootstrap, tmp_path, delay_s=0.3, consumers=consumers, ordering=ordering
    )
    check(o, f"300 ms, {consumers} consumers, ordering {ordering}")
