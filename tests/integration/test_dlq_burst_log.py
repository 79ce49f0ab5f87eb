"""Dead-lettering is said in the log by default: one line per burst of DLQ writes, with the topic, the
count, the reasons and the top exception classes, never a payload or a key (real broker, real app)."""

from __future__ import annotations

from pathlib import Path

from sidecar.http.server import Response
from tests.harness import Delivery, RecordingApp, json_answer, running_sidecar
from tests.kafkatools import Broker, Rec

N_VALIDATION, N_TIMEOUT, N_OTHER = 20, 8, 2


def _reject_by_value(d: Delivery) -> Response:
    value = d.value or b""
    name = value.split(b"|")[0].decode()
    return json_answer({"ack": "reject", "error": {"class": name, "message": "secret message"}})


def _records() -> list[Rec]:
    names = (
        ["ValidationError"] * N_VALIDATION + ["TimeoutError"] * N_TIMEOUT + ["KeyError"] * N_OTHER
    )
    return [
        Rec(f"key-SECRET-{i}".encode(), f"{n}|payload-SECRET-{i}".encode())
        for i, n in enumerate(names)
    ]


async def test_one_line_per_burst_with_count_and_classes(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    total = N_VALIDATION + N_TIMEOUT + N_OTHER
    async with running_sidecar(
        broker,
        tmp_path,
        RecordingApp(policy=_reject_by_value),
        unique=unique,
        produce_first=_records(),
    ) as rig:
        sc = rig.sc
        await sc.wait_status(lambda st: st["counters"]["dlq_written"] == total, 60, "DLQ writes")

        def said() -> list[dict[str, object]]:
            return [line for line in sc.log_lines() if str(line["msg"]).startswith("dead-lettered")]

        await sc.wait_status(
            lambda _st: sum(int(str(x["count"])) for x in said()) == total, 10, "summary"
        )
        lines = said()
        assert 1 <= len(lines) <= 3, lines  # one burst (a slow machine may split it)
        first = lines[0]
        assert first["level"] == "warning"
        assert first["topic"] == rig.topic and first["dlq_topic"] == rig.dlq_topic
        assert f"of {rig.topic} to {rig.dlq_topic}" in str(first["msg"])
        if len(lines) == 1:
            assert first["count"] == total
            assert first["exception_classes"] == {
                "ValidationError": N_VALIDATION,
                "TimeoutError": N_TIMEOUT,
                "KeyError": N_OTHER,
            }
            assert "ValidationError 20, TimeoutError 8, KeyError 2" in str(first["msg"])
            assert first["reasons"] == {"rejected": total} or len(first["reasons"]) == 1
        # errors.log.enable is off by default: no per-record lines; nothing of a payload anywhere.
        assert "SECRET" not in sc.log_text()
        assert not [line for line in sc.log_lines() if line["msg"] == "record archived"]
