"""The share engine's journal of deaths (sidecar.engines.share.journal): counts after a death."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.config import JOURNAL_AUTO, parse_config
from sidecar.engines.share.journal import (
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
    default_journal_path,
    journal_path,
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


def test_an_answer_is_written_with_the_next_write_or_the_close(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j, _ = _open(path)
    j.acquired([(A, 1, 1), (B, 1, 1), (C, 1, 1)])
    j.answered(A, ANSWERED)
    j.answered(("t", 9, 9), ANSWERED)  # not in the journal: nothing to note
    assert j.entries[A].state == ANSWERED
    assert f"{ANSWERED} t 0 10\n" not in path.read_text()  # no write a record
    j.settled([(B, RELEASED)])  # the next write carries it, before its own lines
    text = path.read_text()
    assert text.endswith(f"{ANSWERED} t 0 10\n{RELEASED} t 0 11\n")
    assert "t 9 9" not in text
    j.answered(C, ANSWERED)
    j.close()  # not a clean stop: the answer still reaches the file
    assert path.read_text().endswith(f"{ANSWERED} t 1 5\n")
    j2, rec = _open(path)
    j2.close()
    # Answered before the death: neither is a suspect.
    assert rec.died and not j2.entries[C].suspect and not j2.entries[A].suspect


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
    (tmp_path / "a-file").write_text("")  # its directory cannot be created
    with caplog.at_level(logging.WARNING, "sidecar.share"):
        j, _ = _open(tmp_path / "a-file" / "j")
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


# -- where the journal lives, and one sidecar per journal ---------------------------------------


def test_the_default_path_is_named_after_the_group_under_the_state_directory() -> None:
    env = {"XDG_STATE_HOME": "/state", "HOME": "/home/u"}
    assert default_journal_path("orders-app", env) == "/state/dlq-sidecar/share-journal-orders-app"
    # No XDG_STATE_HOME, or a relative one (the XDG spec says to ignore it): ~/.local/state.
    for env in ({"HOME": "/home/u"}, {"XDG_STATE_HOME": "rel", "HOME": "/home/u"}):
        assert default_journal_path("g", env) == "/home/u/.local/state/dlq-sidecar/share-journal-g"
    # A group id that is not a plain file name: made one, with a hash so two groups never meet.
    a, b = default_journal_path("a/b", env), default_journal_path("a_b", env)
    assert (
        a.startswith("/home/u/.local/state/dlq-sidecar/share-journal-a_b-")
        and "/" not in (a.rsplit("/", 1)[1])
    )
    assert b.endswith("/share-journal-a_b") and a != b
    assert len(default_journal_path("x" * 300, env).rsplit("/", 1)[1]) < 140


def test_the_setting_names_the_path_auto_derives_it_and_null_turns_it_off() -> None:
    env = {"XDG_STATE_HOME": "/state"}
    assert journal_path(JOURNAL_AUTO, "g", env) == "/state/dlq-sidecar/share-journal-g"
    assert journal_path("/var/lib/j", "g", env) == "/var/lib/j"
    assert journal_path(None, "g", env) is None


def test_config_default_is_auto_and_an_explicit_null_is_off(tmp_path: Path) -> None:
    base = {
        "engine": "share",
        "ordering": "none",
        "kafka": {"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"},
        "source": {"topics": ["t"]},
        "app": {"url": "http://127.0.0.1:8080/"},
    }
    assert parse_config(base, env={}).delivery.journal_path == JOURNAL_AUTO
    off = parse_config({**base, "share.journal.path": None}, env={})
    assert off.delivery.journal_path is None


def test_the_default_directory_is_created_if_missing(tmp_path: Path) -> None:
    path = default_journal_path("g", {"XDG_STATE_HOME": str(tmp_path / "state")})
    j, _rec = ShareJournal.open(path, "g", 1)
    try:
        assert j.active
        assert Path(path).is_file()
        assert (tmp_path / "state" / "dlq-sidecar").is_dir()
    finally:
        j.closed_cleanly()


_HOLDER = """
import sys
from sidecar.engines.share.journal import ShareJournal
journal, _ = ShareJournal.open(sys.argv[1], "g", 1)
print("active" if journal.active else "inactive", flush=True)
sys.stdin.read()  # hold it until the test closes our stdin
journal.closed_cleanly()
"""


def test_a_second_sidecar_of_the_group_on_the_host_runs_without_the_journal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Another process holds the group's journal: this one logs one line and runs without one
    (the broker's counts); once the other has closed it, it is this one's."""
    path = str(tmp_path / "state" / "share-journal-g")
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, path],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=str(Path(__file__).resolve().parents[2]),
    ) as holder:
        _second_is_locked_out(holder, path, caplog)
    third, rec = ShareJournal.open(path, "g", 4)
    try:
        assert third.active and not rec.died  # the holder stopped cleanly
    finally:
        third.closed_cleanly()


def _second_is_locked_out(
    holder: subprocess.Popen[bytes], path: str, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == b"active"
        with caplog.at_level(logging.WARNING, logger="sidecar.share"):
            second, rec = ShareJournal.open(path, "g", 4)
        assert not second.active and not rec.died
        assert second.failed == "in use by another sidecar"
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "in use by another sidecar on this host" in lines[0], lines
        # The holder's journal is untouched (the second never wrote to it).
        assert Path(path).read_text().startswith("J1 g\nI ")
        holder.stdin.close()
        assert holder.wait(30) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_the_lock_is_dropped_when_the_journal_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "j"
    first, _ = _open(path)
    second, _ = _open(path)  # the same process, another open file: locked out too
    assert first.active and not second.active
    first.close()  # a death: the kernel drops the lock with the process
    third, rec = _open(path)
    assert third.active and rec.died
    third.closed_cleanly()
