"""After an abort, the DLQ partitions' last stable offset must pass the log end seen right after it; a
partition that stays short (an ABORT marker the broker skipped, KAFKA-20734) gets an abort-only
transaction. The decision logic, with the broker's offsets played by a fake; the real path is in
tests/integration/test_dlq_txn.py and the broker-pause scenario. Time is trio's autojump clock: the settle
waits are virtual, so "not waited on" holds however busy the machine is."""

from __future__ import annotations

import logging

import pytest
import trio
from trio.testing import MockClock

from sidecar.kafka import dlq
from sidecar.kafka.dlq import txn as dlq_txn

TP0, TP1 = ("dlq.t", 0), ("dlq.t", 1)


class FakeOffsets:
    """Log ends and last stable offsets of DLQ partitions; an abort-only transaction may fix some."""

    def __init__(self, ends: dict[tuple[str, int], int], stable: dict[tuple[str, int], int]):
        self.ends = ends
        self.stable = stable
        self.abort_only_calls: list[list[tuple[str, int]]] = []
        self.repairs = True  # whether an abort-only transaction writes the missing marker
        self.unreadable = False
        # How long reading the log ends takes (a leader that comes back late).
        self.ends_take_s = 0.0

    async def log_ends(
        self, parts: list[tuple[str, int]], *, committed: bool, deadline: float
    ) -> dict[tuple[str, int], int] | None:
        if self.unreadable:
            return None
        if not committed:
            await trio.sleep(self.ends_take_s)
        source = self.stable if committed else self.ends
        return {tp: source[tp] for tp in parts}

    async def abort_only(self, parts: list[tuple[str, int]]) -> None:
        self.abort_only_calls.append(list(parts))
        if self.repairs:
            for tp in parts:
                # The probe and the marker: the log grows by two, the stable offset passes both.
                self.ends[tp] += 2
                self.stable[tp] = self.ends[tp]


@pytest.fixture
def writer(monkeypatch: pytest.MonkeyPatch) -> dlq.DlqWriter:
    monkeypatch.setattr(dlq_txn, "ABORT_SETTLE_S", 0.3)
    return dlq.DlqWriter(
        {"bootstrap.servers": "127.0.0.1:9"},
        group="g",
        copy_record=False,
        stacktrace_max_bytes=0,
        retries_timeout_ms=1000,
        auto_create=False,
        topic_partitions=2,
        topic_replication_factor=1,
    )


def _wire(writer: dlq.DlqWriter, fake: FakeOffsets, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer, "_log_ends", fake.log_ends)
    monkeypatch.setattr(writer, "_abort_only", fake.abort_only)


async def test_settled_partitions_need_nothing(
    writer: dlq.DlqWriter, monkeypatch: pytest.MonkeyPatch, autojump_clock: MockClock
) -> None:
    fake = FakeOffsets({TP0: 10, TP1: 4}, {TP0: 10, TP1: 4})
    _wire(writer, fake, monkeypatch)
    t0 = trio.current_time()
    await writer._check_abort_markers({TP0, TP1})
    assert fake.abort_only_calls == []
    assert writer.abort_markers_repaired == 0
    assert trio.current_time() - t0 < 0.2, "a settled partition is not waited on"


async def test_a_skipped_marker_is_written_by_an_abort_only_transaction(
    writer: dlq.DlqWriter,
    monkeypatch: pytest.MonkeyPatch,
    autojump_clock: MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # TP1's ABORT marker is missing: its stable offset stays at the aborted record (7 < end 9).
    fake = FakeOffsets({TP0: 10, TP1: 9}, {TP0: 10, TP1: 7})
    _wire(writer, fake, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="sidecar.dlq"):
        await writer._check_abort_markers({TP0, TP1})
    assert fake.abort_only_calls == [[TP1]]
    assert writer.abort_markers_repaired == 1
    assert "KAFKA-20734" in caplog.text
    assert fake.stable[TP1] >= 9


async def test_another_producers_transaction_that_ends_is_waited_out(
    writer: dlq.DlqWriter, monkeypatch: pytest.MonkeyPatch, autojump_clock: MockClock
) -> None:
    fake = FakeOffsets({TP0: 10}, {TP0: 6})

    async def other_producer_commits() -> None:
        await trio.sleep(0.1)
        fake.stable[TP0] = 12

    _wire(writer, fake, monkeypatch)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_producer_commits)
        await writer._check_abort_markers({TP0})
    assert fake.abort_only_calls == []


async def test_a_partition_that_never_settles_is_reported_and_given_up(
    writer: dlq.DlqWriter,
    monkeypatch: pytest.MonkeyPatch,
    autojump_clock: MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeOffsets({TP0: 10}, {TP0: 3})
    fake.repairs = False
    _wire(writer, fake, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="sidecar.dlq"):
        await writer._check_abort_markers({TP0})
    assert len(fake.abort_only_calls) == dlq.ABORT_REPAIR_ROUNDS
    assert any(
        r.levelno == logging.ERROR and "still hold an open transaction" in r.getMessage()
        for r in caplog.records
    )


async def test_unreadable_offsets_leave_the_partition_to_check_again(
    writer: dlq.DlqWriter,
    monkeypatch: pytest.MonkeyPatch,
    autojump_clock: MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeOffsets({TP0: 10}, {TP0: 3})
    fake.unreadable = True
    _wire(writer, fake, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="sidecar.dlq"):
        await writer._check_abort_markers({TP0})
    assert fake.abort_only_calls == []
    assert "checked before the next DLQ record goes to them" in caplog.text
    assert writer._unchecked == {TP0}
    # Once the offsets can be read, the check is done (and the marker repaired): nothing is left.
    fake.unreadable = False
    await writer._check_abort_markers({TP0} | writer._unchecked)
    assert fake.abort_only_calls == [[TP0]]
    assert writer._unchecked == set()


class _Answer:
    def __init__(self, offset: int) -> None:
        self.offset = offset

    def result(self, timeout: float) -> _Answer:
        return self


class _FakeAdmin:
    """list_offsets answers -1 (no offset, no error) the first `blank` times, then 7."""

    def __init__(self, blank: int) -> None:
        self.blank = blank
        self.calls = 0

    def list_offsets(self, request: dict[object, object], **_: object) -> dict[object, _Answer]:
        self.calls += 1
        offset = -1 if self.calls <= self.blank else 7
        return {tp: _Answer(offset) for tp in request}


async def test_an_offset_of_minus_one_is_asked_again_not_taken_as_the_end(
    writer: dlq.DlqWriter, monkeypatch: pytest.MonkeyPatch, autojump_clock: MockClock
) -> None:
    # A target of -1 would pass any stable offset: the check would find every partition settled.
    admin = _FakeAdmin(blank=2)
    monkeypatch.setattr(writer, "admin", lambda: admin)
    ends = await writer._log_ends([TP0], committed=False, deadline=trio.current_time() + 10)
    assert ends == {TP0: 7}
    assert admin.calls == 3


async def test_offsets_that_stay_unknown_leave_the_partition_unread(
    writer: dlq.DlqWriter, monkeypatch: pytest.MonkeyPatch, autojump_clock: MockClock
) -> None:
    admin = _FakeAdmin(blank=10**6)
    monkeypatch.setattr(writer, "admin", lambda: admin)
    ends = await writer._log_ends([TP0], committed=False, deadline=trio.current_time() + 3)
    assert ends is None
    assert admin.calls > 1


async def test_a_partition_found_open_after_the_whole_budget_is_still_repaired(
    writer: dlq.DlqWriter, monkeypatch: pytest.MonkeyPatch, autojump_clock: MockClock
) -> None:
    # Its leader came back just before the budget ran out: the check finds the aborted records open
    # past the deadline. Giving up there would leave them for the next commit to make visible.
    fake = FakeOffsets({TP0: 10}, {TP0: 8})
    fake.ends_take_s = dlq_txn.ABORT_CHECK_BUDGET_S - 0.1
    _wire(writer, fake, monkeypatch)
    await writer._check_abort_markers({TP0})
    assert fake.abort_only_calls == [[TP0]]
    assert writer.abort_markers_repaired == 1
