"""The same poison pattern through the sidecar and through Dapr's sidecar (daprd v1.14.0, Kafka pub/sub).

One topic of 240 records (6 partitions), read by each with a group of its own, in front of the same
app (``bench.benchapp``, poison mode, every answer held 5 ms so records are in flight): 10 % of the
records rejected (Dapr: DROP), 5 % answered retry (Dapr: RETRY) on the app's first two sightings and
accepted on the third, the rest accepted. The app counts its sightings itself, by partition and
offset, for both (Dapr sends no delivery count).

One record kills the process that consumes it: its delivery makes the app SIGKILL the process that
delivered it, the sidecar or daprd (a record that crashes whatever parses it: a decoder bug, a native
crash, an out-of-memory on its payload). The test restarts that process after each death, as a
supervisor would, with the same group. Every death is a kill -9 with other records in flight.

The sidecar (consumer engine, delivery-count limit 3, retry delay 50 ms, static membership) must: put
the killer in its DLQ after at most limit + 1 deaths; dead-letter every rejected record and no other;
lose nothing; every DLQ record naming the cause, the exception and the source coordinates.

Dapr (its Kafka component with ``rawPayload``, a subscription with ``deadLetterTopic``, a resiliency
policy retrying the app's RETRY 3 times 50 ms apart, session timeout 6 s) is measured, and asserted only
where its code is deterministic: a DROP goes to the dead-letter topic; the killer has no delivery count,
so it is delivered again after every restart and never dead-lettered (the test stops letting it kill
after as many deaths as the sidecar's bound, limit + 1, and then the app accepts it). The printed table
(``pytest -s``) is docs/comparison.md's behaviour rows. The sidecar runs twice: at its default
commit interval (1 s, as sarama's auto-commit under Dapr's component) and at 100 ms.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from bench.app import App
from bench.broker import Broker
from bench.dapr import DaprSetup, dapr_log_tail, daprd_binary, running_daprd
from bench.measure import ROOT
from bench.sidecars import Side, log_tail, running_sidecar, sidecar_config, status_done

pytestmark = [pytest.mark.broker, pytest.mark.slow]

N_RECORDS = 240
KILLER_INDEX = 180  # late in its partition: other records are done and in flight when it comes
HOLD_MS = 5
LIMIT = 3  # the sidecar's share.delivery.count.limit: a record retried twice is accepted on its 3rd
KILLER_DEATHS = LIMIT + 1  # the sidecar's bound; Dapr is allowed as many deaths, then spared
INCARNATION_S = 120.0  # a loaded CI machine: an isolation pass after a death can take a while


def bucket(partition: int, offset: int) -> int:
    """The app's poison pattern (bench.benchapp.poison_fate)."""
    return (offset * 7919 + partition * 104729) % 100


@dataclass
class Run:
    """What one contender left: the app's sightings, the DLQ, the deaths."""

    name: str
    deaths: int = 0
    seconds: float = 0.0
    answers: dict[tuple[int, int], list[str]] = field(default_factory=dict)
    # the app's sighting counts at each death
    snapshots: list[dict[tuple[int, int], list[str]]] = field(default_factory=list)
    dlq: list[tuple[tuple[int, int], dict[str, bytes]]] = field(default_factory=list)


def answers_of(app: App) -> dict[tuple[int, int], list[str]]:
    return {(p, o): answers for p, o, answers in app.stats()["poison"]}


def incarnations(
    app: App,
    start: Callable[[int], Any],
    done: Callable[[], bool],
    run: Run,
    may_kill: Callable[[], bool],
) -> None:
    """Start the contender (``start(n)`` enters its context), name its pid to the app while
    ``may_kill()``, and restart it after each SIGKILL until ``done()``."""
    started = time.monotonic()
    for n in range(KILLER_DEATHS + 3):
        with start(n) as proc:
            app.set_kill_pid(proc.pid if may_kill() else 0)
            deadline = time.monotonic() + INCARNATION_S
            while proc.poll() is None and not done():
                assert time.monotonic() < deadline, (
                    f"{run.name}: incarnation {n} neither died nor finished"
                )
                time.sleep(0.05)
            if proc.poll() is None:
                run.seconds = time.monotonic() - started
                run.answers = answers_of(app)
                return
            assert proc.returncode == -signal.SIGKILL, f"{run.name} exited {proc.returncode}"
            run.deaths += 1
            run.snapshots.append(answers_of(app))
    raise AssertionError(f"{run.name}: still dying after {run.deaths} deaths")


@pytest.fixture(scope="module")
def daprd() -> str:
    return daprd_binary()


@pytest.fixture
def rig(bootstrap: str) -> Iterator[tuple[Broker, App, str]]:
    broker = Broker(bootstrap)
    with tempfile.TemporaryDirectory(prefix="vs-dapr-") as directory:
        app = App(directory)
        try:
            yield broker, app, directory
        finally:
            app.close()
            broker.close()


def produce(broker: Broker) -> tuple[str, list[tuple[int, int]], dict[int, int]]:
    topic = broker.create_topic(f"vs-dapr-{uuid.uuid4().hex[:8]}")
    values = [
        b"bench-kill" if i == KILLER_INDEX else b"%08d" % i + b"x" * 92 for i in range(N_RECORDS)
    ]
    where = broker.produce_values(topic, values)
    return topic, where, broker.end_offsets(topic)


def run_sidecar(
    commit_ms: int,
    broker: Broker,
    app: App,
    directory: str,
    topic: str,
    ends: dict[int, int],
    killer: tuple[int, int],
) -> Run:
    run = Run(f"sidecar, commits every {commit_ms} ms")
    group = f"vs-dapr-sidecar-{commit_ms}-{uuid.uuid4().hex[:8]}"
    dlq = f"dlq.{group}"
    broker.topics.append(dlq)
    api_path = os.path.join(directory, f"api-sidecar-{commit_ms}.sock")
    config = sidecar_config(
        "c-tcp-key", broker.bootstrap, topic, group, app, api_path,
        kafka_extra={
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "group.instance.id": f"member-{group}",
        },
        extra={
            "share.delivery.count.limit": LIMIT,
            "errors.retry.delay.initial.ms": 50,
            "errors.deadletterqueue.copy.record.enable": True,
            "errors.deadletterqueue.topic.name": dlq,
            "commit.interval.ms": commit_ms,
        },
    )  # fmt: skip
    side = Side("new", ROOT)

    def read() -> list[tuple[tuple[int, int], dict[str, bytes]]]:
        return [
            ((int(h["__dlq.errors.partition"]), int(h["__dlq.errors.offset"])), h)
            for _, _, h in broker.read_headers(dlq)
            if "__dlq.errors.partition" in h
        ]

    def done() -> bool:
        return status_done(api_path, topic, ends) and any(at == killer for at, _ in read())

    app.reset(poison=1, killer=1, delay_ms=HOLD_MS)
    try:
        incarnations(
            app, lambda n: running_sidecar(config, directory, f"vs-{commit_ms}-{n}", side), done, run,
            may_kill=lambda: True,
        )  # fmt: skip
    except AssertionError as e:
        raise AssertionError(f"{e}\n{log_tail(directory, side, f'vs-{commit_ms}-0')}") from None
    run.dlq = read()
    return run


def run_dapr(
    broker: Broker, app: App, directory: str, topic: str, where: list[tuple[int, int]], daprd: str
) -> Run:
    run = Run("dapr")
    dlq = broker.create_topic(f"dapr-dlq.{topic}", partitions=1)
    group = f"vs-dapr-dapr-{uuid.uuid4().hex[:8]}"
    setup = DaprSetup(
        broker.bootstrap, topic, group, app.port, dlq_topic=dlq, retries=3, retry_ms=50,
        session_timeout_s=6,
    )  # fmt: skip
    rejected = {at for at in where if bucket(*at) < 10}

    def read() -> list[tuple[tuple[int, int], dict[str, bytes]]]:
        return [
            ((int(h["__partition"]), int(h["__offset"])), h)
            for _, _, h in broker.read_headers(dlq)
            if "__partition" in h
        ]

    def done() -> bool:
        answers = answers_of(app)
        finished = len(answers) == len(where) and all(
            a and a[-1] in ("accept", "reject") for a in answers.values()
        )
        return finished and rejected <= {at for at, _ in read()}

    app.reset(poison=1, killer=1, delay_ms=HOLD_MS)
    try:
        incarnations(
            app, lambda n: running_daprd(setup, directory, f"vs-{n}", daprd=daprd), done, run,
            may_kill=lambda: run.deaths < KILLER_DEATHS,
        )  # fmt: skip
    except AssertionError as e:
        raise AssertionError(f"{e}\n{dapr_log_tail(directory, 'vs-0')}") from None
    run.dlq = read()
    return run


def figures(
    run: Run,
    where: list[tuple[int, int]],
    killer: tuple[int, int],
    reason: str,
    exception: str,
    coords: tuple[str, ...],
) -> dict[str, Any]:
    rejected = {at for at in where if bucket(*at) < 10 and at != killer}
    retried = {at for at in where if 10 <= bucket(*at) < 15 and at != killer}
    in_dlq = [at for at, _ in run.dlq]
    redelivered: set[tuple[int, int]] = set()
    for snapshot in run.snapshots:
        for at, before in snapshot.items():
            finished = any(a in ("accept", "reject") for a in before)
            if at != killer and finished and len(run.answers.get(at, [])) > len(before):
                redelivered.add(at)
    headers = [h for _, h in run.dlq]
    return {
        "deaths": run.deaths,
        "killer_deliveries": len(run.answers.get(killer, [])),
        "killer_in_dlq": killer in in_dlq,
        "rejected": len(rejected),
        "rejected_in_dlq": len(rejected & set(in_dlq)),
        "others_in_dlq": len({at for at in in_dlq if at not in rejected and at != killer}),
        "dlq_records": len(in_dlq),
        "dlq_duplicates": len(in_dlq) - len(set(in_dlq)),
        "with_reason": sum(1 for h in headers if reason in h),
        "with_exception": sum(1 for h in headers if exception in h),
        "with_coordinates": sum(1 for h in headers if all(c in h for c in coords)),
        "retried_accepted_on_third": sum(
            1 for at in retried if run.answers.get(at, [])[-1:] == ["accept"]
            and len(run.answers[at]) >= 3
        ),
        "retried": len(retried),
        "lost": sum(
            1 for at in where
            if at not in rejected and at != killer and "accept" not in run.answers.get(at, [])
        ) + len(rejected - set(in_dlq)),
        "accepted_twice": sum(
            1 for at in where if at != killer and run.answers.get(at, []).count("accept") > 1
        ),
        "redelivered_after_restart": len(redelivered),
        "seconds": round(run.seconds, 1),
    }  # fmt: skip


ROWS = [
    ("deaths (kill -9 with records in flight)", "deaths"),
    ("killer: deliveries", "killer_deliveries"),
    ("killer: in the DLQ", "killer_in_dlq"),
    ("rejected records in the DLQ (of N)", "rejected_in_dlq"),
    ("other records in the DLQ", "others_in_dlq"),
    ("DLQ records written twice", "dlq_duplicates"),
    ("DLQ records with the reason", "with_reason"),
    ("DLQ records with the exception", "with_exception"),
    ("DLQ records with topic, partition, offset", "with_coordinates"),
    ("retried records accepted on their 3rd sighting", "retried_accepted_on_third"),
    ("records lost", "lost"),
    ("records accepted twice (duplicates)", "accepted_twice"),
    ("answered records delivered again after a restart", "redelivered_after_restart"),
    ("seconds to the end", "seconds"),
]


SIDECAR_HEADERS = (
    "__dlq.errors.message",
    "__dlq.errors.exception.class.name",
    ("__dlq.errors.topic", "__dlq.errors.partition", "__dlq.errors.offset"),
)
# Dapr's DLQ record carries the source record's value and its metadata as headers: __topic,
# __partition, __offset, __key, __timestamp, pubsubName, and the record's own headers. No cause.
DAPR_HEADERS = ("reason", "exception", ("__topic", "__partition", "__offset"))
# The sidecar at its default commit interval (1 s, as sarama's auto-commit in Dapr's component, which
# has no setting for it) and at 100 ms: what an answered record's redelivery after a death depends on.
COMMITS_MS = (1000, 100)


def test_the_same_poison_pattern_through_the_sidecar_and_dapr(
    rig: tuple[Broker, App, str], daprd: str
) -> None:
    broker, app, directory = rig
    topic, where, ends = produce(broker)
    killer = where[KILLER_INDEX]
    ours = {}
    for ms in COMMITS_MS:
        run = run_sidecar(ms, broker, app, directory, topic, ends, killer)
        ours[ms] = figures(run, where, killer, *SIDECAR_HEADERS)
    dapr = figures(
        run_dapr(broker, app, directory, topic, where, daprd), where, killer, *DAPR_HEADERS
    )
    columns = [*(f"sidecar {ms} ms" for ms in COMMITS_MS), "Dapr"]
    print(f"\n| {N_RECORDS} records, the same app | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for text, key in ROWS:
        label = text.replace("of N", f"of {dapr['rejected']}")
        cells = [str(ours[ms][key]) for ms in COMMITS_MS] + [str(dapr[key])]
        print(f"| {label} | " + " | ".join(cells) + " |")
    # The sidecar: must hold, at either commit interval.
    for found in ours.values():
        assert found["killer_in_dlq"], found
        assert 1 <= found["deaths"] <= LIMIT + 1, found
        assert found["rejected_in_dlq"] == found["rejected"], found
        assert found["others_in_dlq"] == 0, found
        assert found["lost"] == 0, found
        n = found["dlq_records"]
        assert found["with_reason"] == found["with_exception"] == found["with_coordinates"] == n
        assert found["retried_accepted_on_third"] == found["retried"], found
    # Dapr: what its code does deterministically. A DROP goes to the dead-letter topic; the killer
    # has no delivery count: delivered again after every restart, never dead-lettered; no cause in
    # the DLQ record's headers.
    assert dapr["rejected_in_dlq"] == dapr["rejected"], dapr
    assert not dapr["killer_in_dlq"], dapr
    assert dapr["deaths"] == KILLER_DEATHS, dapr
    assert dapr["killer_deliveries"] == KILLER_DEATHS + 1, dapr
    assert dapr["with_reason"] == dapr["with_exception"] == 0, dapr
