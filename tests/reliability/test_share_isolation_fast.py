"""Share engine crash isolation, app answering in 10 ms (tests/reliability/share_killer.py), and an
unusable journal at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.share_killer import check, run_share_killer, run_with_journal


@pytest.mark.parametrize("ordering", ["none", "key"])
@pytest.mark.parametrize("consumers", [4, 1])
async def test_share_killer_alone_in_dlq_fast_app(
    share_kafka: str, tmp_path: Path, consumers: int, ordering: str
) -> None:
    o = await run_share_killer(
        share_kafka, tmp_path, delay_s=0.01, consumers=consumers, ordering=ordering
    )
    check(o, f"10 ms, {consumers} consumers, ordering {ordering}")
    # The first start found no journal and said so.
    assert "not found, starting a new one" in o.logs[0]


@pytest.mark.parametrize(
    ("content", "line"),
    [
        (b"\x00\xff not a journal\n", "not a journal (its first line does not parse)"),
        (b"J1 some-other-group\nI 1 4\na t 0 1 1 1\n", "belongs to group 'some-other-group'"),
        (b"J1 {group}\nI 1 4\na t 0 1 1 1\nnonsense here\n", "1 lines do not parse"),
    ],
    ids=["corrupt", "other-group", "bad-lines"],
)
async def test_unusable_journal_is_logged_and_loses_nothing(
    share_kafka: str, tmp_path: Path, content: bytes, line: str
) -> None:
    """One clear log line, the broker's counts for what it cannot tell, and no record lost."""
    produced, accepted, log = await run_with_journal(share_kafka, tmp_path, content)
    assert accepted == produced == 20
    assert sum(line in text for text in log.splitlines()) == 1, log[-3000:]
