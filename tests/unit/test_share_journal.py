"""The share engine's journal of deaths (sidecar.engines.share_journal): counts after a death."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from sidecar.engines.share_journal import (
    ALONE,
    ANSWERED,
    DEFERRED,
    DONE,
    RELEASED,
    UNSENT,
    Entry,
    Recovery,
    ShareJournal,
    counted,
)

A = ("t", 0, 10)
B = ("t", 0, 11)
C = ("t", 1, 5)


def _open(path: Path, group: str = "g", consumers: int = 4) -> tuple[ShareJournal, Recovery]:
    return ShareJournal.open(str(path), group, consumers)


def test_a_death_charges_only_the_record_alone(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j, rec = _open(path)
    assert j.active and not rec.died
    j.acquired([(A, 1, 1), (B, 1, 1), (C, 1, 1)])
    j.settled([(C, ANSWERED)])  # answered before the death: not a suspect
    j.settled([(A, ALONE)])
    j.close()
    # SIGKILL: no clean stop. The broker charged all three, several times over.
    j2, rec2 = _open(path)
    assert rec2.died
    assert set(rec2.held) == {A, B}
    assert counted(j2.entries[A], 5) == 2  # alone at the death: charged once
    assert counted(j2.entries[B], 5) == 1  # held: not charged
    assert counted(j2.entries[C], 5) == 1  # answered: not charged, not a suspect
    assert j2.entries[A].suspect and j2.entries[B].suspect and not j2.entries[C].suspect
    j2.close()


def test_released_counts_and_unsent_does_not(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j, _ = _open(path)
    j.acquired([(A, 1, 1), (B, 1, 1), (C, 1, 1)])
    j.settled([(A, RELEASED), (B, UNSENT), (C, DEFERRED)])
    assert counted(j.entries[A], 2) == 2
    assert counted(j.entries[B], 2) == 1
    assert counted(j.entries[C], 2) == 1
    # A suspect released unsent stays one; a record released unsent otherwise is not.
    assert j.entries[C].suspect and not j.entries[B].suspect and not j.entries[A].suspect
    # Another replica delivered them twice in between: those count (no death here).
    assert counted(j.entries[A], 4) == 4
    assert counted(j.entries[B], 4) == 3
    j.close()


def test_a_clean_stop_leaves_no_suspects(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j, _ = _open(path)
    j.acquired([(A, 1, 1)])
    j.closed_cleanly()
    j2, rec = _open(path)
    assert not rec.died
    assert not j2.entries[A].suspect
    assert counted(j2.entries[A], 2) == 1  # released by the close, unsent
    j2.close()


def test_done_records_are_forgotten_and_deaths_carry_over(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j, _ = _open(path)
    j.acquired([(A, 1, 1), (B, 2, 2)])
    j.settled([(A, DONE)])
    j.close()
    j2, _ = _open(path)  # died
    assert A not in j2.entries
    j2.close()
    # Died again before B came back: still not charged for either death.
    j3, rec = _open(path)
    assert rec.died and B in rec.held
    assert counted(j3.entries[B], 9) == 2
    j3.close()


def test_no_entry_is_the_broker_count() -> None:
    assert counted(None, 4) == 4
    assert counted(Entry(3, 1, ALONE, 0, died=True), 1) == 1  # never above the broker's


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not found"),
        (b"garbage\n", "not a journal"),
        (b"J1 other-group\nI 1 4\na t 0 10 1 1\n", "belongs to group 'other-group'"),
    ],
)
def test_unusable_journal_logs_and_counts_by_the_broker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes | None, message: str
) -> None:
    path = tmp_path / "j"
    if content is not None:
        path.write_bytes(content)
    with caplog.at_level(logging.WARNING, "sidecar.share"):
        j, rec = _open(path)
    assert j.active and not rec.died
    assert not j.entries  # everything counted by the broker
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and message in lines[0], lines
    j.close()
    assert path.read_text().startswith("J1 g\n")  # a fresh journal replaced it


def test_bad_lines_are_ignored_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j"
    path.write_text(
        "J1 g\nI 1 4\na t 0 10 1 1\nq nonsense\na t 0 x 1 1\nk t 9 9\na t 0 11 2 2\na t 0"
    )
    with caplog.at_level(logging.WARNING, "sidecar.share"):
        j, rec = _open(path)
    assert set(j.entries) == {A, B}  # the torn last line is a cut write, not an error
    bad = [r.getMessage() for r in caplog.records if "do not parse" in r.getMessage()]
    assert len(bad) == 1 and "3 lines" in bad[0], bad
    assert rec.died
    j.close()


def test_unwritable_path_is_inactive(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "sidecar.share"):
        j, _ = _open(tmp_path / "missing-dir" / "j")
    assert not j.active
    assert any("cannot be written" in r.getMessage() for r in caplog.records)


def test_deaths_in_a_row_add_up_until_a_clean_stop(tmp_path: Path) -> None:
    """What a record the journal never saw may have been charged: one per consumer and death."""
    path = tmp_path / "j"
    j, rec = _open(path, consumers=4)
    assert rec.allowance == 0
    j.close()  # died
    j, rec = _open(path, consumers=4)
    assert rec.allowance == 4
    j.close()  # died again (the file was compacted: carried in its incarnation line)
    j, rec = _open(path, consumers=4)
    assert rec.allowance == 8
    j.closed_cleanly()
    j, rec = _open(path, consumers=4)
    assert rec.allowance == 0
    j.close()
