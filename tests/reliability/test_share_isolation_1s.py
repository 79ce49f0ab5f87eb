"""Share engine crash isolation, app holding each record 1 s (tests/reliability/share_killer.py), and
a pass with more suspects than one lock can answer one at a time (15 s lock, 1 s per answer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.share_killer import check, run_share_killer


@pytest.mark.parametrize("ordering", ["none", "key"])
@pytest.mark.parametrize("consumers", [4, 1])
async def test_share_killer_alone_in_dlq_1s_app(
    share_kafka: str, tmp_path: Path, consumers: int, ordering: str
) -> None:
    o = await run_share_killer(
        share_kafka, tmp_path, delay_s=1.0, consumers=consumers, ordering=ordering
    )
    check(
        o,
        f"1 s, {consumers} consumers, ordering {ordering}",
        max_innocent_count=2 if consumers == 1 else 1,
    )


async def test_share_pass_with_more_suspects_than_one_lock(
    share_kafka: str, tmp_path: Path
) -> None:
    """One partition, one share consumer, 1 s per answer: the suspects of one acquisition do not all
    fit one 15 s lock; those without a turn go back to the broker unsent, and nothing changes.

    Before any death, 30 records in one acquisition do not fit one lock either: the one at the app
    when it ends is an attempt (count 2 next time), those not sent yet are released unsent."""
    o = await run_share_killer(
        share_kafka, tmp_path, delay_s=1.0, consumers=1, ordering="none", n=30, partitions=1
    )
    check(o, "1 s, 1 consumer, 1 partition", max_innocent_count=2)
    joined = "\n".join(o.logs)
    assert "released unsent" in joined, joined[-3000:]
