"""*scale-many*, *scale-share*, *scale-dapr*: N members of one group through a rolling restart.

A member is a sidecar (engine consumer: classic cooperative-sticky, the same with static membership
(``static``: a slot's members keep one ``group.instance.id``) or ``group.protocol: consumer``; or
engine share on a share group) or a daprd, all in front of the one bench app in journal mode
(2 % rejected, 2 % released once). Records are produced at ``rate`` to one topic throughout; once
every member delivers, each member in turn is stopped (SIGTERM and a wait for its exit, or SIGKILL)
and a new one started in its place; the next stop waits until the new one is ready (a sidecar: its
``/readyz``; daprd, whose readiness says nothing of its partitions: its group stable with N members
and every partition assigned). Then the producer stops, and once every record is done (accepted, or
its DLQ record written) the journal and the DLQ topic are judged (``bench.scale.journal``).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.app import App
from bench.broker import Broker
from bench.dapr import DaprSetup, group_assigned, running_daprd
from bench.measure import cpu_seconds
from bench.scale.journal import (
    Coord,
    Journal,
    StopState,
    Verdict,
    by_stop,
    judge,
    not_durable,
    unexplained,
)
from bench.sidecars import Side, api_get, running_sidecar, sidecar_config

KINDS = ("classic", "static", "consumer", "share", "dapr")
VALUE_ID = re.compile(rb"bench-r(\d+):")


@dataclass(frozen=True)
class Rollout:
    """One rollout's shape."""

    kind: str  # of KINDS
    members: int
    partitions: int
    rate: float
    sig: str  # "term" or "kill"
    warmup_s: float = 5.0
    ready_timeout_s: float = 120.0
    done_timeout_s: float = 180.0
    broker_note: str = ""  # e.g. the share heartbeat the broker runs with


@dataclass
class Fleet:
    """The running members, by slot; each member's exit stack stops it."""

    stacks: list[contextlib.ExitStack] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    apis: list[str | None] = field(default_factory=list)
    started_ns: list[int] = field(default_factory=list)
    started: int = 0


class Producer:
    """Records at a fixed rate until stopped, each value ``bench-r<id>:``; notes where each went."""

    def __init__(self, broker: Broker, topic: str, rate: float) -> None:
        self.where: dict[int, tuple[int, int]] = {}
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(broker, topic, rate), daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        return self.sent

    def _run(self, broker: Broker, topic: str, rate: float) -> None:
        from confluent_kafka import Producer as KafkaProducer

        producer = KafkaProducer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        start = time.monotonic()
        i = 0
        while not self._stop.is_set():
            pause = start + i / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)

            def noted(err: Any, msg: Any, i: int = i) -> None:
                if err is None:
                    self.where[i] = (msg.partition(), msg.offset())

            producer.produce(
                topic, b"bench-r%d:" % i + b"x" * 90, b"key-%05d" % (i % 10_000), on_delivery=noted
            )
            producer.poll(0)
            i += 1
        producer.flush(30)
        self.sent = i


def _sidecar_config(
    r: Rollout, broker: Broker, topic: str, dlq: str, group: str, app: App, api: str, slot: int
) -> str:
    kafka: dict[str, Any] = {}
    extra: dict[str, Any] = {
        "errors.deadletterqueue.topic.name": dlq,
        "errors.retry.delay.initial.ms": 50,
        "logging": {"level": "info", "format": "json"},
    }
    engine = None
    if r.kind == "classic":
        # A killed member's partitions wait for its session to expire: the broker's minimum.
        kafka = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}
    elif r.kind == "static":
        # Classic with static membership: the member started in a slot keeps its instance id,
        # as a container restarted in its pod does with `group.instance.id: ${POD_NAME}`.
        kafka = {
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "group.instance.id": f"{group}-{slot}",
        }
    elif r.kind == "consumer":
        kafka = {"group.protocol": "consumer"}
    elif r.kind == "share":
        engine = "share"
        extra["share.journal.path"] = None
    text = sidecar_config(
        "c-tcp-key",
        broker.bootstrap,
        topic,
        group,
        app,
        api,
        ordering="none" if r.kind == "share" else "key",
        engine=engine,
        kafka_extra=kafka,
        extra=extra,
    )
    return text.replace("logging:\n  level: warning\n", "")


def _ready(api: str) -> bool:
    checks = (api_get(api, "/readyz") or {}).get("checks", {})
    # A share member says `subscribed` (the broker assigns its partitions later).
    return bool(checks.get("assigned") or checks.get("subscribed"))


def _start(
    fleet: Fleet,
    slot: int,
    r: Rollout,
    broker: Broker,
    topic: str,
    dlq: str,
    group: str,
    app: App,
    directory: str,
    side: Side,
) -> None:
    name = f"{r.kind}-{r.sig}-{fleet.started}"
    fleet.started += 1
    stack = contextlib.ExitStack()
    api: str | None = None
    if r.kind == "dapr":
        setup = DaprSetup(
            broker.bootstrap, topic, group, app.port, dlq_topic=dlq, session_timeout_s=6
        )
        proc = stack.enter_context(running_daprd(setup, directory, name))
    else:
        api = os.path.join(directory, f"api-{name}.sock")
        config = _sidecar_config(r, broker, topic, dlq, group, app, api, slot)
        proc = stack.enter_context(running_sidecar(config, directory, name, side))
    if slot < len(fleet.procs):
        fleet.stacks[slot], fleet.procs[slot], fleet.apis[slot] = stack, proc, api
        fleet.started_ns[slot] = time.time_ns()
    else:
        fleet.stacks.append(stack)
        fleet.procs.append(proc)
        fleet.apis.append(api)
        fleet.started_ns.append(time.time_ns())


def _wait(predicate: Any, timeout_s: float, what: str, fleet: Fleet) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        for proc in fleet.procs:
            if proc.poll() is not None and proc.returncode not in (0, -signal.SIGKILL):
                raise RuntimeError(f"a member exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.1)
    raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}")


@contextlib.contextmanager
def _fleet_stopped_at_end(fleet: Fleet) -> Iterator[Fleet]:
    try:
        yield fleet
    finally:
        for proc in fleet.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for stack in fleet.stacks:
            stack.close()


def run_rollout(r: Rollout, broker: Broker, app: App, directory: str, side: Side) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    topic = broker.create_topic(f"bench-roll-{r.kind}-{tag}", r.partitions)
    dlq = broker.create_topic(f"dlq.{topic}", 1)
    group = f"bench-roll-{r.kind}-{r.sig}-{tag}"
    journal_path = os.path.join(directory, f"roll-{r.kind}-{r.sig}-{tag}.journal")
    app.reset(journal=journal_path)
    producer = Producer(broker, topic, r.rate)

    def journal_lines() -> list[str]:
        app.stats()  # flushes the journal
        return Path(journal_path).read_text().splitlines()

    def ready(slot: int) -> bool:
        api = fleet.apis[slot]
        if api is not None:
            return _ready(api)
        return (
            group_assigned(broker.bootstrap, group, r.partitions)
            and _members(broker, group) == r.members
        )

    stops: list[dict[str, Any]] = []
    # A killed consumer-engine member's state at its stop (None for any other stop).
    held: list[StopState | None] = []
    with _fleet_stopped_at_end(Fleet()) as fleet:
        for slot in range(r.members):
            _start(fleet, slot, r, broker, topic, dlq, group, app, directory, side)
        up_s = _wait(
            lambda: all(ready(s) for s in range(r.members)),
            r.ready_timeout_s,
            "every member",
            fleet,
        )
        producer.start()
        _wait(
            lambda: len({tuple(line.split()[:2]) for line in journal_lines()}) >= r.partitions,
            max(60.0, r.warmup_s * 4),
            "deliveries on every partition",
            fleet,
        )
        time.sleep(r.warmup_s)  # steady state before the first stop (the figure is the rollout)
        internal0 = {t: _topic_end(broker, t) for t in INTERNAL_TOPICS}
        window_start = time.time_ns()
        for slot in range(r.members):
            proc, api = fleet.procs[slot], fleet.apis[slot]
            status = api_get(api, "/v1/status") if api else None
            in_flight = int(status.get("in_flight", 0)) if status else None
            t0 = time.monotonic()
            at_ns = time.time_ns()
            if r.sig == "kill":
                proc.kill()
                proc.wait()
            else:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=120)
            stopped_s = time.monotonic() - t0
            held.append(
                StopState(
                    {
                        int(q["partition"]): q.get("last_committed_offset")
                        for q in status.get("partitions", [])
                    },
                    fleet.started_ns[slot],
                    time.time_ns(),
                )
                if r.sig == "kill" and r.kind in ("classic", "static", "consumer") and status
                else None
            )
            fleet.stacks[slot].close()
            _start(fleet, slot, r, broker, topic, dlq, group, app, directory, side)
            ready_s = _wait(
                lambda slot=slot: ready(slot), r.ready_timeout_s, f"member {slot}", fleet
            )
            stops.append(
                {
                    "in_flight": in_flight,
                    "at_ns": at_ns,
                    "exit": proc.returncode,
                    "stop_s": round(stopped_s, 2),
                    "ready_s": round(ready_s, 2),
                }
            )
        window_end = time.time_ns()
        internal1 = {t: _topic_end(broker, t) for t in INTERNAL_TOPICS}
        produced = producer.stop()
        ends = _ends(broker, topic, r.partitions)
        cpu = sum(cpu_seconds(p.pid) for p in fleet.procs if p.poll() is None)

        def verdict_now() -> Any:
            dlq_sources = _dlq_sources(
                broker, dlq, topic, producer.where, by_value=r.kind == "dapr"
            )
            journal = Journal.parse(journal_lines(), topic)
            return judge(
                journal,
                ends,
                dlq_sources,
                (window_start, window_end),
                reject_is_done=r.kind == "dapr",
            )

        verdict = None
        deadline = time.monotonic() + r.done_timeout_s
        while time.monotonic() < deadline:
            verdict = verdict_now()
            if verdict.lost == 0:
                break
            time.sleep(2.0)
        assert verdict is not None
        explained = _explained(verdict, journal_lines(), topic, stops, held)
    return {
        "kind": r.kind,
        "members": r.members,
        "partitions": r.partitions,
        "rate": r.rate,
        "signal": r.sig,
        "broker": r.broker_note,
        "produced": produced,
        "up_s": round(up_s, 1),
        "rollout_wall_s": round((window_end - window_start) / 1e9, 1),
        "in_flight_at_stops": sum(s["in_flight"] or 0 for s in stops),
        **explained,
        "in_flight_known": all(s["in_flight"] is not None for s in stops),
        "stops": stops,
        "members_cpu_s_at_end": round(cpu, 1),
        # Records written to the broker's internal topics during the rollout, per second (every
        # group on the broker: on a shared broker, an upper bound for this run's).
        "internal_records_per_s": {
            t: round((internal1[t] - internal0[t]) / ((window_end - window_start) / 1e9), 1)
            for t in INTERNAL_TOPICS
            if internal0[t] is not None and internal1[t] is not None
        },
        **verdict.as_dict(),
        # Where the duplicates came from: by the last stop before each, their partitions.
        "duplicates_by_stop": by_stop(verdict.extra, [s["at_ns"] for s in stops]),
    }


INTERNAL_TOPICS = ("__consumer_offsets", "__share_group_state")


def _explained(
    verdict: Verdict,
    lines: list[str],
    topic: str,
    stops: list[dict[str, Any]],
    held: list[StopState | None],
) -> dict[str, Any]:
    """After kill -9 (consumer engine): the records each stop left not durable (answered past its
    last confirmed commit, those at the app at the kill included), the duplicates no stop explains,
    and how old each killed member's last commit was (the oldest of its partitions', seconds)."""
    if not held or any(h is None for h in held):
        return {}
    journal = Journal.parse(lines, topic)
    marks: list[tuple[int, set[Coord]]] = []
    for stop, state in zip(stops, held, strict=True):
        assert state is not None
        # The records at the app at the kill are among these: the app answers them after it.
        records = not_durable(journal, topic, state)
        stop["not_durable"] = len(records)
        stop["commit_age_s"] = _commit_age_s(journal, topic, state)
        stop["committed"] = {str(p): c for p, c in sorted(state.committed.items())}
        marks.append((stop["at_ns"], records))
    odd = unexplained(verdict.extra, topic, marks)
    return {
        "not_durable_at_stops": sum(s["not_durable"] for s in stops),
        "duplicates_unexplained": len(odd),
        "unexplained_sample": odd[:10],
        "commit_age_s_at_stops": [s["commit_age_s"] for s in stops],
    }


def _commit_age_s(journal: Journal, topic: str, state: StopState) -> float | None:
    """How long before the kill the oldest of the member's last commits was answered (the record
    just below each partition's committed offset: when the app answered it, an upper bound on the
    commit's age)."""
    ages = []
    for partition, committed in state.committed.items():
        if committed is None or committed == 0:
            continue
        seen = journal.by_coord.get((topic, partition, committed - 1), [])
        if seen:
            ages.append((state.gone_ns - min(s.wall_ns for s in seen)) / 1e9)
    return round(max(ages), 2) if ages else None


def _topic_end(broker: Broker, topic: str) -> int | None:
    """The sum of a topic's partitions' end offsets, or None when it does not exist."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench-watermarks"})
    try:
        md = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return None
        return sum(
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in md.partitions
        )
    finally:
        consumer.close()


def _members(broker: Broker, group: str) -> int:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    try:
        described = admin.describe_consumer_groups([group], request_timeout=5)[group].result(
            timeout=10
        )
    except Exception:
        return -1
    return len(described.members)


def _ends(broker: Broker, topic: str, partitions: int) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench-watermarks"})
    try:
        return {
            (topic, p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


def _dlq_sources(
    broker: Broker,
    dlq: str,
    topic: str,
    where: dict[int, tuple[int, int]],
    *,
    by_value: bool,
) -> list[Coord]:
    """Each DLQ record's source: from our headers, or (daprd, whose DLQ record carries the original
    payload in a CloudEvent) from the record id in its value and where the producer put it."""
    out: list[Coord] = []
    if not by_value:
        for _, _, headers in broker.read_headers(dlq):
            p, o = headers.get("__dlq.errors.partition"), headers.get("__dlq.errors.offset")
            if p is not None and o is not None:
                out.append((topic, int(p), int(o)))
        return out
    for raw in broker.read_values(dlq):
        value = raw
        if raw.startswith(b"{"):
            with contextlib.suppress(ValueError, TypeError, binascii.Error):
                value = base64.b64decode(json.loads(raw).get("data_base64", "")) or raw
        found = VALUE_ID.search(value)
        if found and int(found.group(1)) in where:
            p, o = where[int(found.group(1))]
            out.append((topic, p, o))
    return out
