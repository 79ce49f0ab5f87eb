"""Share engine crash isolation, app holding each record 1 s, four share consumers."""

from __future__ import annotations

from pathlib import Path

from tests.reliability.share_killer import check, run_share_killer


async def test_share_killer_alone_in_dlq_1s_app(bootstrap: str, tmp_path: Path) -> None:
    o = await run_share_killer(bootstrap, tmp_path, delay_s=1.0, consumers=4, ordering="none")
    check(o, "1 s, 4 consumers, ordering none")
