"""`SourcePointers` and `PayloadWatch`: headers-only DLQ records counted once their source offset is deleted.

Plain asserts and a Hypothesis property (the count never exceeds what was written, and an offset is
counted gone exactly when some log start passed it), then the watch's counters and its log line.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.pointers import SourcePointers
from sidecar.engines.interfaces import Counters
from sidecar.engines.payload_watch import PayloadWatch


def test_offsets_below_the_log_start_are_gone_once() -> None:
    p = SourcePointers()
    for offset in (5, 1, 3, 9):
        assert p.written("orders", 0, offset)
    p.written("orders", 1, 2)
    p.written("payments", 0, 7)
    assert p.partitions() == [("orders", 0), ("orders", 1), ("payments", 0)]
    assert p.log_starts({("orders", 0): 4, ("payments", 0): 7}) == {"orders": 2}
    assert p.gone == {"orders": 2}
    assert p.watched == 4
    # A log start read again, or an older one, counts nothing twice.
    assert p.log_starts({("orders", 0): 4, ("orders", 1): 0}) == {}
    assert p.log_starts({("orders", 0): 10, ("orders", 1): 3, ("payments", 0): 8}) == {
        "orders": 3,
        "payments": 1,
    }
    assert p.gone == {"orders": 5, "payments": 1}
    assert p.watched == 0 and p.partitions() == []  # nothing left to ask about


def test_the_bound_holds_and_counts_what_it_leaves_out() -> None:
    p = SourcePointers(max_pointers=2)
    assert p.written("t", 0, 1) and p.written("t", 0, 2)
    assert not p.written("t", 0, 3)
    assert p.untracked == 1 and p.watched == 2
    p.log_starts({("t", 0): 2})
    assert p.written("t", 0, 4)  # room again once one is gone
    with pytest.raises(ValueError, match="max_pointers"):
        SourcePointers(max_pointers=-1)


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50)), max_size=60),
    st.lists(st.dictionaries(st.integers(0, 2), st.integers(0, 60)), max_size=6),
)
def test_an_offset_is_counted_gone_exactly_when_a_log_start_passed_it(
    written: list[tuple[int, int]], starts: list[dict[int, int]]
) -> None:
    p = SourcePointers()
    for partition, offset in written:
        p.written("t", partition, offset)
    highest: dict[int, int] = {}
    for round_ in starts:
        p.log_starts({("t", part): start for part, start in round_.items()})
        for part, start in round_.items():
            highest[part] = max(highest.get(part, 0), start)
    expected = sum(1 for part, off in written if off < highest.get(part, 0))
    assert p.gone.get("t", 0) == expected
    assert p.watched == len(written) - expected


def test_the_watch_counts_per_topic_and_says_so_once_per_loss(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counters = Counters()
    watch = PayloadWatch(counters, 60.0, SourcePointers(max_pointers=3))
    for offset in range(4):
        watch.written("orders", 0, offset)
    assert counters.headers_only_watched == 3
    assert "further ones are not" in caplog.text
    with caplog.at_level(logging.WARNING, logger="sidecar.engine"):
        watch.update({("orders", 0): 2})
    assert counters.source_deleted == {"orders": 2}
    assert counters.headers_only_watched == 1
    assert "2 headers-only DLQ records of source topic orders now point at deleted" in caplog.text
    watch.update({("orders", 0): 2})
    assert counters.source_deleted == {"orders": 2}
