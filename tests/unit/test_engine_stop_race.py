"""The consumer engine's intake around a stop, with no broker: a batch the poll thread hands over after
the stop's final commit closed every ledger (`commit_all`) is not taken, and does not stop the sidecar.

Seen in a fresh-clone suite run beside a CPU hog: a sidecar stopped with SIGTERM while a rebalance was under
way exited 1 with `LedgerClosed` (the poll thread still serves polls until the final commit's result comes
back, and a poll returned records of a partition whose ledger the stop had closed).
"""

from __future__ import annotations

import confluent_kafka

from sidecar.config import parse_config
from sidecar.engines.consumer.group import ConsumerGroupEngine
from sidecar.engines.consumer.partitions import PartitionRef
from sidecar.engines.interfaces import EngineParts
from sidecar.engines.pipeline import Pipeline


def _engine() -> ConsumerGroupEngine:
    config = parse_config(
        {
            "kafka": {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"},
            "source": {"topics": ["t"]},
            "app": {"url": "http://127.0.0.1:8080/records"},
            "errors.deadletterqueue.topic.name": "",
        },
        env={},
    )
    engines: list[ConsumerGroupEngine] = []

    def make(parts: EngineParts[PartitionRef]) -> ConsumerGroupEngine:
        engines.append(ConsumerGroupEngine(parts))
        return engines[0]

    pipelines.append(Pipeline(config, make))
    return engines[0]


pipelines: list[Pipeline] = []


async def test_records_handed_over_after_the_final_commit_closed_the_ledgers_are_left() -> None:
    engine = _engine()
    key = ("t", 0)
    state = engine._partitions.open(key, 0, None)
    engine.states[key] = state
    engine.on_messages([confluent_kafka.Message(topic="t", partition=0, offset=0, value=b"a")])
    assert state.ledger.buffered == 1
    # The stop: every ledger closed for the final commit, the states kept for it (commit_all).
    pipelines[-1]._flags.stopping = True
    for s in engine.states.values():
        engine._partitions.fence(s)
    engine.on_messages([confluent_kafka.Message(topic="t", partition=0, offset=1, value=b"b")])
    assert state.ledger.buffered == 1  # not taken: the final commit cannot pass it
    assert state.ledger.committable_offset() == 0


async def test_records_of_a_partition_given_up_are_left() -> None:
    engine = _engine()
    engine.on_messages([confluent_kafka.Message(topic="t", partition=3, offset=7, value=b"x")])
    assert ("t", 3) not in engine.states
