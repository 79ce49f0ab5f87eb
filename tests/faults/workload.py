"""A reliability run's moving parts: the journal, the producer, the journaling test app, and a run context.

The journal is the checker's input (tests/checker.py describes its lines). The producer journals every record
the broker confirmed (coordinates, kind, digests); the app journals every request it got and the answer it gave.
Record values start with ``<id>:<kind>:`` so the app's answer depends on the record only (deterministic), and
binary or oversized payloads follow the prefix.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from sidecar.http.server import Request, Response, json_response, serve_http
from tests.checker import (
    H_OFFSET,
    H_PARTITION,
    H_TOPIC,
    DlqEntry,
    Report,
    RunInfo,
    check,
    digest,
    observe,
    read_journal,
)
from tests.harness import free_port, write_config
from tests.kafkatools import Broker

KINDS_REFUSED = ("poison", "release")


class JournalWriter:
    """Appends JSON lines; shared by the producer's callback thread and the app (trio thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self.t0 = time.monotonic()

    def write(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)

    def run(self, info: RunInfo) -> None:
        self.write(
            {
                "ev": "run",
                "group": info.group,
                "topics": list(info.topics),
                "dlq_topic": info.dlq_topic,
                "limit": info.limit,
                "copy_record": info.copy_record,
                "transactional": info.transactional,
            }
        )

    def fault(self, kind: str, detail: str = "") -> None:
        self.write(
            {
                "ev": "fault",
                "kind": kind,
                "t": round(time.monotonic() - self.t0, 3),
                "detail": detail,
            }
        )

    def close(self) -> None:
        with self._lock:
            self._file.close()


# ------------------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class RecordPlan:
    id: str
    kind: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes | None], ...] = ()


def plan_records(
    n: int,
    *,
    seed: int,
    poison_ratio: float = 0.05,
    release_ratio: float = 0.0,
    keys: int = 64,
    value_bytes: int = 64,
    start: int = 0,
) -> list[RecordPlan]:
    """`n` records; `poison_ratio` of them rejected by the app, `release_ratio` always released."""
    rng = random.Random(seed)
    out = []
    for i in range(start, start + n):
        r = rng.random()
        kind = (
            "poison"
            if r < poison_ratio
            else "release"
            if r < poison_ratio + release_ratio
            else "ok"
        )
        prefix = f"{i}:{kind}:".encode()
        pad = max(0, value_bytes - len(prefix))
        out.append(
            RecordPlan(str(i), kind, f"k{rng.randrange(keys)}".encode(), prefix + b"x" * pad)
        )
    return out


def plan_binary_records(
    n: int, *, seed: int, big_every: int = 10, big_bytes: int = 300_000
) -> list[RecordPlan]:
    """Binary payloads (every byte value), binary and null keys, binary headers, some oversized."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = "poison" if i % 4 == 0 else "ok"  # with big_every=10: every 20th is big poison
        size = big_bytes + rng.randrange(1000) if i % big_every == 0 else rng.randrange(0, 2000)
        body = rng.randbytes(size)
        key: bytes | None = None if i % 7 == 3 else rng.randbytes(rng.randrange(1, 40))
        headers: tuple[tuple[str, bytes | None], ...] = (
            ("bin", rng.randbytes(16)),
            ("nul", None),
            ("rep", b"1"),
            ("rep", b"\x00\xff"),
        )
        out.append(RecordPlan(str(i), kind, key, f"{i}:{kind}:".encode() + body, headers))
    return out


def produce(bootstrap: str, topic: str, plans: Iterable[RecordPlan], journal: JournalWriter) -> int:
    """Produce with an idempotent producer; journal each record the broker confirmed, with its coordinates."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.max.bytes": 2_000_000,
        }
    )
    errors: list[str] = []
    n = 0
    for plan in plans:

        def on_delivery(err: Any, msg: Any, plan: RecordPlan = plan) -> None:
            if err is not None:
                errors.append(str(err))
                return
            journal.write(
                {
                    "ev": "produced",
                    "id": plan.id,
                    "topic": msg.topic(),
                    "partition": msg.partition(),
                    "offset": msg.offset(),
                    "kind": plan.kind,
                    "key_sha": digest(plan.key),
                    "value_sha": digest(plan.value),
                }
            )

        kwargs: dict[str, Any] = {"key": plan.key, "value": plan.value, "on_delivery": on_delivery}
        if plan.headers:
            kwargs["headers"] = list(plan.headers)
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        n += 1
    remaining = producer.flush(120)
    if remaining or errors:
        raise AssertionError(f"produce failed: {remaining} unflushed, errors {errors[:3]}")
    return n


# ------------------------------------------------------------------------------------------ the app


@dataclass(frozen=True)
class Seen:
    """One request the app got, in arrival order (kept in memory for assertions; the journal is separate)."""

    rid: str
    kind: str
    topic: str
    partition: int
    offset: int
    count: int
    delivery_id: str
    value_sha: str | None

    @property
    def coord(self) -> tuple[str, int, int]:
        return (self.topic, self.partition, self.offset)


def answer_for(kind: str, rid: str) -> tuple[str, Response, dict[str, Any]]:
    """What the app answers a record of `kind`: (journal word, HTTP answer, `/v1/acks` item fields)."""
    if kind == "poison":
        error = {"class": "test.Poison", "message": f"record {rid} is poison"}
        return (
            "reject",
            json_response({"ack": "reject", "error": error}),
            {
                "ack": "reject",
                "error": error,
            },
        )
    if kind == "release":
        error = {"class": "test.Flaky", "message": "later"}
        return (
            "release",
            json_response({"ack": "release", "error": error}),
            {
                "ack": "release",
                "error": error,
            },
        )
    return "accept", Response(200), {"ack": "accept"}


@dataclass
class JournalApp:
    """The test app: answers by the record's kind and journals every request it saw.

    ok -> 200 (accept); poison -> JSON reject with an error; release -> JSON release. `delay_s` keeps records
    in flight so faults land mid-attempt. `up` is False while the app is "down" (its listener closed).

    With `defer` set, the app answers 202 (deferred, docs/app-contract.md) and parks the record in `pending`; the test
    answers later through the sidecar's `POST /v1/acks` (`ack_items()` and `journal_answer()`), in whatever
    order it likes. A deferred delivery is journaled when it is answered, with that answer, or — if the
    sidecar dies first — by `journal_unanswered()`, so the journal still has one line per delivery.
    """

    journal: JournalWriter
    delay_s: float = 0.0
    seen: int = 0
    answers: dict[str, int] = field(default_factory=dict)
    up: bool = False
    defer: bool = False
    pending: dict[str, Seen] = field(default_factory=dict)  # delivery id -> deferred, unanswered
    keep_history: bool = (
        False  # off by default: the soak's app sees hundreds of thousands of requests
    )
    history: list[Seen] = field(default_factory=list)
    _changed: trio.Event = field(default_factory=trio.Event)

    def parse(self, request: Request) -> tuple[Seen, bytes | None]:
        """The request's record as the app sees it (and its value, for the digest)."""
        value = None if request.header("kafka-value-null") == "true" else request.body
        rid, kind = "?", "ok"
        if value:
            parts = value.split(b":", 2)
            if len(parts) == 3:
                rid, kind = parts[0].decode("ascii", "replace"), parts[1].decode("ascii", "replace")
        seen = Seen(
            rid=rid,
            kind=kind,
            topic=request.header("kafka-topic") or "",
            partition=int(request.header("kafka-partition") or -1),
            offset=int(request.header("kafka-offset") or -1),
            count=int(request.header("kafka-delivery-count") or 0),
            delivery_id=request.header("kafka-delivery-id") or "",
            value_sha=digest(value),
        )
        if self.keep_history:
            self.history.append(seen)
        return seen, value

    def note(self, seen: Seen, answer: str) -> None:
        """Journal one delivery and the answer it got (before the answer reaches the sidecar)."""
        self.journal.write(
            {
                "ev": "delivery",
                "id": seen.rid,
                "topic": seen.topic,
                "partition": seen.partition,
                "offset": seen.offset,
                "count": seen.count,
                "answer": answer,
                "value_sha": seen.value_sha,
            }
        )
        self.seen += 1
        self.answers[answer] = self.answers.get(answer, 0) + 1

    async def __call__(self, request: Request) -> Response:
        seen, _value = self.parse(request)
        return await self.respond(seen)

    async def respond(self, seen: Seen) -> Response:
        """The healthy answer to a parsed request (deferred, delayed or at once); journals it."""
        if self.defer:
            self.pending[seen.delivery_id] = seen
            return Response(202)
        if self.delay_s:
            await trio.sleep(self.delay_s)
        answer, resp, _ack = answer_for(seen.kind, seen.rid)
        self.note(seen, answer)
        return resp

    def ack_items(self, deliveries: Iterable[Seen]) -> list[dict[str, Any]]:
        """Journal each deferred delivery's answer and return the `/v1/acks` items that give it."""
        items = []
        for d in deliveries:
            answer, _resp, fields = answer_for(d.kind, d.rid)
            self.pending.pop(d.delivery_id, None)
            self.note(d, answer)
            items.append({"id": d.delivery_id, **fields})
        return items

    def journal_unanswered(self) -> list[Seen]:
        """Journal every deferred delivery that never got an answer (its sidecar is gone); returns them."""
        left = list(self.pending.values())
        for d in left:
            self.note(d, "unanswered")
        self.pending.clear()
        return left


class AppServer:
    """Runs a JournalApp on a fixed port and can take it down (listener closed: connection refused) and up."""

    def __init__(self, app: JournalApp, port: int) -> None:
        self.app = app
        self.port = port
        self._scope: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None

    async def start(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        await self.up()

    async def up(self) -> None:
        assert self._nursery is not None
        self._scope = await self._nursery.start(self._serve)
        self.app.up = True

    def down(self) -> None:
        if self._scope is not None:
            self._scope.cancel()
            self._scope = None
        self.app.up = False

    async def _serve(self, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as inner:
                await inner.start(serve_http, self.app, ("tcp", "127.0.0.1", self.port))
                task_status.started(scope)


# ------------------------------------------------------------------------------------------ a run


@dataclass
class Run:
    """One checked run: a topic, a group, a journal, the app, and sidecar configs for them."""

    bootstrap: str  # what the sidecar uses (maybe through a proxy)
    direct: str  # what the test itself uses (never through the proxy)
    topic: str
    group: str
    dlq_topic: str
    partitions: int
    info: RunInfo
    journal: JournalWriter
    app: JournalApp
    server: AppServer
    workdir: Path
    started: float = field(default_factory=time.monotonic)
    _n_configs: int = 0

    def config(
        self,
        *,
        extra: dict[str, Any] | None = None,
        kafka_extra: dict[str, Any] | None = None,
        app_extra: dict[str, Any] | None = None,
    ) -> Path:
        self._n_configs += 1
        kafka = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "auto.offset.reset": "earliest",
            # A killed member holds its partitions until its session expires (the broker's minimum is 6 s).
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            **(kafka_extra or {}),
        }
        # A None in kafka_extra takes the default out (with group.protocol consumer, librdkafka
        # refuses the classic protocol's session and heartbeat settings).
        kafka = {k: v for k, v in kafka.items() if v is not None}
        # RELIABILITY_DEBUG=eos,cgrp: librdkafka debug contexts, and the sidecar's log at debug level
        # to carry them (for chasing a failure; the logs grow large).
        debug = os.environ.get("RELIABILITY_DEBUG")
        if debug:
            kafka["debug"] = debug
        settings: dict[str, Any] = {
            "kafka": kafka,
            "delivery.count.limit": self.info.limit,
            "errors.deadletterqueue.topic.name": self.dlq_topic,
            "errors.deadletterqueue.copy.record.enable": self.info.copy_record,
            "errors.deadletterqueue.transactional.enable": self.info.transactional,
            "errors.retry.delay.initial.ms": 20,
            "errors.retry.delay.max.ms": 100,
            "commit.interval.ms": 200,
            "logging": {"level": "debug" if debug else "info", "format": "json"},
            **(extra or {}),
        }
        return write_config(
            self.workdir / f"sidecar-{self._n_configs}.yaml",
            bootstrap=self.bootstrap,
            group=self.group,
            topics=[self.topic],
            app_url=f"http://127.0.0.1:{self.server.port}/records",
            extra=settings,
            app_extra={"max.in.flight": 16, **(app_extra or {})},
        )

    async def produce(self, plans: list[RecordPlan]) -> int:
        return await trio.to_thread.run_sync(produce, self.direct, self.topic, plans, self.journal)

    def fault(self, kind: str, detail: str = "") -> None:
        self.journal.fault(kind, detail)

    def _progress(self, consumer: Consumer) -> tuple[int, int]:
        """(records past the committed offsets, records in the topic)."""
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        committed = consumer.committed(tps, timeout=10)
        done = total = 0
        for tp in committed:
            lo, hi = consumer.get_watermark_offsets(
                TopicPartition(self.topic, tp.partition), timeout=10
            )
            total += hi - lo
            done += max(0, min(tp.offset, hi) - lo) if tp.offset >= 0 else 0
        return done, total

    async def wait_done(self, timeout_s: float, alive: Callable[[], None] | None = None) -> float:
        """Wait until every partition's committed offset is at its end; returns the seconds it took."""
        started = time.monotonic()
        consumer = Consumer({"bootstrap.servers": self.direct, "group.id": self.group})
        try:
            last: tuple[int, int] = (0, 0)
            errors: list[str] = []
            streak = 0
            with trio.move_on_after(timeout_s):
                while True:
                    try:
                        last = await trio.to_thread.run_sync(self._progress, consumer)
                    except KafkaException as exc:
                        # NOT_COORDINATOR and friends while a broker starts or restarts: ask again.
                        errors.append(f"{time.monotonic() - started:.1f}s: {exc}")
                        streak += 1
                        if streak % 3 == 0:
                            # A client that asked while the broker was coming back can stay stuck
                            # on a stale coordinator; a fresh one asks anew (what a restarted
                            # sidecar would see). A real pending commit fails the fresh one too.
                            await trio.to_thread.run_sync(consumer.close)
                            consumer = Consumer(
                                {"bootstrap.servers": self.direct, "group.id": self.group}
                            )
                        await trio.sleep(0.5)
                        continue
                    streak = 0
                    if last[1] > 0 and last[0] == last[1]:
                        return time.monotonic() - started
                    if alive is not None:
                        alive()
                    await trio.sleep(0.5)
            raise AssertionError(
                f"not done after {timeout_s}s: {last[0]} of {last[1]} committed; "
                f"{len(errors)} failed reads, first and last: {errors[:1] + errors[-1:]}"
            )
        finally:
            await trio.to_thread.run_sync(consumer.close)

    async def check(self, extra_allowance: int = 0, name: str = "report") -> Report:
        # Kafka first, the journal second: the app journals an answer before the sidecar can act on it,
        # so a journal read after the observation covers every DLQ record and commit observed.
        observed = await trio.to_thread.run_sync(observe, self.direct, self.info)
        journal = await trio.to_thread.run_sync(read_journal, self.journal.path)
        report = check(journal, observed, extra_allowance=extra_allowance)
        (self.workdir / f"{name}.json").write_text(json.dumps(report.to_dict(), indent=2))
        return report

    async def dlq_by_source(self) -> dict[tuple[str, int, int], list[DlqEntry]]:
        """The DLQ records (read_committed), by the source coordinates their headers name."""
        observed = await trio.to_thread.run_sync(observe, self.direct, self.info)
        out: dict[tuple[str, int, int], list[DlqEntry]] = {}
        for e in observed.dlq:
            topic, part, off = e.header(H_TOPIC), e.header(H_PARTITION), e.header(H_OFFSET)
            if topic is not None and part is not None and off is not None:
                out.setdefault((topic, int(part), int(off)), []).append(e)
        return out

    async def committed(self) -> dict[int, int | None]:
        """The group's committed offset per partition of the source topic (None: nothing committed)."""
        observed = await trio.to_thread.run_sync(observe, self.direct, self.info)
        return {p: off for (t, p), off in observed.committed.items() if t == self.topic}

    async def check_midway(self, extra_allowance: int = 0) -> Report:
        """The invariants that hold at every moment, not only at the end: no commit ahead of a record
        that is not done, no DLQ duplicate (transactional), no DLQ mismatch, deliveries within the bound."""
        report = await self.check(extra_allowance, name="midway")
        bad = [f for f in report.violations if f.kind != "lost"]
        assert not bad, "midway:\n" + report.table()
        return report

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started


def assert_clean(report: Report, label: str) -> None:
    """The suite's verdict: print the checker's table (pytest shows it on failure or with -s), then assert."""
    print(f"\n== {label}\n{report.table()}")
    assert report.produced > 0
    assert report.ok, f"{label}:\n{report.table()}"


@asynccontextmanager
async def open_run(
    workdir: Path,
    *,
    bootstrap: str,
    direct: str | None = None,
    name: str = "rel",
    partitions: int = 3,
    limit: int = 3,
    copy_record: bool = True,
    transactional: bool = False,
    dlq_config: dict[str, str] | None = None,
    app_delay_s: float = 0.0,
    server_class: type[AppServer] | None = None,
    keep_history: bool = False,
) -> AsyncIterator[Run]:
    """Create the topics, start the app, and yield the run; the app stops when the block ends.

    `server_class` serves the app some other way (tests/faults/appfaults.py: an app that can answer
    garbage or hang); `keep_history` keeps every request the app saw in `run.app.history`."""
    direct = direct or bootstrap
    tag = f"{name}-{uuid.uuid4().hex[:8]}"
    broker = Broker(direct)
    topic = await trio.to_thread.run_sync(broker.create_topic, f"src-{tag}", partitions)
    dlq = await trio.to_thread.run_sync(
        lambda: broker.create_topic(f"dlq.src-{tag}", 1, config=dlq_config)
    )
    info = RunInfo(
        group=f"g-{tag}",
        topics=(topic,),
        dlq_topic=dlq,
        limit=limit,
        copy_record=copy_record,
        transactional=transactional,
    )
    workdir.mkdir(parents=True, exist_ok=True)
    journal = JournalWriter(workdir / "journal.jsonl")
    journal.run(info)
    app = JournalApp(journal, delay_s=app_delay_s, keep_history=keep_history)
    server = (server_class or AppServer)(app, free_port())
    try:
        async with trio.open_nursery() as nursery:
            await server.start(nursery)
            yield Run(
                bootstrap=bootstrap,
                direct=direct,
                topic=topic,
                group=info.group,
                dlq_topic=dlq,
                partitions=partitions,
                info=info,
                journal=journal,
                app=app,
                server=server,
                workdir=workdir,
            )
            nursery.cancel_scope.cancel()
    finally:
        journal.close()


def env_seed(default: int) -> int:
    """A run's seed: RELIABILITY_SEED replays a failure; otherwise the test's fixed default."""
    return int(os.environ.get("RELIABILITY_SEED", default))
