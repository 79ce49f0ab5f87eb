"""Share engine crash isolation, app holding each record 300 ms (tests/reliability/share_killer.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.share_killer import check, run_share_killer


@pytest.mark.parametrize("ordering", ["none", "key"])
@pytest.mark.parametrize("consumers", [4, 1])
async def test_share_killer_alone_in_dlq_300ms_app(
    share_kafka: str, tmp_path: Path, consumers: int, ordering: str
) -> None:
    o = await run_share_killer(
        share_kafka, tmp_path, delay_s=0.3, consumers=consumers, ordering=ordering
    )
    check(o, f"300 ms, {consumers} consumers, ordering {ordering}")
