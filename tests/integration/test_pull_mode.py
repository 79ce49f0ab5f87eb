"""Pull mode (``app.mode: pull``) end to end: a real HTTP client long-polls ``GET /v1/records`` on the
control API (TCP and a Unix socket) and answers through ``POST /v1/acks``.

Real broker, the sidecar as a subprocess. Each test checks what the client pulled (metadata, delivery
counts, locks), the sidecar's counters, the DLQ topic and the committed offsets.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from sidecar.core.record import is_delivery_id
from sidecar.ops.broker import free_port
from tests.harness import (
    FAST,
    ROOT,
    Sidecar,
    short_tmp,
    sidecar,
    wait_committed_at_end,
)
from tests.integration import test_examples
from tests.kafkatools import Broker, Rec
from tests.promtext import prometheus_values
from tests.pulltools import (
    PullClient,
    key_of,
    pull_config,
    raw_connect,
    read_raw_responses,
    value_of,
)


@contextlib.asynccontextmanager
async def pull_sidecar(
    broker: Broker,
    tmp_path: Path,
    unique: str,
    *,
    partitions: int = 1,
    api_listen: str | None = None,
    extra: dict[str, Any] | None = None,
    records: list[Rec] | None = None,
) -> AsyncIterator[tuple[Sidecar, str, str]]:
    """A pull-mode sidecar on a fresh topic: yields it, the topic and its group."""
    topic = await trio.to_thread.run_sync(
        lambda: broker.create_topic(f"src-{unique}", partitions=partitions)
    )
    group = f"g-{unique}"
    path = pull_config(
        tmp_path / "sidecar.yaml",
        bootstrap=broker.bootstrap,
        group=group,
        topics=[topic],
        api_listen=api_listen,
        extra={**FAST, **(extra or {})},
    )
    if records:
        await trio.to_thread.run_sync(broker.produce, topic, records)
    async with sidecar(path, wait_api=False) as sc:
        yield sc, topic, group


async def pull_all(
    client: PullClient, n: int, *, max_records: int = 100, timeout_s: float = 60
) -> list[dict[str, Any]]:
    """Pull (long polls of 1 s) until `n` records came."""
    got: list[dict[str, Any]] = []
    with trio.fail_after(timeout_s):
        while len(got) < n:
            got += await trio.to_thread.run_sync(client.pull, max_records, 1000)
    return got


async def wait_pull_api(client: PullClient, sc: Sidecar, timeout_s: float = 30) -> None:
    with trio.fail_after(timeout_s):
        while True:
            assert sc.proc.poll() is None, f"the sidecar exited:\n{sc.log_text()[-3000:]}"
            try:
                await trio.to_thread.run_sync(client.request, "GET", "/healthz")
                return
            except OSError:
                client.close()
                await trio.sleep(0.1)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_pull_delivers_records_with_their_metadata_and_acks_finish_them(
    broker: Broker, unique: str, tmp_path: Path, transport: str
) -> None:
    recs = [
        Rec(key=f"k{i}".encode(), value=f"v{i}".encode(), headers=(("h", b"x"), ("h", None)))
        for i in range(20)
    ]
    recs.append(Rec(key=None, value=None))
    with short_tmp() as sock_dir:
        listen = f"unix:{sock_dir}/api.sock" if transport == "unix" else None
        listen = listen or f"127.0.0.1:{free_port()}"
        async with pull_sidecar(broker, tmp_path, unique, api_listen=listen, records=recs) as (
            sc,
            topic,
            group,
        ):
            client = PullClient(listen)
            await wait_pull_api(client, sc)
            got = await pull_all(client, len(recs), max_records=7)
            assert len(got) == len(recs)
            assert sorted(r["offset"] for r in got) == list(range(len(recs)))
            for r in got:
                assert r["topic"] == topic and r["partition"] == 0
                assert r["delivery_count"] == 1
                assert is_delivery_id(r["id"])
                assert 0 < r["lock_expires_in_ms"] <= 10000
                assert (
                    abs(r["lock_deadline_ms"] - time.time() * 1000 - r["lock_expires_in_ms"]) < 5000
                )
                if r["offset"] < 20:
                    assert key_of(r) == f"k{r['offset']}".encode()
                    assert value_of(r) == f"v{r['offset']}".encode()
                    assert r["headers"] == [["h", "eA=="], ["h", None]]
                else:
                    assert key_of(r) is None and value_of(r) is None
            # Nothing else is pending: a long poll waits its time and returns an empty list.
            started = time.monotonic()
            assert await trio.to_thread.run_sync(client.pull, 10, 300) == []
            assert time.monotonic() - started >= 0.29
            results = await trio.to_thread.run_sync(
                client.ack, [{"id": r["id"], "ack": "accept"} for r in got]
            )
            assert results == ["ok"] * len(got)
            await wait_committed_at_end(broker, group, topic, 1)
            code, status = await trio.to_thread.run_sync(client.request, "GET", "/v1/status")
            assert code == 200
            assert status["counters"]["delivered"] == {"accept": len(recs)}
            assert status["pull"] == {"waiting_polls": 0, "queued": 0}
            code, ready = await trio.to_thread.run_sync(client.request, "GET", "/readyz")
            assert code == 200, ready
            assert "app_reachable" not in ready["checks"]
            # Each answer is timed from its pull: all came after the 0.3 s empty poll above.
            code, text = await trio.to_thread.run_sync(client.request, "GET", "/metrics")
            assert code == 200
            m = prometheus_values(text.decode())
            assert m["dlq_sidecar_app_ack_delay_seconds_count"] == len(recs), text
            assert m['dlq_sidecar_app_ack_delay_seconds_bucket{le="0.25"}'] == 0, text
            assert m["dlq_sidecar_app_ack_delay_seconds_sum"] >= 0.29 * len(recs)
            assert m["dlq_sidecar_app_request_duration_seconds_count"] == 0  # no push requests
            client.close()
            await sc.stop()


async def test_bad_pull_parameters_are_400s_and_the_route_is_control_only(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    obs = f"127.0.0.1:{free_port()}"
    topic = await trio.to_thread.run_sync(lambda: broker.create_topic(f"src-{unique}"))
    listen = f"127.0.0.1:{free_port()}"
    path = pull_config(
        tmp_path / "two.yaml",
        bootstrap=broker.bootstrap,
        group=f"g-{unique}",
        topics=[topic],
        api_listen=listen,
        extra=FAST,
    )
    text = path.read_text().replace(
        f"listen: {listen}", f"listen: {listen}\n  observability.listen: {obs}"
    )
    path.write_text(text)
    async with sidecar(path, wait_api=False) as sc:
        client = PullClient(listen)
        await wait_pull_api(client, sc)
        for query, word in [
            ("max=0", "max must be from 1 to 10000"),
            ("max=10001", "max must be from 1"),
            ("max=abc", "max must be an integer"),
            ("wait_ms=60001", "wait_ms must be from 0 to 60000"),
            ("wait_ms=-1", "wait_ms must be an integer"),
            ("wait=100", "unknown parameter 'wait'"),
            ("max=1&max=2", "max given more than once"),
        ]:
            code, body = await trio.to_thread.run_sync(
                client.request, "GET", f"/v1/records?{query}"
            )
            assert code == 400, (query, body)
            assert word in body["error"], (query, body)
        code, _ = await trio.to_thread.run_sync(client.request, "HEAD", "/v1/records")
        assert code == 405
        client.close()
        observer = PullClient(obs)
        code, _ = await trio.to_thread.run_sync(observer.request, "GET", "/v1/records")
        assert code == 404
        observer.close()
        await sc.stop()


async def test_ordering_key_keeps_per_key_order_across_pulls_and_pollers_get_distinct_records(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    keys = [f"key{k}".encode() for k in range(5)]
    recs = [Rec(key=keys[i % 5], value=f"{i}".encode(), partition=i % 2) for i in range(100)]
    listen = f"127.0.0.1:{free_port()}"
    async with pull_sidecar(
        broker, tmp_path, unique, partitions=2, api_listen=listen, records=recs
    ) as (sc, topic, group):
        probe = PullClient(listen)
        await wait_pull_api(probe, sc)
        probe.close()
        seen: list[tuple[bytes, int, int]] = []  # key, partition, offset in pull order
        # (partition, key) -> the delivery id pulled and not yet answered: key order is per partition
        pending: dict[tuple[int, bytes], str] = {}
        ids: list[str] = []

        async def poller(n: int) -> None:
            client = PullClient(listen)
            try:
                while len(ids) < len(recs):
                    got = await trio.to_thread.run_sync(client.pull, 50, 500)
                    for r in got:
                        key = key_of(r)
                        assert key is not None
                        # key ordering: a key's next record is never out while one is unanswered
                        pk = (r["partition"], key)
                        assert pk not in pending, f"poller {n}: {pk!r} pulled twice at once"
                        pending[pk] = r["id"]
                        seen.append((key, r["partition"], r["offset"]))
                        ids.append(r["id"])
                    await trio.sleep(0.01)
                    answered = [
                        {"id": pending.pop((r["partition"], key_of(r))), "ack": "accept"}  # type: ignore[arg-type]
                        for r in got
                    ]
                    if answered:
                        assert await trio.to_thread.run_sync(client.ack, answered) == ["ok"] * len(
                            answered
                        )
            finally:
                client.close()

        with trio.fail_after(90):
            async with trio.open_nursery() as nursery:
                for n in range(3):
                    nursery.start_soon(poller, n)
        assert len(ids) == len(set(ids)) == len(recs)  # distinct records across the pollers
        assert len({(p, o) for _k, p, o in seen}) == len(recs)
        for key in keys:
            offsets = [(p, o) for k, p, o in seen if k == key]
            for part in (0, 1):
                in_part = [o for p, o in offsets if p == part]
                assert in_part == sorted(in_part), (key, part, in_part)
        await wait_committed_at_end(broker, group, topic, 2)
        await sc.stop()


async def test_an_expired_lock_redelivers_with_the_next_count_and_a_late_ack_is_expired(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    async with pull_sidecar(
        broker,
        tmp_path,
        unique,
        api_listen=listen,
        extra={"share.record.lock.duration.ms": 1000},
        records=[Rec(key=b"k", value=b"late")],
    ) as (sc, topic, group):
        client = PullClient(listen)
        await wait_pull_api(client, sc)
        first = await pull_all(client, 1)
        assert first[0]["delivery_count"] == 1
        assert first[0]["lock_expires_in_ms"] <= 1000
        # Unanswered: the lock expires and the same record comes again, counted.
        second = await pull_all(client, 1)
        assert second[0]["offset"] == first[0]["offset"]
        assert second[0]["delivery_count"] == 2
        assert second[0]["id"] != first[0]["id"]
        assert await trio.to_thread.run_sync(
            client.ack, [{"id": first[0]["id"], "ack": "accept"}]
        ) == ["expired"]
        assert await trio.to_thread.run_sync(
            client.ack, [{"id": second[0]["id"], "ack": "accept"}]
        ) == ["ok"]
        await wait_committed_at_end(broker, group, topic, 1)
        _code, status = await trio.to_thread.run_sync(client.request, "GET", "/v1/status")
        assert status["counters"]["delivered"] == {"lock_expired": 1, "accept": 1}
        client.close()
        await sc.stop()


async def test_reject_goes_to_the_dlq_and_release_redelivers_after_backoff(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    recs = [Rec(key=b"a", value=b"bad"), Rec(key=b"b", value=b"retry")]
    async with pull_sidecar(
        broker,
        tmp_path,
        unique,
        api_listen=listen,
        extra={"delivery.count.limit": 2},
        records=recs,
    ) as (sc, topic, group):
        client = PullClient(listen)
        await wait_pull_api(client, sc)
        got = await pull_all(client, 2)
        by_value = {value_of(r): r for r in got}
        assert await trio.to_thread.run_sync(
            client.ack,
            [
                {
                    "id": by_value[b"bad"]["id"],
                    "ack": "reject",
                    "error": {"class": "app.BadOrder", "message": "no such order"},
                },
                {"id": by_value[b"retry"]["id"], "ack": "release"},
            ],
        ) == ["ok", "ok"]
        again = await pull_all(client, 1)
        assert value_of(again[0]) == b"retry" and again[0]["delivery_count"] == 2
        # Released at the limit: archived like the reject.
        assert await trio.to_thread.run_sync(
            client.ack, [{"id": again[0]["id"], "ack": "release"}]
        ) == ["ok"]
        dlq = await trio.to_thread.run_sync(
            lambda: broker.read_topic(f"dlq.{topic}", 2, timeout_s=60)
        )
        by_dlq = {r.header("__dlq.errors.offset"): r for r in dlq}
        bad = by_dlq[str(by_value[b"bad"]["offset"])]
        assert bad.header("__dlq.errors.exception.class.name") == "app.BadOrder"
        assert bad.header("__dlq.errors.message") == "Offset rejected by client."
        assert bad.header("__dlq.errors.delivery.count") == "1"
        retry = by_dlq[str(by_value[b"retry"]["offset"])]
        assert (
            retry.header("__dlq.errors.message") == "Offset delivery count exceeded the threshold."
        )
        assert retry.header("__dlq.errors.delivery.count") == "2"
        await wait_committed_at_end(broker, group, topic, 1)
        client.close()
        await sc.stop()


async def wait_waiting_polls(client: PullClient, n: int, timeout_s: float = 20) -> None:
    """Wait until /v1/status shows `n` waiting polls."""
    with trio.fail_after(timeout_s):
        while True:
            _code, status = await trio.to_thread.run_sync(client.request, "GET", "/v1/status")
            if status["pull"]["waiting_polls"] == n:
                return
            await trio.sleep(0.05)


_LONG_POLL = b"GET /v1/records?max=10&wait_ms=60000 HTTP/1.1\r\nHost: localhost\r\n\r\n"


@pytest.mark.parametrize(
    ("transport", "close", "engine"),
    [
        ("tcp", "eof", "consumer"),
        ("tcp", "reset", "consumer"),
        ("unix", "eof", "consumer"),
        ("tcp", "eof", "share"),
    ],
)
async def test_a_poll_whose_client_closes_stops_and_the_next_poll_gets_records_counted_once(
    broker: Broker, unique: str, tmp_path: Path, transport: str, close: str, engine: str
) -> None:
    """A client that walks away mid-long-poll: the poll ends at once (it no longer wants records,
    so none is acquired or handed to it), and what comes next goes to the next poll at count 1."""
    with short_tmp() as sock_dir:
        listen = f"unix:{sock_dir}/api.sock" if transport == "unix" else f"127.0.0.1:{free_port()}"
        async with pull_sidecar(
            broker, tmp_path, unique, api_listen=listen, extra={"engine": engine}
        ) as (sc, topic, group):
            watcher = PullClient(listen)
            await wait_pull_api(watcher, sc)
            quitter = await trio.to_thread.run_sync(raw_connect, listen)
            quitter.sendall(_LONG_POLL)
            await wait_waiting_polls(watcher, 1)
            if close == "reset":
                quitter.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            quitter.close()
            await wait_waiting_polls(watcher, 0)  # long before the poll's 60 s
            _code, metrics = await trio.to_thread.run_sync(watcher.request, "GET", "/metrics")
            assert b"dlq_sidecar_pull_waiting_polls 0.0" in metrics

            poller = PullClient(listen)
            results: list[list[dict[str, Any]]] = []
            async with trio.open_nursery() as nursery:

                async def poll() -> None:
                    results.append(await trio.to_thread.run_sync(poller.pull, 10, 30000))

                nursery.start_soon(poll)
                await wait_waiting_polls(watcher, 1)
                await trio.to_thread.run_sync(broker.produce, topic, [Rec(key=b"k", value=b"v")])
            [[got]] = results
            assert value_of(got) == b"v"
            assert got["delivery_count"] == 1
            assert await trio.to_thread.run_sync(
                poller.ack, [{"id": got["id"], "ack": "accept"}]
            ) == ["ok"]
            if engine == "consumer":  # a share group keeps its progress in the broker's state
                await wait_committed_at_end(broker, group, topic, 1)
            _code, status = await trio.to_thread.run_sync(watcher.request, "GET", "/v1/status")
            assert status["counters"]["attempts"] == 1
            for client in (watcher, poller):
                client.close()
            await sc.stop()


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_a_request_pipelined_behind_a_long_poll_neither_ends_it_nor_is_lost(
    broker: Broker, unique: str, tmp_path: Path, transport: str
) -> None:
    """HTTP/1.1 lets a client send its next request before the answer: the server reads it while
    the poll waits (to notice a close), and answers it after the poll, on the same connection."""
    with short_tmp() as sock_dir:
        listen = f"unix:{sock_dir}/api.sock" if transport == "unix" else f"127.0.0.1:{free_port()}"
        async with pull_sidecar(broker, tmp_path, unique, api_listen=listen) as (sc, topic, group):
            watcher = PullClient(listen)
            await wait_pull_api(watcher, sc)
            with await trio.to_thread.run_sync(raw_connect, listen) as sock:
                sock.sendall(_LONG_POLL)
                await wait_waiting_polls(watcher, 1)
                sock.sendall(b"GET /v1/status HTTP/1.1\r\nHost: localhost\r\n\r\n")
                await trio.to_thread.run_sync(broker.produce, topic, [Rec(key=b"k", value=b"v")])
                [(code, pulled), (status_code, status)] = await trio.to_thread.run_sync(
                    read_raw_responses, sock, 2
                )
            assert code == 200
            [got] = pulled["records"]
            assert value_of(got) == b"v"
            assert got["delivery_count"] == 1
            assert status_code == 200
            assert status["pull"]["waiting_polls"] == 0  # answered after the poll, in order
            assert await trio.to_thread.run_sync(
                watcher.ack, [{"id": got["id"], "ack": "accept"}]
            ) == ["ok"]
            await wait_committed_at_end(broker, group, topic, 1)
            watcher.close()
            await sc.stop()


async def test_share_engine_pulls_counts_locks_and_dead_letters_as_in_push_mode(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    """engine: share: the broker counts and locks; a pulled record left unanswered comes back with
    the broker's next count, a reject ends in the DLQ, accepts are done."""
    group = f"g-{unique}"
    # The broker's minimum lock: the unanswered record comes back once it (less the margin) is over.
    await trio.to_thread.run_sync(
        broker.set_group_config, group, {"share.record.lock.duration.ms": "15000"}
    )
    listen = f"127.0.0.1:{free_port()}"
    recs = [Rec(key=None, value=v) for v in (b"ok1", b"ok2", b"bad", b"hold")]
    async with pull_sidecar(
        broker,
        tmp_path,
        unique,
        api_listen=listen,
        extra={"engine": "share", "ordering": "none"},
        records=recs,
    ) as (sc, topic, _group):
        client = PullClient(listen)
        await wait_pull_api(client, sc)
        got = await pull_all(client, len(recs), timeout_s=120)
        by_value = {value_of(r): r for r in got}
        assert set(by_value) == {r.value for r in recs}
        assert all(r["delivery_count"] == 1 for r in got)
        acks = [{"id": by_value[v]["id"], "ack": "accept"} for v in (b"ok1", b"ok2")]
        acks.append({"id": by_value[b"bad"]["id"], "ack": "reject"})
        assert await trio.to_thread.run_sync(client.ack, acks) == ["ok"] * 3
        again = await pull_all(client, 1, timeout_s=120)
        assert value_of(again[0]) == b"hold"
        assert again[0]["delivery_count"] == 2
        assert await trio.to_thread.run_sync(
            client.ack, [{"id": again[0]["id"], "ack": "accept"}]
        ) == ["ok"]
        dlq = await trio.to_thread.run_sync(
            lambda: broker.read_topic(f"dlq.{topic}", 1, timeout_s=60)
        )
        assert [r.header("__dlq.errors.offset") for r in dlq] == [str(by_value[b"bad"]["offset"])]
        assert dlq[0].header("__dlq.errors.message") == "Offset rejected by client."
        code, status = await trio.to_thread.run_sync(client.request, "GET", "/v1/status")
        assert code == 200 and status["engine"] == "share"
        assert status["counters"]["delivered"] == {"accept": 3, "reject": 1, "lock_expired": 1}
        client.close()
        assert await sc.stop() == 0


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_the_example_pull_worker_gets_the_example_apps_outcomes(
    broker: Broker, unique: str, tmp_path: Path, transport: str
) -> None:
    """examples/python/pull_worker.py, run as its README says, against the orders of the push examples."""
    limit = test_examples.DELIVERY_LIMIT
    recs = test_examples.orders()
    with short_tmp() as sock_dir:
        api = f"unix:{sock_dir}/api.sock" if transport == "unix" else f"127.0.0.1:{free_port()}"
        log_path = tmp_path / "worker.log"
        async with pull_sidecar(
            broker,
            tmp_path,
            unique,
            partitions=3,
            api_listen=api,
            extra={"delivery.count.limit": limit},
            records=recs,
        ) as (sc, topic, _group):
            env = {
                **os.environ,
                "SIDECAR_API": api if transport == "unix" else f"http://{api}",
                "PYTHONUNBUFFERED": "1",
            }
            with log_path.open("wb") as out:
                worker = await trio.lowlevel.open_process(
                    [sys.executable, str(ROOT / "examples" / "python" / "pull_worker.py")],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
                try:
                    client = PullClient(api)
                    await wait_pull_api(client, sc)

                    async def counters() -> dict[str, Any]:
                        _code, status = await trio.to_thread.run_sync(
                            client.request, "GET", "/v1/status"
                        )
                        return dict(status["counters"])

                    with trio.fail_after(120):
                        while True:
                            c = await counters()
                            done = c["delivered"].get("accept", 0) + sum(c["archived"].values())
                            if done >= len(recs):
                                break
                            await trio.sleep(0.2)
                    client.close()
                finally:
                    worker.send_signal(signal.SIGTERM)
                    with trio.fail_after(30):
                        assert await worker.wait() == 0, log_path.read_text()[-3000:]
            assert await sc.stop() == 0, sc.log_text()[-3000:]
        decisions, acked = test_examples.parse_app_log(log_path.read_text())
        dlq = await trio.to_thread.run_sync(
            lambda: broker.read_topic(f"dlq.{topic}", test_examples.N_POISON + 2, timeout_s=60)
        )
    for i in range(test_examples.N_OK):
        assert decisions[f"ok-{i}"] == [(1, "accept")]
    for i in range(test_examples.N_POISON):
        assert decisions[f"poison-{i}"] == [(1, "reject")]
    for i in range(test_examples.N_FLAKY):
        assert decisions[f"flaky-{i}"] == [(1, "release"), (2, "release"), (3, "accept")]
    for i in range(test_examples.N_SLOW):
        assert decisions[f"slow-{i}"] == [(1, "deferred")]
        assert acked[f"slow-{i}"] == "result=ok"
    assert decisions["hopeless-0"] == [(n, "release") for n in range(1, limit + 1)]
    assert decisions["?"] == [(1, "reject")]
    assert c["delivered"] == {
        "accept": test_examples.N_OK + test_examples.N_FLAKY + test_examples.N_SLOW,
        "reject": test_examples.N_POISON + 1,
        "release": 2 * test_examples.N_FLAKY + limit,
    }
    assert c["archived"] == {"rejected": test_examples.N_POISON + 1, "delivery_count_exceeded": 1}
    classes = sorted(r.header("__dlq.errors.exception.class.name") or "" for r in dlq)
    assert classes == sorted(
        ["OrderValidationError"] * test_examples.N_POISON
        + ["OrderParseError", "InventoryUnavailable"]
    )


async def test_a_stop_returns_the_waiting_polls_at_once(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    async with pull_sidecar(broker, tmp_path, unique, api_listen=listen) as (sc, _topic, _group):
        watcher = PullClient(listen)
        await wait_pull_api(watcher, sc)
        poller = PullClient(listen)
        results: list[list[dict[str, Any]]] = []
        async with trio.open_nursery() as nursery:

            async def poll() -> None:
                results.append(await trio.to_thread.run_sync(poller.pull, 10, 60000))

            nursery.start_soon(poll)
            with trio.fail_after(30):
                while True:
                    _code, status = await trio.to_thread.run_sync(
                        watcher.request, "GET", "/v1/status"
                    )
                    if status["pull"]["waiting_polls"] == 1:
                        break
                    await trio.sleep(0.05)
            _code, metrics = await trio.to_thread.run_sync(watcher.request, "GET", "/metrics")
            assert b"dlq_sidecar_pull_waiting_polls 1.0" in metrics
            started = time.monotonic()
            sc.proc.send_signal(signal.SIGTERM)
        assert results == [[]]
        assert time.monotonic() - started < 20  # not the poll's 60 s
        assert await sc.wait_exit(30) == 0
        watcher.close()
        poller.close()


@pytest.mark.parametrize(("ordering", "at_once"), [("key", 2), ("partition", 1), ("none", 8)])
async def test_each_ordering_bounds_what_one_pull_hands_out(
    broker: Broker, unique: str, tmp_path: Path, ordering: str, at_once: int
) -> None:
    """Eight records of two keys on one partition: `key` hands out one per key at a time,
    `partition` one, `none` all of them; each in offset order."""
    recs = [Rec(key=b"ab"[i % 2 : i % 2 + 1], value=f"{i}".encode()) for i in range(8)]
    listen = f"127.0.0.1:{free_port()}"
    async with pull_sidecar(
        broker, tmp_path, unique, api_listen=listen, extra={"ordering": ordering}, records=recs
    ) as (sc, topic, group):
        client = PullClient(listen)
        await wait_pull_api(client, sc)
        order: list[int] = []
        with trio.fail_after(60):
            while len(order) < len(recs):
                got = await trio.to_thread.run_sync(client.pull, 100, 1000)
                if not got:
                    continue
                if not order:
                    # Everything was fetched before the first pull: the first one shows the bound.
                    await trio.sleep(0.5)
                    got += await trio.to_thread.run_sync(client.pull, 100, 0)
                    assert len(got) == at_once, [r["offset"] for r in got]
                assert len(got) <= at_once
                order += [r["offset"] for r in got]
                await trio.to_thread.run_sync(
                    client.ack, [{"id": r["id"], "ack": "accept"} for r in got]
                )
        assert order == list(range(8))
        await wait_committed_at_end(broker, group, topic, 1)
        client.close()
        await sc.stop()


async def test_pulls_need_the_token_and_a_loopback_host(
    broker: Broker, unique: str, tmp_path: Path
) -> None:
    token = "pull-token-0123456789abcdef"
    listen = f"127.0.0.1:{free_port()}"
    async with pull_sidecar(
        broker,
        tmp_path,
        unique,
        api_listen=listen,
        extra={"api": {"listen": listen, "token": token}},
        records=[Rec(key=b"k", value=b"v")],
    ) as (sc, topic, group):
        anonymous = PullClient(listen)
        await wait_pull_api(anonymous, sc)
        code, _ = await trio.to_thread.run_sync(anonymous.request, "GET", "/v1/records?wait_ms=100")
        assert code == 401
        code, _ = await trio.to_thread.run_sync(
            anonymous.request,
            "GET",
            "/v1/records?wait_ms=100",
            None,
            {"Host": "attacker.example:8787", "dlq-sidecar-api-token": token},
        )
        assert code == 403
        anonymous.close()
        client = PullClient(listen, token=token)
        got = await pull_all(client, 1)
        assert value_of(got[0]) == b"v" and got[0]["delivery_count"] == 1
        assert await trio.to_thread.run_sync(
            client.ack, [{"id": got[0]["id"], "ack": "accept"}]
        ) == ["ok"]
        await wait_committed_at_end(broker, group, topic, 1)
        client.close()
        await sc.stop()
