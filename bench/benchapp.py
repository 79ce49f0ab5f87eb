"""The benchmark's app: a minimal HTTP/1.1 server that answers every delivery at once.

Run as ``python -m bench.benchapp --tcp-port 0 --unix PATH``; it prints ``{"port": N}`` on
stdout once both listeners are up and serves until stdin closes. One process listens on TCP
loopback and on a Unix socket, so every scenario talks to the same app.

It is asyncio + httptools (llhttp) on purpose: the app must cost as little CPU as possible so
the figures measure the sidecar, not the app (``sidecar.http.server`` on trio is the more
general server, about three times the CPU per request). It imports nothing from ``sidecar``.

What it does per ``POST`` (any path but ``/stats`` and ``/reset``):
- counts requests and records (a batch body counts its ``"id":`` occurrences), first and last
  receive time (``time.monotonic_ns``, which is one clock for every process on Linux);
- with ``/reset?latency=1``, reads the ``bench-ts`` record header (monotonic ns at produce
  time; a ``Kafka-Header`` line in single mode, a base64 header in a batch) and keeps
  receive - produce per record;
- with ``/reset?fail=1`` (single mode), answers 422 (reject) for 5 % of offsets and 503
  (release) for another 5 % on their first delivery, 200 for the rest;
- with ``/reset?delay_ms=N``, answers N ms later (the slow app of the backlog test);
- with ``/reset?tier=1`` (single mode), answers 503 (release) for 10 % of offsets on their first
  delivery and 200 for the rest, and notes when the last of the rest (the clean records) was answered;
  with ``&trace=1`` also, by partition and offset, each record's deliveries, accepts and the wall-clock
  time (µs) a delivery with ``Kafka-Delivery-Count`` above 1 was received (``/stats`` ``"tier_trace"``:
  the side-by-side test with Spring's retry topics, ``bench.vs_spring``);
- with ``/reset?killer=1`` (single mode, the crash-isolation test), notes every delivery's
  partition, offset and ``Kafka-Delivery-Count`` (how many other records came with a count above
  1); a record whose value starts with
  ``bench-kill`` makes it SIGKILL the sidecar whose pid ``POST /killer?pid=N`` named last
  (set again after each restart; ``/killer`` keeps the counters). Without a pid it answers 200.
- with ``/reset?journal=PATH`` (single mode, either contract; the scale bench, ``bench.scale``),
  the pattern of ``rollout_fate``: 2 % of offsets rejected, another 2 % released on the app's own
  first sighting of them (no delivery count needed, so Dapr's answers are the same), the rest
  accepted; every delivery is appended to PATH as one line ``topic partition offset count answer
  wall_ns`` (``count`` 0 when the contract carries none); ``/stats`` flushes the file;
- with ``/reset?poison=1`` (single mode, either contract; the side-by-side test with Dapr), the
  pattern of ``poison_fate``: 10 % of offsets rejected, another 5 % answered "retry" on the app's own
  first two sightings of them and accepted on the third (the app counts its sightings itself, by
  partition and offset, since Dapr sends no delivery count), the rest accepted; every answer is noted
  by partition and offset (``/stats`` ``"poison"``).

Dapr's contract (``POST /dapr``, ``POST /dapr-bulk``), the same modes: daprd posts each record as a
CloudEvent (with ``rawPayload``, the record's value in ``data_base64``) and its Kafka metadata as HTTP
headers (``__partition``, ``__offset``, ``__key`` and the record's own headers, ``bench-ts`` among
them); the answer is ``{"status": "SUCCESS" | "RETRY" | "DROP"}`` (accept, release, reject). A bulk
subscription's request holds ``entries``, each with its ``entryId``, ``event`` and ``metadata``; the
answer is one status per entry. ``GET /dapr/subscribe`` answers ``[]`` (the subscriptions are
declarative: files in daprd's resources directory) and ``GET /dapr/config`` ``{}``.

``GET /stats`` returns the counters as JSON; ``POST /reset?...`` clears them and sets the mode.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import signal
import sys
import time
from urllib.parse import parse_qs

import httptools

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
REJECT = b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: 0\r\n\r\n"
RELEASE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
TS_HEADER = b"bench-ts="
TS_NAME = "bench-ts"
KILL_VALUE = b"bench-kill"
FAIL_PERCENT = 5  # rejects; the same share again is released once
POISON_REJECT_PERCENT = 10  # poison mode: rejected; the next POISON_RETRY_PERCENT are retried twice
POISON_RETRY_PERCENT = 5
POISON_RETRIES = 2
TIER_PERCENT = 10  # tier mode: released once (to a retry tier, or kept in memory)
ROLLOUT_REJECT_PERCENT = 2  # journal mode: rejected; the next ROLLOUT_RELEASE_PERCENT released once
ROLLOUT_RELEASE_PERCENT = 2


def dapr_answer(status: bytes) -> bytes:
    body = b'{"status":"%s"}' % status
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


# Our contract's answer -> Dapr's (accept, release, reject).
DAPR_ANSWERS = {
    b"SUCCESS": dapr_answer(b"SUCCESS"),
    b"RETRY": dapr_answer(b"RETRY"),
    b"DROP": dapr_answer(b"DROP"),
}
ENTRY_ID = re.compile(rb'"entryId":"([^"]*)"')


class Stats:
    def __init__(self) -> None:
        self.reset({})

    def reset(self, query: dict[str, list[str]]) -> None:
        self.requests = 0
        self.records = 0
        self.first_ns = 0
        self.last_ns = 0
        self.longest_gap_ns = 0  # the longest time between two requests
        self.rejected = 0
        self.released = 0
        self.span_exports = 0
        self.latency = query.get("latency", ["0"])[0] == "1"
        self.fail = query.get("fail", ["0"])[0] == "1"
        self.delay_s = int(query.get("delay_ms", ["0"])[0]) / 1000
        self.latencies_ns: list[int] = []
        self.killer = query.get("killer", ["0"])[0] == "1"
        self.kill_pid = 0
        self.kills = 0
        self.killer_counts: list[int] = []  # Kafka-Delivery-Count of each delivery of the killer
        # (partition, offset) -> the highest Kafka-Delivery-Count it was delivered with
        self.seen: dict[tuple[int, int], int] = {}
        self.killer_at: tuple[int, int] | None = None
        self.deliveries = 0
        self.poison = query.get("poison", ["0"])[0] == "1"
        # tier mode: TIER_PERCENT of offsets released once (the sidecar's backoff picks the delay);
        # the clean records' count and the time the last of them was answered
        self.tier = query.get("tier", ["0"])[0] == "1"
        self.clean = 0
        self.clean_last_ns = 0
        # tier mode with trace=1: (partition, offset) -> [deliveries, accepts, retry received µs or 0]
        self.trace = query.get("trace", ["0"])[0] == "1"
        self.tier_trace: dict[tuple[int, int], list[int]] = {}
        # poison mode: (partition, offset) -> the app's sightings and each answer, in order
        self.answers: dict[tuple[int, int], list[str]] = {}
        # journal mode: where every delivery is appended, and the records released once already
        old = getattr(self, "journal", None)
        if old is not None:
            old.close()
        path = query.get("journal", [""])[0]
        self.journal = open(path, "a", encoding="ascii") if path else None  # noqa: SIM115
        self.released_once: set[tuple[str, int, int]] = set()

    def as_json(self) -> bytes:
        if self.journal is not None:
            self.journal.flush()
        return json.dumps(
            {
                "requests": self.requests,
                "records": self.records,
                "first_ns": self.first_ns,
                "last_ns": self.last_ns,
                "longest_gap_ns": self.longest_gap_ns,
                "rejected": self.rejected,
                "released": self.released,
                "span_exports": self.span_exports,
                "latencies_ns": self.latencies_ns,
                "kills": self.kills,
                "killer_counts": self.killer_counts,
                "distinct_seen": len(self.seen),
                "innocent_counts_raised": sum(
                    1 for at, count in self.seen.items() if count > 1 and at != self.killer_at
                ),
                "deliveries": self.deliveries,
                "poison": [[p, o, answers] for (p, o), answers in sorted(self.answers.items())],
                "clean": self.clean,
                "clean_last_ns": self.clean_last_ns,
                "tier_trace": [[p, o, *seen] for (p, o), seen in self.tier_trace.items()],
            }
        ).encode()


STATS = Stats()


def fate(partition: int, offset: int, delivery_count: int) -> bytes:
    """The answer to one record in fail mode: deterministic, so every run fails the same ones."""
    bucket = (offset * 7919 + partition * 104729) % 100
    if bucket < FAIL_PERCENT:
        STATS.rejected += 1
        return REJECT
    if bucket < 2 * FAIL_PERCENT and delivery_count == 1:
        STATS.released += 1
        return RELEASE
    return OK


def tier_fate(partition: int, offset: int, delivery_count: int, now: int) -> bytes:
    """Tier mode: TIER_PERCENT of offsets released on their first delivery, the rest accepted."""
    release = delivery_count == 1 and (offset * 7919 + partition * 104729) % 100 < TIER_PERCENT
    if STATS.trace:
        seen = STATS.tier_trace.setdefault((partition, offset), [0, 0, 0])
        seen[0] += 1
        if not release:
            seen[1] += 1
        if delivery_count > 1:
            seen[2] = time.time_ns() // 1000
    if release:
        STATS.released += 1
        return RELEASE
    if delivery_count == 1:
        STATS.clean += 1
        STATS.clean_last_ns = now
    return OK


def poison_fate(partition: int, offset: int, killer: str | None = None) -> str:
    """Poison mode: "accept", "release" or "reject" for this sighting of a record (the app's own
    count, identical for both contracts), noted by partition and offset. The killer record, when it
    kills nothing (no pid named), is accepted."""
    bucket = (offset * 7919 + partition * 104729) % 100
    answers = STATS.answers.setdefault((partition, offset), [])
    if killer:
        answer = "killed" if killer == "killed" else "accept"
    elif bucket < POISON_REJECT_PERCENT:
        answer = "reject"
    elif bucket < POISON_REJECT_PERCENT + POISON_RETRY_PERCENT and len(answers) < POISON_RETRIES:
        answer = "release"
    else:
        answer = "accept"
    answers.append(answer)
    return answer


def rollout_fate(topic: str, partition: int, offset: int, count: int) -> str:
    """Journal mode: "accept", "release" or "reject" for this delivery, journaled."""
    bucket = (offset * 7919 + partition * 104729) % 100
    if bucket < ROLLOUT_REJECT_PERCENT:
        answer = "reject"
    elif bucket < ROLLOUT_REJECT_PERCENT + ROLLOUT_RELEASE_PERCENT and (
        (topic, partition, offset) not in STATS.released_once
    ):
        STATS.released_once.add((topic, partition, offset))
        answer = "release"
    else:
        answer = "accept"
    assert STATS.journal is not None
    STATS.journal.write(f"{topic or '-'} {partition} {offset} {count} {answer} {time.time_ns()}\n")
    return answer


OURS = {"accept": OK, "release": RELEASE, "reject": REJECT}
DAPRS = {"accept": b"SUCCESS", "release": b"RETRY", "reject": b"DROP"}


class Connection(asyncio.Protocol):
    """One keep-alive connection; the sidecar sends one request at a time on it."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []
        self.topic = ""
        self.partition = 0
        self.offset = 0
        self.delivery_count = 1
        self.ts_ns = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.body = []
        self.ts_ns = 0
        self.delivery_count = 1
        self.topic = ""

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # Only what a mode needs is looked at: the app must stay cheap.
        if STATS.latency:
            if value.startswith(TS_HEADER):
                self.ts_ns = int(value[len(TS_HEADER) :])
            elif name.lower() == b"bench-ts":  # Dapr: the record's headers are HTTP headers
                self.ts_ns = int(value)
        elif STATS.fail or STATS.killer or STATS.poison or STATS.tier or STATS.journal:
            lowered = name.lower()
            if lowered in (b"kafka-topic", b"__topic"):
                self.topic = value.decode("ascii", "replace")
            if lowered in (b"kafka-partition", b"__partition"):
                self.partition = int(value)
            elif lowered in (b"kafka-offset", b"__offset"):
                self.offset = int(value)
            elif lowered == b"kafka-delivery-count":
                self.delivery_count = int(value)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        now = time.monotonic_ns()
        method = self.parser.get_method()
        path, _, query = self.url.partition(b"?")
        if path == b"/stats":
            body = STATS.as_json()
            self.reply(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            return
        if path == b"/reset":
            STATS.reset(parse_qs(query.decode()))
            self.reply(OK)
            return
        if path == b"/killer":
            STATS.kill_pid = int(parse_qs(query.decode()).get("pid", ["0"])[0])
            self.reply(OK)
            return
        if path == b"/v1/traces":
            # The OTLP/HTTP receiver of the tracing scenarios: spans are accepted and dropped
            # (an empty body is an empty ExportTraceServiceResponse).
            STATS.span_exports += 1
            self.reply(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"
            )
            return
        if path in (b"/dapr/subscribe", b"/dapr/config"):
            # daprd asks at start-up; the subscriptions are declarative (its resources directory)
            found = b"[]" if path == b"/dapr/subscribe" else b"{}"
            self.reply(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"
                + found
            )
            return
        if method != b"POST":
            self.reply(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        STATS.requests += 1
        if STATS.first_ns == 0:
            STATS.first_ns = now
        elif now - STATS.last_ns > STATS.longest_gap_ns:
            STATS.longest_gap_ns = now - STATS.last_ns
        STATS.last_ns = now
        body = b"".join(self.body) if len(self.body) != 1 else self.body[0]
        if path == b"/dapr":
            answer = self.dapr_single(body, now)
        elif path == b"/dapr-bulk":
            answer = self.dapr_bulk(body, now)
        elif body.startswith(b'{"records"'):
            STATS.records += body.count(b'"id":')
            if STATS.latency:
                self.batch_latencies(body, now)
            answer = OK
        else:
            STATS.records += 1
            if self.ts_ns:
                STATS.latencies_ns.append(now - self.ts_ns)
            killer = self.killer_delivery(body) if STATS.killer else None
            if STATS.journal is not None:
                answer = OURS[
                    rollout_fate(self.topic, self.partition, self.offset, self.delivery_count)
                ]
            elif STATS.poison:
                answer = OURS[poison_fate(self.partition, self.offset, killer)]
            elif STATS.fail:
                answer = fate(self.partition, self.offset, self.delivery_count)
            elif STATS.tier:
                answer = tier_fate(self.partition, self.offset, self.delivery_count, now)
            else:
                answer = OK
        if STATS.delay_s:
            asyncio.get_running_loop().call_later(STATS.delay_s, self.reply, answer)
        else:
            self.reply(answer)

    def dapr_single(self, body: bytes, now: int) -> bytes:
        """One CloudEvent (Dapr's contract): the same modes as ours, Dapr's answers."""
        STATS.records += 1
        if self.ts_ns:
            STATS.latencies_ns.append(now - self.ts_ns)
        killer = None
        if STATS.killer:
            # rawPayload: the record's value is the event's data_base64
            value = base64.b64decode(json.loads(body).get("data_base64", ""))
            killer = self.killer_delivery(value)
        if STATS.journal is not None:
            return DAPR_ANSWERS[DAPRS[rollout_fate(self.topic, self.partition, self.offset, 0)]]
        if STATS.poison:
            return DAPR_ANSWERS[DAPRS[poison_fate(self.partition, self.offset, killer)]]
        return DAPR_ANSWERS[b"SUCCESS"]

    def dapr_bulk(self, body: bytes, now: int) -> bytes:
        """A bulk subscription's request: every entry accepted, one status per entry."""
        if STATS.latency:
            entries = json.loads(body)["entries"]
            ids = [entry["entryId"].encode() for entry in entries]
            for entry in entries:
                sent = (entry.get("metadata") or {}).get("bench-ts")
                if sent:
                    STATS.latencies_ns.append(now - int(sent))
        else:
            ids = ENTRY_ID.findall(body)
        STATS.records += len(ids)
        statuses = b",".join(b'{"entryId":"%s","status":"SUCCESS"}' % i for i in ids)
        answer = b'{"statuses":[%s]}' % statuses
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (
                len(answer),
                answer,
            )
        )

    def killer_delivery(self, body: bytes) -> str | None:
        """None for another record; for the killer "killed" (the named process was sent SIGKILL)
        or "spared" (no pid named)."""
        STATS.deliveries += 1
        at = (self.partition, self.offset)
        STATS.seen[at] = max(STATS.seen.get(at, 0), self.delivery_count)
        if not body.startswith(KILL_VALUE):
            return None
        STATS.killer_at = at
        STATS.killer_counts.append(self.delivery_count)
        if STATS.kill_pid:
            # The record "crashes" the sidecar: no answer ever comes back for it, nor for
            # anything else the dead process had in flight.
            pid, STATS.kill_pid = STATS.kill_pid, 0
            try:
                os.kill(pid, signal.SIGKILL)
                STATS.kills += 1
                return "killed"
            except ProcessLookupError:
                pass
        return "spared"

    def batch_latencies(self, body: bytes, now: int) -> None:
        for record in json.loads(body)["records"]:
            for name, value in record["headers"]:
                if name == TS_NAME and value:
                    STATS.latencies_ns.append(now - int(base64.b64decode(value)))

    def reply(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


async def serve(tcp_port: int, unix_path: str | None) -> None:
    loop = asyncio.get_running_loop()
    tcp = await loop.create_server(Connection, "127.0.0.1", tcp_port, backlog=1024)
    servers = [tcp]
    if unix_path:
        if os.path.exists(unix_path):
            os.unlink(unix_path)
        servers.append(await loop.create_unix_server(Connection, unix_path, backlog=1024))
    port = tcp.sockets[0].getsockname()[1]
    print(json.dumps({"port": port}), flush=True)
    # Serve until the parent closes our stdin (it never has to signal us).
    await loop.run_in_executor(None, sys.stdin.read)
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the benchmark's app (see module docstring)")
    parser.add_argument("--tcp-port", type=int, default=0)
    parser.add_argument("--unix", default=None, help="also listen on this Unix socket path")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.tcp_port, args.unix))


if __name__ == "__main__":
    main()
