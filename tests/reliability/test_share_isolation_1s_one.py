"""Share engine crash isolation, app holding each record 1 s, one share consumer, one partition:
a pass with more suspects than one lock can answer one at a time (15 s lock, 1 s per answer)."""

from __future__ import annotations

from pathlib import Path

from tests.reliability.share_killer import check, run_share_killer


async def test_share_pass_with_more_suspects_than_one_lock(bootstrap: str, tmp_path: Path) -> None:
    o = await run_share_killer(
        bootstrap, tmp_path, delay_s=1.0, consumers=1, ordering="key", n=30, partitions=1
    )
    check(o, "1 s, 1 consumer, 1 partition, ordering key")
    joined = "\n".join(o.logs)
    # Suspects without a turn before the lock expires went back to the broker unsent, not held.
    assert "released unsent" in joined, joined[-3000:]
