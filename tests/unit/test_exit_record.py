"""The exit record (sidecar.service.exits): starts and fatal exits survive a new process.

Each "process" is a fresh ExitRecord.open of the same file, as a restarted container reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from sidecar.service.exits import (
    DLQ_STARTUP_FAILED,
    DLQ_WRITE_FAILED,
    OTHER,
    ExitCollector,
    ExitRecord,
    fatal_reason,
)


def exposition(record: ExitRecord, lost: dict[str, int] | None = None) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExitCollector(record, ("orders", "payments"), lambda: dict(lost or {})))
    return generate_latest(registry).decode()


def test_a_fatal_exit_shows_in_the_next_process(tmp_path: Path) -> None:
    path = str(tmp_path / "exit-record")
    first = ExitRecord.open(path)
    first.started()
    text = exposition(first)
    assert "dlq_sidecar_restarts_total 0.0" in text
    assert 'dlq_sidecar_fatal_exits_total{reason="dlq_write_failed"} 0.0' in text
    first.failed(DLQ_WRITE_FAILED, now=1_700_000_000.0)

    second = ExitRecord.open(path)
    second.started()
    text = exposition(second)
    assert "dlq_sidecar_restarts_total 1.0" in text
    assert 'dlq_sidecar_fatal_exits_total{reason="dlq_write_failed"} 1.0' in text
    assert 'dlq_sidecar_fatal_exits_total{reason="other"} 0.0' in text
    assert (
        'dlq_sidecar_last_fatal_exit_timestamp_seconds{reason="dlq_write_failed"} 1.7e+09' in text
    )
    second.failed(DLQ_WRITE_FAILED, now=1_700_000_300.0)

    third = ExitRecord.open(path)
    third.started()  # e.g. after an OOM kill: a start with no fatal exit recorded
    third.started()
    text = exposition(third)
    assert "dlq_sidecar_restarts_total 3.0" in text
    assert 'dlq_sidecar_fatal_exits_total{reason="dlq_write_failed"} 2.0' in text
    assert json.loads(Path(path).read_text())["exits"]["dlq_write_failed"]["last_at"] == (
        1_700_000_300.0
    )


def test_an_unreadable_record_starts_over_and_an_unwritable_one_is_no_failure(
    tmp_path: Path,
) -> None:
    path = tmp_path / "exit-record"
    path.write_text("{not json")
    record = ExitRecord.open(str(path))
    assert record.starts == 0 and record.exits == {}
    record.started()
    assert json.loads(path.read_text())["starts"] == 1
    missing_dir = ExitRecord.open(str(tmp_path / "no-such-dir" / "exit-record"))
    missing_dir.started()  # logs a warning, raises nothing
    missing_dir.failed(OTHER)
    assert missing_dir.starts == 1


def test_the_reason_of_a_fatal_exit() -> None:
    assert fatal_reason(0, startup=True) == DLQ_STARTUP_FAILED
    assert fatal_reason(3) == DLQ_WRITE_FAILED
    assert fatal_reason(0) == OTHER


def test_losses_add_up_over_the_processes_of_a_pod(tmp_path: Path) -> None:
    """Records the broker archived without a DLQ record stay counted after a restart (the loss alert)."""
    path = str(tmp_path / "exit-record")
    first = ExitRecord.open(path)
    first.started()
    text = exposition(first)
    assert 'dlq_sidecar_pod_broker_archived_without_dlq_total{topic="orders"} 0.0' in text
    assert 'dlq_sidecar_pod_broker_archived_without_dlq_total{topic="payments"} 0.0' in text
    text = exposition(first, {"orders": 3})
    assert 'dlq_sidecar_pod_broker_archived_without_dlq_total{topic="orders"} 3.0' in text

    second = ExitRecord.open(path)  # e.g. after an OOM kill: this process's count starts at 0
    second.started()
    assert 'dlq_sidecar_pod_broker_archived_without_dlq_total{topic="orders"} 3.0' in exposition(
        second
    )
    text = exposition(second, {"orders": 1, "payments": 2})
    assert 'dlq_sidecar_pod_broker_archived_without_dlq_total{topic="orders"} 4.0' in text
    assert 'dlq_sidecar_pod_broker_archived_without_dlq_total{topic="payments"} 2.0' in text
    assert json.loads(Path(path).read_text())["lost"] == {"orders": 4, "payments": 2}
