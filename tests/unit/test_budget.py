"""The byte budget (`max.buffered.bytes`): its split, what a record costs, the ledger's accounting
and the pause/resume rule, and the key's validation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.config import ConfigError, parse_config
from sidecar.core.budget import (
    DEFAULT_BUFFERED_BYTES,
    RECORD_OVERHEAD_BYTES,
    BudgetError,
    record_bytes,
    split_budget,
)
from sidecar.core.ledger import Ack, LedgerConfig, Ordering, PartitionLedger
from sidecar.core.record import SourceRecord
from tests.unit.test_config import MINIMAL, patched

MiB = 2**20


def record(key: bytes | None, value: bytes | None, headers: tuple = ()) -> SourceRecord:
    return SourceRecord("t", 0, 0, key, value, headers, None, "none")


# -- the split ---------------------------------------------------------------------------------


def test_the_default_split_derives_librdkafkas_prefetch() -> None:
    budget = split_budget(DEFAULT_BUFFERED_BYTES, {})
    assert budget.derived == {
        "queued.max.messages.kbytes": 16384,
        "queued.min.messages": 16384,  # one message per KiB of the queue's part
        "fetch.max.bytes": 8 * MiB,
    }
    assert budget.prefetch_bytes == 16 * MiB and budget.fetch_bytes == 8 * MiB
    assert budget.buffer_bytes == 40 * MiB  # 64 - 16 - 8
    assert budget.share_bytes(6) == 40 * MiB // 6
    assert budget.share_bytes(0) == 40 * MiB  # nothing assigned yet


def test_what_the_user_sets_is_kept_and_counted() -> None:
    budget = split_budget(
        64 * MiB,
        {"queued.max.messages.kbytes": "4096", "fetch.max.bytes": 2**20, "queued.min.messages": 9},
    )
    assert budget.derived == {}
    assert budget.buffer_bytes == 64 * MiB - 4 * MiB - 1 * MiB
    partly = split_budget(64 * MiB, {"queued.max.messages.kbytes": 1024})
    assert partly.derived == {"queued.min.messages": 1024, "fetch.max.bytes": 8 * MiB}


def test_a_prefetch_that_leaves_the_buffer_too_little_is_refused() -> None:
    with pytest.raises(BudgetError) as info:
        split_budget(64 * MiB, {"queued.max.messages.kbytes": 65536})
    assert info.value.key == "max.buffered.bytes"
    assert "kafka.queued.max.messages.kbytes 65536 KiB" in info.value.reason


@given(st.integers(16 * MiB, 2**40), st.integers(1, 10_000))
@settings(max_examples=200)
def test_the_parts_never_exceed_the_total(total: int, partitions: int) -> None:
    budget = split_budget(total, {})
    assert budget.prefetch_bytes + budget.fetch_bytes + budget.buffer_bytes == total
    assert budget.buffer_bytes >= total // 2
    assert 1 <= budget.share_bytes(partitions) * partitions <= max(partitions, budget.buffer_bytes)


def test_a_record_costs_its_bytes_twice_and_the_overhead() -> None:
    assert record_bytes(record(None, None)) == RECORD_OVERHEAD_BYTES
    full = record(b"k" * 10, b"v" * 1000, (("h1", b"x" * 5), ("h2", None)))
    # The record, and the copy its HTTP request makes while it is in flight.
    assert record_bytes(full) == RECORD_OVERHEAD_BYTES + 2 * (10 + 1000 + 2 + 5 + 2)


# -- the ledger's accounting -------------------------------------------------------------------


def ledger(**kwargs: object) -> PartitionLedger:
    return PartitionLedger("t", 0, 0, LedgerConfig(ordering=Ordering.NONE, **kwargs))  # type: ignore[arg-type]


def test_bytes_are_held_until_the_record_is_done() -> None:
    led = ledger(delivery_count_limit=1)
    for offset in range(4):
        assert led.add(offset, None, None, 0, 100 + offset)
    assert led.buffered_bytes == 406 == led.statistics().buffered_bytes
    a, b, c, _d = led.acquire(0, 4)
    assert led.buffered_bytes == 406  # in flight is still held
    led.answer(a.attempt_id, Ack.ACCEPT, 0)
    assert led.buffered_bytes == 306
    led.answer(b.attempt_id, Ack.RELEASE, 0)  # at the limit: archiving, still held
    assert led.buffered_bytes == 306
    (req,) = led.to_archive()
    led.dlq_written(req.offset)
    assert led.buffered_bytes == 205
    led.answer(c.attempt_id, Ack.REJECT, 0)
    (req,) = led.to_archive()
    led.dlq_written(req.offset)
    assert led.buffered_bytes == 103


def test_records_not_kept_cost_nothing() -> None:
    led = ledger()
    assert led.add(5, None, None, 0, 100)
    assert not led.add(5, None, None, 0, 100)  # a re-fetch
    assert not led.add(3, None, None, 0, 100)  # below the last added
    assert led.buffered_bytes == 100
    with pytest.raises(ValueError, match="size_bytes"):
        led.add(6, None, None, 0, -1)
    assert led.buffered_bytes == 100 and led.buffered == 1


def test_pause_at_the_share_and_resume_at_half_of_it() -> None:
    led = ledger()
    for offset in range(9):
        led.add(offset, None, None, 0, 100)
    assert not led.update_paused(1000)  # 900 of 1000
    led.add(9, None, None, 0, 100)
    assert led.should_pause(1000) and led.update_paused(1000)
    assert not led.should_pause()  # without a share only the record count counts
    attempts = led.acquire(0, 10)
    for attempt in attempts[:4]:
        led.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    assert led.update_paused(1000)  # 600 held: not yet down to half
    led.answer(attempts[4].attempt_id, Ack.ACCEPT, 0)
    assert led.may_resume(1000) and not led.update_paused(1000)


def test_a_record_larger_than_the_share_is_delivered_then_the_partition_resumes() -> None:
    led = ledger()
    assert led.add(0, None, "huge", 0, 5000)
    assert led.should_pause(1000)  # paused at intake, but the record is held, not refused
    (attempt,) = led.acquire(0, 10)
    assert attempt.item == "huge"
    assert not led.may_resume(1000)
    led.answer(attempt.attempt_id, Ack.ACCEPT, 0)
    assert led.buffered_bytes == 0 and led.may_resume(1000)


def test_the_record_count_stays_a_second_limit() -> None:
    led = ledger(max_buffered_records=4)
    for offset in range(4):
        led.add(offset, None, None, 0, 1)
    assert led.should_pause(10**9)  # bytes far under the share, count at its bound


# -- the key -----------------------------------------------------------------------------------


def test_the_key_defaults_to_64_mib() -> None:
    assert parse_config(MINIMAL, env={}).delivery.max_buffered_bytes == 64 * MiB


@pytest.mark.parametrize(
    ("patch", "path", "reason"),
    [
        ({"max.buffered.bytes": 1024}, "max.buffered.bytes", "16777216..1099511627776"),
        ({"max.buffered.bytes": "lots"}, "max.buffered.bytes", "expected an integer"),
        (
            {"kafka": {"fetch.max.bytes": 60 * MiB}},
            "max.buffered.bytes",
            "kafka.fetch.max.bytes 62914560",
        ),
    ],
)
def test_bad_values_name_the_key(patch: dict, path: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(patched(patch), env={})
    assert info.value.path == path
    assert reason in info.value.reason


def test_the_share_engine_bounds_each_consumers_fetch_unless_the_user_did() -> None:
    from sidecar.kafka.share import share_consumer_properties

    props = share_consumer_properties({"group.id": "g"}, 8 * MiB)
    assert props["fetch.max.bytes"] == 8 * MiB
    assert "queued.max.messages.kbytes" not in props  # a share consumer refuses it
    mine = share_consumer_properties({"group.id": "g", "fetch.max.bytes": 1000}, 8 * MiB)
    assert mine["fetch.max.bytes"] == 1000
