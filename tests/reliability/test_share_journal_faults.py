"""The share engine's journal of deaths (`share.journal.path`) unusable at start-up: one clear log
line, the broker's counts for what it cannot tell, and no record lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.share_killer import run_with_journal


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
    bootstrap: str, tmp_path: Path, content: bytes, line: str
) -> None:
    produced, accepted, log = await run_with_journal(bootstrap, tmp_path, content)
    assert accepted == produced == 20
    assert sum(line in text for text in log.splitlines()) == 1, log[-3000:]
